"""Rules applied wherever they match until none does: for rule sets that terminate (each
rewrite removes what its source matched), such as fission's, the cleanup rules and the
library's normal form (graphsub.search.normal_form)."""

from __future__ import annotations

from collections.abc import Sequence

from graphsub.ir.graph import Graph, Value
from graphsub.rules.applier import Rejection, apply_match
from graphsub.rules.ast import Rule
from graphsub.rules.matcher import Match, find_matches, root_ops


def rewrite_to_fixed_point(graph: Graph, rules: Sequence[Rule]
                           ) -> tuple[Graph, list[tuple[Graph, Match[Value]]]]:
    """The graph with the rules applied in topological order, the first node a rule rewrites
    first, until none matches; and each step taken, as (the graph it was taken in, its
    match). Weight-only nodes are left alone."""
    by_op: dict[str, list[Rule]] = {}
    for rule in rules:
        for op in root_ops(rule):
            by_op.setdefault(op, []).append(rule)
    steps: list[tuple[Graph, Match[Value]]] = []
    stuck: dict[int, object] = {}  # nodes no rule rewrites, as they were then
    while by_op:
        weight_only = graph.weight_only()
        nid = next((nid for nid in graph.topo_order() if graph[nid].op in by_op
                    and stuck.get(nid) != graph[nid] and nid not in weight_only), None)
        if nid is None:
            break
        for rule in by_op[graph[nid].op]:
            found = next(((m, g) for m in find_matches(graph, rule, first_roots=[nid])
                          if not isinstance(g := apply_match(graph, m), Rejection)), None)
            if found is not None:
                steps.append((graph, found[0]))
                graph = found[1]
                _unstick_siblings(graph, stuck)
                break
        else:
            stuck[nid] = graph[nid]
    return graph, steps


def _unstick_siblings(graph: Graph, stuck: dict[int, object]) -> None:
    """Forget that the readers of what a step's new nodes read were stuck: a rule of several
    patterns joined on a shared input (two products of one input merged) may match them
    with a new node, though they themselves did not change."""
    delta = graph.delta
    if delta is None:
        stuck.clear()
        return
    users = graph.users()
    for nid in delta.changed:
        if nid in graph.nodes:
            for value in graph[nid].inputs:
                for reader, _ in users.get(value.node, ()):
                    stuck.pop(reader, None)
