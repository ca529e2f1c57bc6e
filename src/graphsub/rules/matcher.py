"""Finding all matches of a rule in a graph.

Source terms are trees, so matching one root at one node is deterministic; the search is over
where the roots go. The first root is tried at every node of its op (nodes are indexed by op);
later roots are joined on shared variables, by trying only the readers of an already bound
value where the root reads one directly.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from graphsub.ir.graph import Graph, Value
from graphsub.ops import get_op
from graphsub.ops.base import norm_axis
from graphsub.rules.ast import AVar, Lit, OpTerm, Rule, Term, Var
from graphsub.rules.expr import Env, RuleError, try_evaluate


@dataclass(frozen=True)
class Match:
    """Where a rule's source sits in a graph."""

    rule: Rule
    roots: tuple[Value, ...]
    tensors: dict[str, Value]
    attrs: dict[str, Any]
    nodes: frozenset[int] = field(default_factory=frozenset)

    def env(self, graph: Graph) -> Env:
        return Env(graph, self.tensors, self.attrs, self.roots)


@dataclass
class _State:
    tensors: dict[str, Value]
    attrs: dict[str, Any]
    nodes: set[int]

    def copy(self) -> _State:
        return _State(dict(self.tensors), dict(self.attrs), set(self.nodes))


def _canonical_literal(op: str, key: str, value: Any) -> Any:
    """Put a literal attribute of a source pattern into the op's canonical form (stride 1 is
    (1, 1), ...), so that it compares equal to what nodes store."""
    spec = get_op(op).attr_spec(key)
    if spec is None:
        raise RuleError(f"operator {op} has no attribute {key!r}")
    if spec.convert is None or value is None or (key == "axis" and isinstance(value, int)):
        return value
    try:
        return spec.convert(value)
    except (TypeError, ValueError) as exc:
        raise RuleError(f"bad literal {value!r} for {op}:{key}: {exc}") from None


#: A pseudo-attribute: the op's inputs must all have the same shape (no broadcasting). TASO's
#: element-wise ops do not broadcast, and some of its rules hold only without broadcasting.
SAME_SHAPES = "same-shapes"


@lru_cache(maxsize=None)
def _compiled_literals(term: OpTerm) -> tuple[tuple[str, Any, bool], ...]:
    """(key, canonical literal, is_literal) for each attribute pattern of a term."""
    out = []
    for key, e in term.attrs:
        if key == SAME_SHAPES:
            out.append((key, None, False))
        elif isinstance(e, Lit):
            out.append((key, _canonical_literal(term.op, key, e.value), True))
        else:
            out.append((key, None, False))
    return tuple(out)


def _match_term(graph: Graph, term: Term, value: Value, st: _State) -> Iterator[_State]:
    """Every way `term` matches `value` extending `st` (commutative ops match both operand
    orders); `st` itself is never modified."""
    if isinstance(term, Var):
        bound = st.tensors.get(term.name)
        if bound is None:
            st = st.copy()
            st.tensors[term.name] = value
            yield st
        elif bound == value:
            yield st
        return
    if not isinstance(term, OpTerm):
        raise RuleError("let-bound names may appear only in targets")
    node = graph[value.node]
    if node.op != term.op or value.index != term.index or len(node.inputs) != len(term.args):
        return
    st = st.copy()
    computed = []
    for (key, lit, is_lit), (_, e) in zip(_compiled_literals(term), term.attrs):
        if key == SAME_SHAPES:
            if len({graph.type_of(v).shape for v in node.inputs}) > 1:
                return
            continue
        actual = node.attrs.get(key)
        if is_lit:
            if key == "axis" and isinstance(lit, int) and lit < 0 and node.inputs:
                lit = norm_axis(lit, graph.type_of(node.inputs[0]).rank, term.op)
            if actual != lit:
                return
        elif isinstance(e, AVar):
            if e.name in st.attrs:
                if st.attrs[e.name] != actual:
                    return
            else:
                st.attrs[e.name] = actual
        else:  # a computed expression: compared once the arguments have bound its variables
            computed.append((e, actual))
    st.nodes.add(value.node)
    orders = [node.inputs]
    if get_op(term.op).commutative and node.inputs[0] != node.inputs[1]:
        orders.append(node.inputs[::-1])
    for inputs in orders:
        for done in _match_args(graph, term.args, inputs, st):
            if all(_holds(graph, done, e, actual) for e, actual in computed):
                yield done


def _holds(graph: Graph, st: _State, e: Any, actual: Any) -> bool:
    try:
        ok, want = try_evaluate(e, Env(graph, st.tensors, st.attrs))
    except RuleError:
        return False  # it reads a variable this match does not bind
    return ok and want == actual


def _match_args(graph: Graph, terms: tuple[Term, ...], values: tuple[Value, ...],
                st: _State) -> Iterator[_State]:
    if not terms:
        yield st
        return
    for st2 in _match_term(graph, terms[0], values[0], st):
        yield from _match_args(graph, terms[1:], values[1:], st2)


def _root_candidates(graph: Graph, term: Term, st: _State) -> Iterator[Value]:
    if not isinstance(term, OpTerm):
        raise RuleError("a source term must be an operator, not a bare variable")
    for arg in term.args:
        if isinstance(arg, Var) and arg.name in st.tensors:
            bound = st.tensors[arg.name]
            seen = set()
            for user, _ in graph.users().get(bound.node, ()):
                if user not in seen and graph[user].op == term.op:
                    seen.add(user)
                    yield Value(user, term.index)
            return
    for nid in graph.nodes_by_op(term.op):
        yield Value(nid, term.index)


@lru_cache(maxsize=None)
def _symmetric(rule: Rule) -> bool:
    """Whether all source terms are the same up to variable names, so that root order does not
    matter and each set of roots need be matched once."""
    from graphsub.rules.parser import print_term

    if len(rule.sources) < 2:
        return False

    def shape(t: Term) -> str:
        import re

        return re.sub(r"\?[\w-]+", "?", print_term(t))

    return len({shape(s) for s in rule.sources}) == 1


def conditions_hold(graph: Graph, rule: Rule, tensors: dict[str, Value], attrs: dict[str, Any],
                    roots: tuple[Value, ...]) -> bool:
    """Whether the rule's `where` conditions hold for these bindings."""
    env = Env(graph, tensors, attrs, roots)
    for cond in rule.conditions:
        ok, value = try_evaluate(cond, env)
        if not ok or not value:
            return False
    return True


def find_matches(graph: Graph, rule: Rule, limit: int | None = None,
                 first_roots: Iterable[int] | None = None) -> list[Match]:
    """All matches of the rule in the graph (conditions checked), up to `limit`; with
    `first_roots`, only those whose first source root is one of these nodes."""
    out: list[Match] = []
    symmetric = _symmetric(rule)

    def extend(k: int, st: _State, roots: tuple[Value, ...]) -> None:
        if limit is not None and len(out) >= limit:
            return
        if k == len(rule.sources):
            if not conditions_hold(graph, rule, st.tensors, st.attrs, roots):
                return
            out.append(Match(rule, roots, dict(st.tensors), dict(st.attrs), frozenset(st.nodes)))
            return
        if k == 0 and first_roots is not None:
            source = rule.sources[0]
            assert isinstance(source, OpTerm)
            candidates: Iterable[Value] = (Value(n, source.index) for n in first_roots
                                           if graph[n].op == source.op)
        else:
            candidates = _root_candidates(graph, rule.sources[k], st)
        for cand in candidates:
            if cand in roots or cand.index >= len(graph[cand.node].outputs):
                continue
            if symmetric and roots and cand.node <= roots[-1].node:
                continue
            for matched in _match_term(graph, rule.sources[k], cand, st):
                extend(k + 1, matched, roots + (cand,))

    extend(0, _State({}, {}, set()), ())
    return out
