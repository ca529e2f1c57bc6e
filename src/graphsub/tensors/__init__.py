"""What a tensor is, below the graph: its type (`TensorType`: shape and dtype), node
attributes (`Attrs`), constants (`Constant`) and symbolic dimensions (`symbolic`). The
operator registry (graphsub.ops) and the graph IR (graphsub.ir) both build on it, so it sits
below both: the IR imports the operators, and the operators only these."""
