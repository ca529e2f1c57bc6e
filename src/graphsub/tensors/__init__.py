"""What a tensor is, below the graph: its type (`TensorType`: shape and dtype), node
attributes (`Attrs`), constants (`Constant`), symbolic dimensions (`symbolic`) and what names a tensor in a graph
(`values.Value`: one output of one node). The
operator registry (graphsub.ops) and the graph IR (graphsub.ir) both build on it, so it sits
below both: the IR imports the operators, and the operators only these."""
