"""Cutting a set of operators out of a graph as a graph of its own.

A split search optimizes regions separately (graphsub.search.split); kernel orchestration
prices each candidate kernel alone (graphsub.fission.candidates). Both need the same cut:
values read from outside become inputs, the weights read come along (so a weight-only
subgraph still folds), and the chosen values become outputs. Kernel orchestration and the
compiled cost model (graphsub.cost.compiled) also write a group as the body of one `fused`
operator (`fused_body`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from graphsub.ir.graph import Graph, Node, Value, make_node
from graphsub.ops.fused import Ref, body_of


def cut_out(graph: Graph, ops: Iterable[int], outputs: Sequence[Value], prefix: str = "region"
            ) -> tuple[Graph, tuple[Value, ...]]:
    """The operators `ops` of `graph` (convex, no weight-only node among them) as a graph
    returning `outputs`, and the outer values its inputs stand for, in input order. Inputs are
    named `<prefix>_input_<k>`, outputs `<prefix>_output_<k>`."""
    members = set(ops)
    weight_only = graph.weight_only()
    nodes: dict[int, Node] = {}
    fresh = graph.next_id
    boundary: dict[Value, int] = {}  # outer value -> id of the input node standing for it

    def copy_weights(nid: int) -> None:
        if nid not in nodes:
            for v in graph[nid].inputs:
                copy_weights(v.node)
            nodes[nid] = graph[nid]

    for nid in graph.topo_order():
        if nid not in members:
            continue
        node = graph[nid]
        ins = []
        for v in node.inputs:
            if v.node in members:
                ins.append(v)
            elif v.node in weight_only and graph[v.node].op != "input":
                copy_weights(v.node)
                ins.append(v)
            else:
                if v not in boundary:
                    boundary[v] = fresh
                    t = graph.type_of(v)
                    nodes[fresh] = make_node("input", (), (), {
                        "name": f"{prefix}_input_{len(boundary) - 1}", "shape": t.shape,
                        "dtype": t.dtype, "onnx_type": t.onnx_type})
                    fresh += 1
                ins.append(Value(boundary[v], 0))
        nodes[nid] = Node(node.op, node.attrs, tuple(ins), node.outputs, node.name)
    sub = Graph(nodes, list(boundary.values()), list(outputs),
                [f"{prefix}_output_{k}" for k in range(len(outputs))], graph.facts, fresh)
    return sub, tuple(boundary)


def in_order(graph: Graph, nodes: Iterable[int]) -> list[int]:
    """The nodes in the graph's topological order, found without walking the whole graph (a
    group's cost is priced once per group, and a graph has many)."""
    position = graph.positions()
    return sorted(nodes, key=position.__getitem__)


def read_outside(graph: Graph, ops: Iterable[int]) -> tuple[Value, ...]:
    """The values computed by `ops` that another operator reads or the graph returns, in
    topological order."""
    members = set(ops)
    users = graph.users()
    returned = set(graph.outputs)
    out = []
    for nid in in_order(graph, members):
        for i in range(len(graph[nid].outputs)):
            v = Value(nid, i)
            if v in returned or any(u not in members and v in graph[u].inputs
                                    for u, _ in users.get(nid, ())):
                out.append(v)
    return tuple(out)


def fused_body(graph: Graph, nodes: frozenset[int], outputs: Sequence[Value]
               ) -> tuple[Any, tuple[Value, ...]]:
    """The `fused` operator's body for the primitives `nodes` of `graph` writing `outputs`,
    and the outer values it reads, in its input order."""
    index: dict[int, int] = {}
    reads: dict[Value, int] = {}
    body_nodes = []

    def ref(v: Value) -> Ref:
        if v.node in index:
            return ("node", index[v.node], v.index)
        return ("in", reads.setdefault(v, len(reads)))

    for nid in in_order(graph, nodes):
        node = graph[nid]
        body_nodes.append((node.op, node.attrs, tuple(ref(v) for v in node.inputs)))
        index[nid] = len(index)
    return body_of(body_nodes, [ref(v) for v in outputs]), tuple(reads)
