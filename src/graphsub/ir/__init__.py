"""The tensor-graph IR: types, nodes, immutable graphs, hashing and the builder."""

from graphsub.ir.builder import GraphBuilder
from graphsub.ir.graph import Graph, GraphEditor, Node, Value, make_node
from graphsub.ir.types import Attrs, Constant, TensorType

__all__ = ["Attrs", "Constant", "Graph", "GraphBuilder", "GraphEditor", "Node", "TensorType",
           "Value", "make_node"]
