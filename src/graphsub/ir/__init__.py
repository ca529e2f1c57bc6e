"""The tensor-graph IR: types, nodes, immutable graphs, hashing and the builder. The names
are imported when first used (graphsub.lazy): the operators import graphsub.tensors.types, and the
graph, which the operators type, imports them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from graphsub.lazy import lazy_exports

_EXPORTS = {
    "GraphBuilder": "graphsub.ir.builder",
    **{name: "graphsub.ir.graph" for name in ("Graph", "GraphEditor", "Node", "Value",
                                               "make_node")},
    **{name: "graphsub.tensors.types" for name in ("Attrs", "Constant", "TensorType")},
}
__all__ = ["Attrs", "Constant", "Graph", "GraphBuilder", "GraphEditor", "Node", "TensorType",
           "Value", "make_node"]
__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)

if TYPE_CHECKING:
    from graphsub.ir.builder import GraphBuilder
    from graphsub.ir.graph import Graph, GraphEditor, Node, Value, make_node
    from graphsub.tensors.types import Attrs, Constant, TensorType
