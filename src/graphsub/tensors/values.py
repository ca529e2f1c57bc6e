"""What names a tensor inside a graph: one output of one node.

It lives below the operators, beside the tensor types, because an operator's ONNX importer
(layer 1) produces values for the graph being built, and the graph (layer 2) is made of them.
"""

from __future__ import annotations

from typing import NamedTuple


class Value(NamedTuple):
    """One output of one node: the edge type of the graph."""

    node: int
    index: int = 0  # type: ignore[assignment]  # a field that shadows tuple.index

    def __repr__(self) -> str:
        return f"%{self.node}" + (f".{self.index}" if self.index else "")
