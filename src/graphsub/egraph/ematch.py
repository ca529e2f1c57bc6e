"""E-matching: where a rule's source patterns occur in an e-graph.

The e-graph is a pattern host of graphsub.rules.matcher (`EGraphHost`): a pattern variable
binds an e-class; an operator term matches any live e-node of its op in the class (or, for an
output .N of a multi-output op, the e-nodes behind the class's `#out N` projection). The
pattern-node check, computed attributes and `where` conditions are the graph matcher's own,
reading e-class analyses instead of graph values.

A pattern's chain of three or more sums or products (graphsub.rules.chains: GELU's
`x * 0.5 * (1 + erf(...))`) matches as it does in a graph, in any association and order of
its operands: read through the e-nodes of each class that compute it (`chain_views`), so that
a rule recognises what an exporter wrote however it associated it, without waiting for the
associativity rules to have written out the one association the pattern spells. (A graph
also reads a product's other forms, a division by a constant, a scalar multiplication, a
power; an e-graph matches those as written.)

Matching is semi-naive: a pattern whose root is more than its depth above every class that
changed since the rule was last searched cannot match anything new there, so only roots near a
change are tried (`SourceIndex`). Multi-pattern rules (Tensat section 4) match each source on
its own and join the matches on their shared variables; a symmetric rule (all sources alike up
to renaming) is joined once per unordered pair of roots.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import Any

from graphsub.egraph.egraph import PROJ, EGraph
from graphsub.tensors.types import Constant, TensorType
from graphsub.rules.ast import OpTerm, Rule, Term, term_ops, term_vars
from graphsub.rules.chains import has_chain, pattern_chain
from graphsub.rules.expr import RuleError
from graphsub.rules.matcher import (Bindings, Match, Producer, conditions_hold, match_node,
                                    match_term, no_bindings, symmetric_sources)
from graphsub.search.run import DeadlineReached


#: Multi-pattern combinations joined between two looks at the clock.
DEADLINE_STRIDE = 256


class EGraphHost:
    """An e-graph as a pattern host (graphsub.rules.matcher.PatternHost): handles are
    canonical e-class ids."""

    __slots__ = ("egraph",)
    reads_chains = True

    def __init__(self, egraph: EGraph) -> None:
        self.egraph = egraph

    def type_of(self, cls: int) -> TensorType:
        types = self.egraph[cls].types
        if len(types) != 1:
            raise RuleError(f"class {cls} names a tuple of {len(types)} tensors")
        return types[0]

    def is_weight(self, cls: int) -> bool:
        return self.egraph[cls].weight_only

    def constant(self, cls: int) -> Constant | None:
        return self.egraph[cls].constant

    def made_by(self, cls: int, op: str) -> bool:
        eg = self.egraph
        return any(eg.node(n).op == op for n in eg.nodes_of(cls))

    def producers(self, term: OpTerm, cls: int) -> list[Producer]:
        eg = self.egraph
        out: list[Producer] = []
        single = term.index == 0 and len(eg[cls].types) == 1
        for n in eg.nodes_of(cls):
            node = eg.node(n)
            if node.op == term.op and single:
                out.append((n, node, self.children(n)))
            elif node.op == PROJ and node.attrs["index"] == term.index:
                out.extend((m, eg.node(m), self.children(m)) for m in eg.nodes_of(node.children[0])
                           if eg.node(m).op == term.op)
        return out

    def chain_views(self, op: str, cls: int) -> list[tuple[int, tuple[int, ...]]]:
        """Every e-node of op `op` in the class, with its children: each a way to read the
        class as `op` of operands (chains.frontiers reads the children on, any association)."""
        eg = self.egraph
        return [(n, self.children(n)) for n in eg.nodes_of(cls) if eg.node(n).op == op]

    def children(self, nid: int) -> tuple[int, ...]:
        find = self.egraph.find
        return tuple(find(c) for c in self.egraph.node(nid).children)

    def same(self, bound: int, cls: int) -> bool:
        return self.egraph.find(bound) == cls


#: A match in an e-graph: root classes, tensor variables bound to classes.
EMatch = Match[int]


def match_key(eg: EGraph, match: EMatch) -> tuple[Any, ...]:
    """Identifies an e-graph match up to unions made since it was found."""
    return (match.rule.name, tuple(eg.find(r) for r in match.roots),
            tuple(sorted((k, eg.find(c)) for k, c in match.tensors.items())),
            tuple(sorted((k, repr(v)) for k, v in match.attrs.items())))


def term_depth(term: Term) -> int:
    """Operator levels a term's match may reach down (a variable is 0): a chain of k operands
    is read in any association, down to k - 1 levels above its deepest operand."""
    if not isinstance(term, OpTerm):
        return 0
    chain = pattern_chain(term)
    if chain is not None:
        return len(chain) - 1 + max(term_depth(t) for t in chain)
    return 1 + max((term_depth(a) for a in term.args), default=0)


def _root_nodes(eg: EGraph, term: OpTerm, near: set[int] | None) -> Iterator[tuple[int, int]]:
    """(root class, e-node) pairs where `term` may be rooted: its op's e-nodes, restricted to
    root classes in `near` when given."""
    for n in eg.nodes_by_op(term.op):
        cls = eg.class_of(n)
        rec = eg.classes[cls]
        if term.index == 0 and len(rec.types) == 1:
            if near is None or cls in near:
                yield cls, n
            continue
        for p in rec.parents:  # a tuple class: the root is its projection
            proj = eg.node(p)
            if proj.op == PROJ and proj.attrs["index"] == term.index and p not in eg.blacklist:
                root = eg.class_of(p)
                if near is None or root in near:
                    yield root, n
                break


def on_time(deadline: float | None, what: str) -> None:
    """Raise DeadlineReached past `deadline` (time.perf_counter() seconds; None: never)."""
    if deadline is not None and time.perf_counter() > deadline:
        raise DeadlineReached(what)


def _root_matches(eg: EGraph, term: OpTerm, near: set[int] | None, deadline: float | None,
                  what: str) -> Iterator[tuple[int, Bindings[int]]]:
    """(root class, bindings) of one source pattern, with roots in `near` when given; the
    clock read at every root (on a large e-graph one pattern's matches take a good part of
    a second). A chain at the root is read from its class, through every e-node that
    computes it (EGraphHost.chain_views), once per class."""
    host = EGraphHost(eg)
    if pattern_chain(term) is not None:
        for root in dict.fromkeys(root for root, _ in _root_nodes(eg, term, near)):
            on_time(deadline, what)
            for st in match_term(host, term, root, no_bindings()):
                yield root, st
        return
    for root, n in _root_nodes(eg, term, near):
        on_time(deadline, what)
        for st in match_node(host, term, n, eg.node(n), host.children(n), no_bindings()):
            yield root, st


def match_source(eg: EGraph, term: Term, near: set[int] | None = None,
                 deadline: float | None = None
                 ) -> list[tuple[int, dict[str, int], dict[str, Any]]]:
    """Every (root class, tensor bindings, attribute bindings) of one source pattern, with
    roots in `near` when given; each once (a chain read through several associations of one
    class binds alike)."""
    if not isinstance(term, OpTerm):
        raise RuleError("a source term must be an operator, not a bare variable")
    out = []
    seen: set[tuple[Any, ...]] = set()
    chains = has_chain(term)
    for root, st in _root_matches(eg, term, near, deadline, f"matching {term.op}"):
        if chains:
            key = (root, tuple(sorted(st.tensors.items())),
                   tuple(sorted((k, repr(v)) for k, v in st.attrs.items())))
            if key in seen:
                continue
            seen.add(key)
        out.append((root, st.tensors, st.attrs))
    return out


def source_occurs(eg: EGraph, term: Term, near: set[int] | None = None,
                  deadline: float | None = None) -> bool:
    """Whether one source pattern matches anywhere (with a root in `near`, when given);
    stops at the first match, or with DeadlineReached past `deadline`."""
    if not isinstance(term, OpTerm):
        raise RuleError("a source term must be an operator, not a bare variable")
    if any(not eg.has_op(op) for op in term_ops(term)):
        return False
    for _ in _root_matches(eg, term, near, deadline, f"looking for {term.op}"):
        return True
    return False


def up_closure(eg: EGraph, changed: set[int], depth: int) -> set[int]:
    """Classes at most `depth` reader levels above a changed class (the changed ones too)."""
    out = set(changed)
    frontier = changed
    for _ in range(depth):
        nxt = set()
        for cls in frontier:
            rec = eg.classes.get(eg.find(cls))
            if rec is None:
                continue
            for p in rec.parents:
                c = eg.class_of(p)
                if c not in out:
                    nxt.add(c)
        out |= nxt
        frontier = nxt
        if not frontier:
            break
    return out


class SourceIndex:
    """Semi-naive search state of one rule: the version it was last searched at and, for
    multi-pattern rules, every match of each source so far (an e-graph only grows, so old
    matches stay valid and must be joined with new ones)."""

    def __init__(self, rule: Rule) -> None:
        self.rule = rule
        self.version = -1
        self.depths = [term_depth(s) for s in rule.sources]
        self.seen: list[list[tuple[int, dict[str, int], dict[str, Any]]]] = [
            [] for _ in rule.sources]
        self.symmetric = symmetric_sources(rule)

    def copy(self) -> SourceIndex:
        """An independent copy (the lists of matches copied, their entries shared)."""
        c = SourceIndex.__new__(SourceIndex)
        c.rule, c.version, c.depths, c.symmetric = self.rule, self.version, self.depths, \
            self.symmetric
        c.seen = [list(s) for s in self.seen]
        return c

    def search(self, eg: EGraph, changed: set[int] | None,
               deadline: float | None = None) -> list[EMatch]:
        """The matches that are new since the last search. `changed`: classes whose contents
        changed since then (None: search everywhere). Past `deadline` (time.perf_counter()
        seconds) it raises DeadlineReached, leaving this index unusable (the search that
        asked is over)."""
        rule = self.rule
        first = self.version < 0 or changed is None
        fresh = []
        for k, source in enumerate(rule.sources):
            near = None if first or changed is None else up_closure(eg, changed, self.depths[k])
            fresh.append(match_source(eg, source, near, deadline) if first or near else [])
        self.version = eg.version
        host = EGraphHost(eg)
        if len(rule.sources) == 1:
            return [EMatch(rule, (root,), t, a) for root, t, a in fresh[0]
                    if conditions_hold(host, rule, t, a, (root,))]
        # Multi-pattern: new matches of any source joined with all matches of the others,
        # each combination once (semi-naive: the first new source is k, those before it old).
        starts = []
        for k in range(len(rule.sources)):
            starts.append(len(self.seen[k]))
            self.seen[k].extend(fresh[k])
        matches: dict[tuple[Any, ...], EMatch] = {}
        combos = itertools.chain.from_iterable(
            _join(eg, rule, self.seen, _first_new_at(k, starts))
            for k in range(len(starts)) if len(self.seen[k]) > starts[k])
        for n, combo in enumerate(combos):
            if n % DEADLINE_STRIDE == 0:
                on_time(deadline, f"{rule.name}: joining multi-pattern matches")
            tensors, attrs, roots = combo[0], combo[1], combo[2]
            if len(set(roots)) < len(roots):
                continue  # two sources on one class: nothing to merge
            if self.symmetric and list(roots) != sorted(roots):
                continue
            if not conditions_hold(host, rule, tensors, attrs, roots):
                continue
            m = EMatch(rule, roots, tensors, attrs)
            matches.setdefault(match_key(eg, m), m)
        return list(matches.values())


def _first_new_at(k: int, starts: list[int]) -> list[tuple[int, int | None]]:
    """Spans of match ids for the combinations whose first new match (id >= its source's
    start) is the k-th: old ones before k, new ones at k, any after."""
    return [(0, starts[j]) if j < k else (starts[j], None) if j == k else (0, None)
            for j in range(len(starts))]


def _join(eg: EGraph, rule: Rule, seen: list[list[tuple[int, dict[str, int], dict[str, Any]]]],
          spans: list[tuple[int, int | None]]
          ) -> Iterator[tuple[dict[str, int], dict[str, Any], tuple[int, ...], tuple[int, ...]]]:
    """Compatible combinations of one match per source (bindings agree on shared names), the
    k-th taken from seen[k][lo:hi] for spans[k] = (lo, hi): a hash join on a variable each
    later source shares with the earlier ones, when it has one."""
    find = eg.find
    keys: list[str | None] = [None]
    bound = set(term_vars(rule.sources[0]))
    indexes: list[dict[int, list[int]] | None] = [None]
    for k in range(1, len(seen)):
        names = term_vars(rule.sources[k])
        shared = sorted(names & bound)
        bound |= names
        keys.append(shared[0] if shared else None)
        if shared:
            index: dict[int, list[int]] = {}
            for i, (_, t, _) in enumerate(seen[k]):
                index.setdefault(find(t[shared[0]]), []).append(i)
            indexes.append(index)
        else:
            indexes.append(None)

    def extend(k: int, tensors: dict[str, int], attrs: dict[str, Any], roots: tuple[int, ...],
               idx: tuple[int, ...]) -> Iterator[tuple[dict[str, int], dict[str, Any],
                                                       tuple[int, ...], tuple[int, ...]]]:
        if k == len(seen):
            yield tensors, attrs, roots, idx
            return
        index, key = indexes[k], keys[k]
        lo, hi = spans[k]
        hi = len(seen[k]) if hi is None else hi
        candidates = (range(lo, hi) if index is None or key is None
                      else [i for i in index.get(find(tensors[key]), ()) if lo <= i < hi])
        for i in candidates:
            root, t, a = seen[k][i]
            if any(name in tensors and find(tensors[name]) != find(c) for name, c in t.items()):
                continue
            if any(name in attrs and attrs[name] != v for name, v in a.items()):
                continue
            yield from extend(k + 1, {**tensors, **t}, {**attrs, **a}, roots + (find(root),),
                              idx + (i,))

    yield from extend(0, {}, {}, (), ())
