"""Candidate kernels on a primitive graph (Korch, section 4).

A candidate kernel is a set of primitives that one kernel call computes, the values of the
primitive graph it writes to memory, and how it is implemented: one primitive as the target
runs it, or a library kernel, a fused operator that a kernel rule (kernels.rules) recognizes
in the primitives. Each candidate is priced on the target as a graph of its own (its inputs
stand for the values it reads), so the measured cost model times it like any operator.

Candidates overlap, and the orchestration may choose overlapping ones: a primitive then runs in
two kernels (redundant computation), which pays when it saves writing and reading a tensor.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from graphsub.cost.base import CostModel, costs_nothing
from graphsub.fission.primitives import category
from graphsub.ir.graph import Graph, Value
from graphsub.ir.region import cut_out, fused_body, read_outside
from graphsub.ops.base import Category
from graphsub.rules import Rule, apply_match, find_matches
from graphsub.rules.applier import Rejection
from graphsub.rules.matcher import Match


@dataclass(frozen=True)
class Kernel:
    """One candidate kernel of a primitive graph."""

    #: The primitives (node ids of the primitive graph) it computes.
    nodes: frozenset[int]
    #: The values of the primitive graph it writes: what other kernels and the graph can read.
    outputs: tuple[Value, ...]
    #: The values it reads that a kernel computes (graph inputs and weights are not listed).
    inputs: tuple[Value, ...]
    #: "primitive" (one node as it is), "library" (a fused operator; `match` says which) or
    #: "generated" (the primitives compiled together as one kernel by the code generator).
    kind: str
    #: The kernel as a graph of its own, what is priced: region inputs -> `outputs`.
    graph: Graph
    cost: float
    #: For a library kernel: the kernel rule's match in the primitive graph.
    match: Match[Value] | None = field(default=None, compare=False)
    #: For a generated kernel: the `fused` operator's body, and the values of the primitive
    #: graph it reads, in its input order (weights and weight-only values included).
    body: Any = field(default=None, compare=False)
    reads: tuple[Value, ...] = field(default=(), compare=False)

    @property
    def label(self) -> str:
        """What runs: the operator that computes the kernel's outputs (a fused operator's
        name, or the primitive's), joined where several do."""
        return "+".join(dict.fromkeys(self.graph[v.node].op for v in self.graph.outputs))


def is_source(graph: Graph, value: Value) -> bool:
    """Whether a value costs no kernel: a graph input, a weight, or computed from weights only
    (folded at export)."""
    node = graph[value.node]
    return costs_nothing(node.op, value.node in graph.weight_only())


def kernel_graph(graph: Graph, nodes: Iterable[int], outputs: Sequence[Value]) -> Graph:
    """The primitives `nodes` cut out of `graph` as a graph returning `outputs`: each value
    they read from a kernel becomes an input; the weights they read come along."""
    return cut_out(graph, nodes, outputs, prefix="kernel")[0]


def _read_from_kernels(graph: Graph, nodes: frozenset[int]) -> tuple[Value, ...]:
    seen: dict[Value, None] = {}
    for nid in graph.topo_order():
        if nid in nodes:
            for v in graph[nid].inputs:
                if v.node not in nodes and not is_source(graph, v):
                    seen[v] = None
    return tuple(seen)


def primitive_kernels(graph: Graph, cost_model: CostModel) -> list[Kernel]:
    """One kernel per computing primitive, as the target runs it alone: the orchestration that
    changes nothing, and the fallback every other choice is measured against."""
    kernels = []
    for nid in graph.topo_order():
        node = graph[nid]
        if costs_nothing(node.op, nid in graph.weight_only()):
            continue
        nodes = frozenset((nid,))
        outputs = tuple(Value(nid, i) for i in range(len(node.outputs)))
        sub = kernel_graph(graph, nodes, outputs)
        kernels.append(Kernel(nodes, outputs, _read_from_kernels(graph, nodes), "primitive",
                              sub, cost_model.graph_cost(sub)))
    return kernels


def library_kernels(graph: Graph, rules: Sequence[Rule], cost_model: CostModel) -> list[Kernel]:
    """The fused operators that kernel rules find in the primitive graph: for each match, the
    primitives it covers become one kernel computing the match's root."""
    kernels: dict[tuple[frozenset[int], tuple[Value, ...], str], Kernel] = {}
    weight_only = graph.weight_only()
    for rule in rules:
        for match in find_matches(graph, rule):
            nodes = frozenset(n for n in match.nodes if n not in weight_only)
            key = (nodes, match.roots, rule.name)
            if not nodes or key in kernels:
                continue
            # The fused operator, priced as a graph of its own: the matched primitives cut
            # out with the roots as the only outputs, then rewritten by the rule there.
            sub = kernel_graph(graph, nodes, match.roots)
            fused = next((g for m in find_matches(sub, rule, first_roots=[match.roots[0].node])
                          if m.roots == match.roots
                          and not isinstance(g := apply_match(sub, m), Rejection)), None)
            if fused is None:
                continue
            kernels[key] = Kernel(nodes, match.roots, _read_from_kernels(graph, nodes), "library",
                                  fused, cost_model.graph_cost(fused), match)
    return list(kernels.values())


#: Primitive categories a generated kernel may hold: one loop nest computes them together.
FUSABLE = frozenset({Category.ELEMENTWISE, Category.REDUCE, Category.LAYOUT})


def is_convex(graph: Graph, nodes: frozenset[int]) -> bool:
    """Whether no path leaves `nodes` and comes back (one kernel can compute them: nothing it
    needs is computed from what it computes by a kernel outside)."""
    users = graph.users()
    frontier = [u for n in nodes for u, _ in users.get(n, ()) if u not in nodes]
    seen: set[int] = set()
    while frontier:
        nid = frontier.pop()
        if nid in seen:
            continue
        seen.add(nid)
        for u, _ in users.get(nid, ()):
            if u in nodes:
                return False
            frontier.append(u)
    return True


def connected_groups(graph: Graph, max_size: int,
                     allowed: Callable[[int], bool]) -> Iterator[frozenset[int]]:
    """Every connected, convex set of at least two allowed primitives with at most `max_size`
    members, once each (grown from its smallest member by adjacent allowed primitives)."""
    users = graph.users()

    def neighbours(nid: int) -> Iterator[int]:
        for v in graph[nid].inputs:
            if allowed(v.node):
                yield v.node
        for u, _ in users.get(nid, ()):
            if allowed(u):
                yield u

    seen: set[frozenset[int]] = set()
    for seed in graph.topo_order():
        if not allowed(seed):
            continue
        stack = [frozenset((seed,))]
        while stack:
            group = stack.pop()
            if len(group) >= max_size:
                continue
            for member in group:
                for nb in neighbours(member):
                    if nb <= seed or nb in group:
                        continue
                    grown = group | {nb}
                    if grown in seen:
                        continue
                    seen.add(grown)
                    stack.append(grown)
                    if is_convex(graph, grown):
                        yield grown


def fused_graph(graph: Graph, nodes: frozenset[int], outputs: Sequence[Value]
                ) -> tuple[Graph, Any, tuple[Value, ...]]:
    """The group as one `fused` node in a graph of its own (the region cut out, its members
    replaced), what a generated kernel is priced as; with its body and the outer values read."""
    body, reads = fused_body(graph, nodes, outputs)
    region, boundary = cut_out(graph, nodes, outputs, prefix="kernel")
    inner = {outer: Value(nid, 0) for outer, nid in zip(boundary, region.inputs)}
    editor = region.edit()
    fused = editor.add("fused", [inner.get(v, v) for v in reads], {"body": body})
    for old, new in zip(outputs, fused):
        editor.replace_uses(old, new)
    return editor.finish().dce(), body, reads


def group_kernels(graph: Graph, max_size: int, price: Callable[[Graph], float | None],
                  ) -> list[Kernel]:
    """Generated kernels: connected, convex groups of elementwise, reduce and layout
    primitives (Korch's candidates for the code generator), each one `fused` operator. A
    group comes in up to two variants: writing every value read outside it, and writing only
    its sinks (values no member reads), leaving the inner values other kernels need to be
    computed again there: the redundant computation that saves a tensor's round trip through
    memory (Korch's kernels write their one sink only). `price` prices a variant's graph (one
    `fused` node), or says None when it cannot (the variant is then no candidate)."""
    weight_only = graph.weight_only()

    def allowed(nid: int) -> bool:
        return nid not in weight_only and category(graph[nid].op) in FUSABLE

    kernels = []
    for nodes in connected_groups(graph, max_size, allowed):
        needed = read_outside(graph, nodes)
        read_inside = {v for n in nodes for v in graph[n].inputs if v.node in nodes}
        sinks = tuple(v for v in needed if v not in read_inside)
        for outputs in dict.fromkeys((needed, sinks)):
            if not outputs:
                continue
            sub, body, reads = fused_graph(graph, nodes, outputs)
            cost = price(sub)
            if cost is not None:
                kernels.append(Kernel(nodes, outputs, _read_from_kernels(graph, nodes),
                                      "generated", sub, cost, body=body, reads=reads))
    return kernels
