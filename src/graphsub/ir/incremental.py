"""What an edit changed, and the derived facts of the edited graph computed from its parent's.

A search makes thousands of graphs that each differ from their parent in a handful of nodes.
Recomputing the topological order, the users index, weight-only-ness and the fingerprint of
every node of every such graph costs O(V) Python work per graph and dominated the search
(MetaFlow/TASO-style backtracking on NasNet-A spent >90% of its time there). Here an edit
records its delta (nodes added or re-pointed, nodes removed) and topological positions that
stay valid for the child, and each fact is updated only where the delta can reach.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable

from graphsub.ir.hashing import attrs_key
from graphsub.ir.node import Node
from graphsub.ir.view import GraphDelta, GraphView


def in_order(graph: GraphView, delta: GraphDelta[GraphView], seeds: Iterable[int],
             visit: Callable[[int], bool]) -> None:
    """Visit `seeds` and, whenever `visit` returns True (the node's fact changed), the node's
    readers, each once, in an order where a node comes after every node it reads."""
    users = graph.users()
    heap = [(delta.position(n), n) for n in set(seeds) if n in graph]
    heapq.heapify(heap)
    queued = {n for _, n in heap}
    while heap:
        _, nid = heapq.heappop(heap)
        if visit(nid):
            for user, _ in users[nid]:
                if user not in queued:
                    queued.add(user)
                    heapq.heappush(heap, (delta.position(user), user))


def incremental_users(graph: GraphView, delta: GraphDelta[GraphView]) -> dict[int, list[tuple[int, int]]]:
    """The child's users index from the parent's: only the producers of changed or removed
    nodes get new lists (the others are shared with the parent, which never mutates them)."""
    parent = delta.parent
    base = parent.users()
    nodes = graph.nodes
    users = dict(base)
    for nid in delta.removed:
        users.pop(nid, None)
    touched: set[int] = set()
    for nid in delta.changed:
        touched.update(v.node for v in nodes[nid].inputs)
        old = parent.nodes.get(nid)
        if old is not None:
            touched.update(v.node for v in old.inputs)
    for nid in delta.removed:
        touched.update(v.node for v in parent.nodes[nid].inputs)
    for nid in touched:  # every list that can hold a changed or removed reader is rebuilt
        if nid in nodes:
            users[nid] = [(u, p) for u, p in base.get(nid, ())
                          if u in nodes and u not in delta.changed]
    for nid in delta.changed:
        if nid not in base:
            users[nid] = []
    for nid in delta.changed:
        for pos, v in enumerate(nodes[nid].inputs):
            users[v.node].append((nid, pos))
    return users


def incremental_weight_only(graph: GraphView, delta: GraphDelta[GraphView],
                            is_weight_only: Callable[[Node, set[int]], bool]) -> frozenset[int]:
    """Weight-only ids from the parent's: changed nodes are re-decided, and a node's readers
    only when its own status flipped."""
    result = set(delta.parent.weight_only())
    result -= delta.removed
    nodes = graph.nodes

    def visit(nid: int) -> bool:
        now = is_weight_only(nodes[nid], result)
        if now == (nid in result):
            return False
        (result.add if now else result.discard)(nid)
        return True

    in_order(graph, delta, delta.changed, visit)
    return frozenset(result)


def node_fingerprint(node: Node, input_fingerprints: list[int], commutative: bool) -> int:
    """A process-local integer digest of a node and (recursively) what it reads. Like the
    structural hash but with Python's tuple hash instead of blake2b: 64 bits are plenty to
    deduplicate one search's graphs, and it is several times cheaper to compute."""
    edges = [(fp, v.index) for v, fp in zip(node.inputs, input_fingerprints)]
    if commutative:
        edges.sort()
    return hash((node.op, attrs_key(node.attrs), node.outputs, tuple(edges)))


def node_fingerprints(graph: GraphView, commutative: frozenset[str]) -> dict[int, int]:
    """Every node's fingerprint: from the parent's where the graph has a delta (only nodes
    downstream of a change are recomputed), else over the topological order."""
    nodes = graph.nodes
    delta = graph.delta
    if delta is None:
        fps: dict[int, int] = {}
        for nid in graph.topo_order():
            node = nodes[nid]
            fps[nid] = node_fingerprint(node, [fps[v.node] for v in node.inputs],
                                        node.op in commutative)
        return fps
    fps = dict(delta.parent.fingerprints())
    for nid in delta.removed:
        del fps[nid]

    def visit(nid: int) -> bool:
        node = nodes[nid]
        fp = node_fingerprint(node, [fps[v.node] for v in node.inputs], node.op in commutative)
        if fps.get(nid) == fp:
            return False
        fps[nid] = fp
        return True

    in_order(graph, delta, delta.changed, visit)
    return fps
