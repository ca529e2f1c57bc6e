"""Matching after a substitution without re-matching the whole graph (OCGGS section 4's
insight, used by every search algorithm).

A match is a set of node ids whose Node objects satisfy the rule. Node ids are stable across
edits and new nodes get fresh ids, so after an edit a parent's match still holds exactly when
none of its nodes changed or went away (its conditions are re-evaluated: they may read global
facts such as weight-only-ness). Every other match of the child contains a changed node, and
its first root is then within the rule's radius of that node: the eccentricity of the first
root in the source pattern (terms and variables as vertices), since a match maps the pattern
onto the graph without stretching distances. So the child's matches are the parent's
survivors plus a matching run whose first roots are the nodes near the change.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from graphsub.ir.graph import Graph, Value
from graphsub.rules.ast import OpTerm, Rule, Term, Var
from graphsub.rules.matcher import (Match, conditions_hold, find_matches, host_for, reads_forms,
                                    root_ops)


def rule_radius(rule: Rule) -> int | None:
    """The largest distance from the first source root to any vertex of the source pattern,
    or None when the pattern is not connected (its sources share no variable)."""
    adjacency: dict[object, set[object]] = {}

    def walk(term: Term) -> object:
        if isinstance(term, Var):
            vertex: object = ("var", term.name)
            adjacency.setdefault(vertex, set())
            return vertex
        assert isinstance(term, OpTerm)
        vertex = ("term", len(adjacency), term.op)
        adjacency[vertex] = set()
        for arg in term.args:
            child = walk(arg)
            adjacency[vertex].add(child)
            adjacency[child].add(vertex)
        return vertex

    if reads_forms(rule):
        return None  # a chain may be associated deeper in a graph than in its pattern
    roots = [walk(s) for s in rule.sources]
    distance = {roots[0]: 0}
    queue = deque([roots[0]])
    while queue:
        v = queue.popleft()
        for w in adjacency[v]:
            if w not in distance:
                distance[w] = distance[v] + 1
                queue.append(w)
    return max(distance.values()) if len(distance) == len(adjacency) else None


@dataclass
class MatchCounts:
    """How a search's matches were obtained: found by a matching run, or carried over."""

    computed: int = 0
    reused: int = 0


class IncrementalMatcher:
    """The matches of a fixed rule list on the graphs of one search, each graph's computed
    from its parent's where the parent was matched before. Results live in `graph.memo`
    under this matcher."""

    def __init__(self, rules: Sequence[Rule]) -> None:
        self.rules = tuple(rules)
        self.radii = [rule_radius(r) for r in self.rules]
        finite = [r for r in self.radii if r is not None]
        self.max_radius = max(finite, default=0)
        self.counts = MatchCounts()

    def matches(self, graph: Graph) -> list[list[Match[Value]]]:
        """For each rule, its matches in `graph`."""
        found = graph.memo.get(self)
        if found is None:
            delta = graph.delta
            if delta is not None and self in delta.parent.memo:
                found = self._from_parent(graph, delta.parent.memo[self], delta.changed,
                                          delta.changed | delta.removed)
            else:
                found = [find_matches(graph, rule) for rule in self.rules]
                self.counts.computed += sum(len(m) for m in found)
            graph.memo[self] = found
        return found

    def _from_parent(self, graph: Graph, parent: list[list[Match[Value]]],
                     changed: frozenset[int], gone: frozenset[int]) -> list[list[Match[Value]]]:
        near = _distances(graph, changed, self.max_radius)
        # Nodes near the change by radius and op: most rules' first root op is not among
        # them, and those rules need no matching run at all.
        within: dict[int, dict[str, list[int]]] = {}
        for r in {r for r in self.radii if r is not None}:
            by_op = within[r] = {}
            for n, d in near.items():
                if d <= r:
                    by_op.setdefault(graph[n].op, []).append(n)
        out = []
        for rule, radius, old in zip(self.rules, self.radii, parent):
            host = host_for(graph, rule)
            kept = [m for m in old if m.nodes.isdisjoint(gone)
                    and conditions_hold(host, rule, m.tensors, m.attrs, m.roots)]
            if radius is None:  # a pattern that is not connected is matched everywhere
                found = find_matches(graph, rule)
            else:
                first = rule.sources[0]
                roots = [n for op in root_ops(rule) for n in within[radius].get(op, ())] \
                    if isinstance(first, OpTerm) else []
                found = find_matches(graph, rule, first_roots=roots) if roots else []
            fresh = [m for m in found if not m.nodes.isdisjoint(changed)]
            self.counts.reused += len(kept)
            self.counts.computed += len(fresh)
            out.append(kept + fresh)
        return out


def _distances(graph: Graph, sources: frozenset[int], limit: int) -> dict[int, int]:
    """Undirected distance from the nearest source, for nodes within `limit`, in id order."""
    users = graph.users()
    distance = {n: 0 for n in sources if n in graph}
    queue = deque(distance)
    while queue:
        nid = queue.popleft()
        d = distance[nid]
        if d == limit:
            continue
        for other in (*(v.node for v in graph[nid].inputs), *(u for u, _ in users[nid])):
            if other not in distance:
                distance[other] = d + 1
                queue.append(other)
    return dict(sorted(distance.items()))

