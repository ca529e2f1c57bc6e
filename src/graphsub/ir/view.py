"""What the facts derived from a graph read of it (`GraphView`: ir.graph's `Graph` is one),
and how an edited graph differs from the graph it was edited from (`GraphDelta`).

The incremental facts (ir.incremental) and the structural hash (ir.hashing) are computed
for the graph, lazily, by the graph's own methods; they name the graph by this protocol, so
that neither they nor the graph import each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from graphsub.ir.node import Node
from graphsub.tensors.values import Value


class GraphView(Protocol):
    """The graph as its derived facts read it; each method is the graph's cached fact."""

    @property
    def nodes(self) -> Mapping[int, Node]: ...

    @property
    def inputs(self) -> tuple[int, ...]: ...

    @property
    def outputs(self) -> tuple[Value, ...]: ...

    @property
    def output_names(self) -> tuple[str, ...]: ...

    @property
    def delta(self) -> GraphDelta[GraphView] | None: ...

    def __contains__(self, node_id: object) -> bool: ...

    def topo_order(self) -> list[int]: ...

    def positions(self) -> dict[int, int]: ...

    def users(self) -> Mapping[int, list[tuple[int, int]]]: ...

    def weight_only(self) -> frozenset[int]: ...

    def fingerprints(self) -> dict[int, int]: ...

    def node_digests(self) -> dict[int, bytes]: ...


#: The kind of graph a delta's parent is (ir.graph's `Graph`, for the graphs a search makes).
ParentT = TypeVar("ParentT", bound=GraphView, covariant=True)


@dataclass(frozen=True)
class GraphDelta(Generic[ParentT]):
    """How a graph differs from the graph it was edited from.

    `changed`: ids of nodes that are new or whose Node object differs (inputs re-pointed);
    `removed`: ids of the parent's nodes that are gone. `positions` maps a node id to a
    number that increases along every edge of the child graph (the parent's topological
    positions, with fractional ones for new nodes), so that dirty nodes can be processed in
    dependency order without sorting the whole graph.
    """

    parent: ParentT
    changed: frozenset[int]
    removed: frozenset[int]
    new_positions: dict[int, float]

    def position(self, nid: int) -> float:
        pos = self.new_positions.get(nid)
        return pos if pos is not None else self.parent.positions()[nid]
