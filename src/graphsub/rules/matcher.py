"""Matching a rule's source patterns: one pattern-node check for every host, and the search
for matches in a graph.

A host is what the patterns are matched in: a graph, whose handles are values, or an e-graph
(graphsub.egraph.ematch), whose handles are e-classes. `match_term` and `match_node` decide
whether a term matches there (operator, output index, attributes, shape conditions, both
operand orders of a commutative op) for either, so a change to what a pattern means is one
edit. A rule that writes a chain of sums or products is matched in every association and
order of the chain (graphsub.rules.chains) by a host that `reads_chains`: a graph for such a
rule (`FormsHost`, which also reads a product's other forms) and an e-graph. Where to try the
roots is the host's own search: `find_matches` below for graphs, the semi-naive
`SourceIndex` for e-graphs.

Source terms are trees, so matching one root at one node is deterministic; the search is over
where the roots go. In a graph the first root is tried at every node of its op (nodes are
indexed by op); later roots are joined on shared variables, by trying only the readers of an
already bound value where the root reads one directly.
"""

from __future__ import annotations

import re
from functools import lru_cache
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from graphsub.ir.graph import Graph, Value
from graphsub.rules.chains import (PRODUCT_VIEWS, Reciprocal, by_identity, frontiers,
                                   graph_chain_views, has_chain, pattern_chain)
from graphsub.tensors.types import Constant, TensorType
from graphsub.ops import get_op
from graphsub.errors import GraphsubError
from graphsub.ops.base import REQUIRED, norm_axis
from graphsub.rules.ast import AVar, Lit, OpTerm, Rule, Term, Var
from graphsub.rules.expr import Env, RuleError, TensorHost, try_evaluate

H = TypeVar("H")
H_contra = TypeVar("H_contra", contravariant=True)


class NodeView(Protocol):
    """What the pattern check reads of a node: its operator and attributes."""

    @property
    def op(self) -> str: ...

    @property
    def attrs(self) -> Mapping[str, Any]: ...


#: A node that may compute a handle (a pattern op's match there): (node id, the node, its
#: input handles).
Producer = tuple[int, NodeView, tuple[Any, ...]]


class PatternHost(TensorHost[H_contra], Protocol[H_contra]):
    """A place patterns are matched in: the tensors expressions read, and the nodes that
    compute a handle."""

    @property
    def reads_chains(self) -> bool:
        """Whether a pattern's chain (chains.pattern_chain) matches here in any association
        and order, through `chain_views`; else as written."""
        ...

    def producers(self, term: OpTerm, handle: H_contra) -> Sequence[Producer]:
        """The nodes of op `term.op` whose output `term.index` is `handle`."""
        ...

    def chain_views(self, op: str, handle: H_contra) -> Sequence[tuple[int, tuple[Any, ...]]]:
        """The ways `handle` is computed as `op` of operands: (node id, operand handles),
        what chains.frontiers reads a chain through."""
        ...

    def same(self, bound: H_contra, handle: H_contra) -> bool:
        """Whether a variable bound to `bound` may also be bound to `handle`."""
        ...


class GraphHost:
    """A graph as a pattern host: handles are its values. A rule without a chain is matched
    here, as written (`reads_chains` is False)."""

    __slots__ = ("graph", "type_of")
    reads_chains = False

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.type_of = graph.type_of

    def is_weight(self, value: Value) -> bool:
        return value.node in self.graph.weight_only()

    def constant(self, value: Value) -> Constant | None:
        node = self.graph[value.node]
        return node.attrs["value"] if node.op == "weight" else None

    def made_by(self, value: Value, op: str) -> bool:
        return self.graph[value.node].op == op

    def producers(self, term: OpTerm, value: Value) -> Sequence[Producer]:
        node = self.graph[value.node]
        if node.op != term.op or value.index != term.index:
            return ()
        return ((value.node, node, node.inputs),)

    def same(self, bound: Value, value: Value) -> bool:
        return bound == value

    def chain_views(self, op: str, value: Value) -> Sequence[tuple[int, tuple[Any, ...]]]:
        """The ways `value` is computed as a chain of `op` (chains.graph_chain_views)."""
        return graph_chain_views(self.graph, op, value)


class FormsHost(GraphHost):
    """A graph where products and sums are read in every form (graphsub.rules.chains), for
    a rule that writes a chain (`reads_forms`): its products also match a scalar
    multiplication and a division by a constant, whose reciprocal (a chains.Reciprocal
    handle) they read, and its chains any association."""

    __slots__ = ()
    reads_chains = True

    def __init__(self, graph: Graph) -> None:
        super().__init__(graph)
        self.type_of = self._type_of

    def _type_of(self, value: Value | Reciprocal) -> TensorType:
        if type(value) is Reciprocal:
            return self.graph.type_of(value.divisor)
        return self.graph.type_of(value)

    def is_weight(self, value: Value | Reciprocal) -> bool:
        return type(value) is Reciprocal or super().is_weight(value)

    def constant(self, value: Value | Reciprocal) -> Constant | None:
        return value.value if type(value) is Reciprocal else super().constant(value)

    def made_by(self, value: Value | Reciprocal, op: str) -> bool:
        return type(value) is not Reciprocal and super().made_by(value, op)

    def producers(self, term: OpTerm, value: Value | Reciprocal) -> Sequence[Producer]:
        if type(value) is Reciprocal:
            return ()
        node = self.graph[value.node]
        if term.op == "mul" and node.op != "mul" and value.index == term.index:
            return tuple((nid, node, operands) for nid, operands
                         in graph_chain_views(self.graph, "mul", value)
                         if len(operands) == len(term.args))
        return super().producers(term, value)

    def chain_views(self, op: str, value: Value | Reciprocal
                    ) -> Sequence[tuple[int, tuple[Any, ...]]]:
        if type(value) is Reciprocal:
            return []
        return super().chain_views(op, value)


def host_for(graph: Graph, rule: Rule) -> GraphHost:
    """The host a rule's patterns are matched and its conditions read in."""
    return FormsHost(graph) if reads_forms(rule) else GraphHost(graph)


@dataclass(frozen=True)
class Match(Generic[H]):
    """Where a rule's source sits in a host: its roots' handles, the bindings, and (in a
    graph) the ids of the matched nodes."""

    rule: Rule
    roots: tuple[H, ...]
    tensors: dict[str, H]
    attrs: dict[str, Any]
    nodes: frozenset[int] = field(default_factory=frozenset)


@dataclass
class Bindings(Generic[H]):
    """A partial match: tensor variables to handles, attribute variables to values, and the
    ids of the nodes matched so far."""

    tensors: dict[str, H]
    attrs: dict[str, Any]
    nodes: set[int]

    def copy(self) -> Bindings[H]:
        return Bindings(dict(self.tensors), dict(self.attrs), set(self.nodes))


def no_bindings() -> Bindings[Any]:
    return Bindings({}, {}, set())


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


@by_identity
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


class Tracer(Protocol):
    """Told where and why a pattern failed to match (graphsub.rules.explain): the pattern
    term, where it was tried (a handle, or the id of the node whose check failed) and the
    reason in words."""

    def fail(self, term: Term, where: Any, reason: str) -> None: ...


def match_term(host: PatternHost[H], term: Term, handle: H, st: Bindings[H],
               tracer: Tracer | None = None) -> Iterator[Bindings[H]]:
    """Every way `term` matches `handle` extending `st`; `st` itself is never modified.
    A `tracer` is told of every failure (matching is the same without one)."""
    if isinstance(term, Var):
        bound = st.tensors.get(term.name)
        if bound is None:
            st = st.copy()
            st.tensors[term.name] = handle
            yield st
        elif host.same(bound, handle):
            yield st
        elif tracer is not None:
            tracer.fail(term, handle, f"?{term.name} is already bound to another tensor")
        return
    if not isinstance(term, OpTerm):
        raise RuleError("let-bound names may appear only in targets")
    if host.reads_chains and (chain := pattern_chain(term)) is not None:
        yield from _match_chain(host, term, chain, handle, st, tracer)
        return
    producers = host.producers(term, handle)
    if not producers and tracer is not None:
        tracer.fail(term, handle, f"not computed by {term.op}"
                    + (f" (output {term.index})" if term.index else ""))
    for nid, node, inputs in producers:
        yield from match_node(host, term, nid, node, inputs, st, tracer)


def match_node(host: PatternHost[H], term: OpTerm, nid: int, node: NodeView,
               inputs: tuple[H, ...], st: Bindings[H], tracer: Tracer | None = None
               ) -> Iterator[Bindings[H]]:
    """Every way `term` matches node `nid` (of op term.op, reading `inputs`) extending `st`:
    its attribute patterns, its :same-shapes flag, and its arguments in both operand orders
    when the op is commutative."""
    if len(inputs) != len(term.args):
        if tracer is not None:
            tracer.fail(term, nid, f"the node has {len(inputs)} inputs, the pattern "
                                   f"{len(term.args)}")
        return
    st = st.copy()
    computed = []
    for (key, lit, is_lit), (_, e) in zip(_compiled_literals(term), term.attrs):
        if key == SAME_SHAPES:
            if len({host.type_of(v).shape for v in inputs}) > 1:
                if tracer is not None:
                    tracer.fail(term, nid, "its inputs' shapes differ (the pattern asks for "
                                           ":same-shapes)")
                return
            continue
        actual = node.attrs.get(key)
        if is_lit:
            if key == "axis" and isinstance(lit, int) and lit < 0 and inputs:
                lit = norm_axis(lit, host.type_of(inputs[0]).rank, term.op)
            if actual != lit:
                if tracer is not None:
                    tracer.fail(term, nid, f"{key} is {actual!r}, the pattern asks for {lit!r}")
                return
        elif isinstance(e, AVar):
            if e.name in st.attrs:
                if st.attrs[e.name] != actual:
                    if tracer is not None:
                        tracer.fail(term, nid, f"{key} is {actual!r}, but ?{e.name} is "
                                               f"already {st.attrs[e.name]!r}")
                    return
            else:
                st.attrs[e.name] = actual
        else:  # a computed expression: compared once the arguments have bound its variables
            computed.append((key, e, actual))
    if (unwritten := _unwritten_defaults(term)) and not _at_defaults(
            term.op, unwritten, node.attrs, tuple(host.type_of(v) for v in inputs)):
        if tracer is not None:
            tracer.fail(term, nid, f"{', '.join(unwritten)} not at the default the pattern "
                                   "asks for by leaving it unwritten")
        return
    st.nodes.add(nid)
    orders = [inputs]
    if get_op(term.op).commutative and not host.same(inputs[0], inputs[1]):
        orders.append(inputs[::-1])
    for order in orders:
        for done in _match_args(host, term.args, order, st, tracer):
            failed = next(((key, want) for key, e, actual in computed
                           if (want := _wanted(host, done, e)) != actual), None)
            if failed is None:
                yield done
            elif tracer is not None:
                key, want = failed
                tracer.fail(term, nid, f"{key} is {node.attrs.get(key)!r}, the pattern asks "
                                       f"for {want!r}" if want is not _UNKNOWN else
                            f"the pattern's {key} cannot be computed here")


@by_identity
def _unwritten_defaults(term: OpTerm) -> tuple[str, ...]:
    """The attributes with a default that `term` leaves unwritten: they match only their
    default. An unwritten attribute matching any value would let a rule drop what it never
    looked at (a convolution's dilation), and no check could see it, since each builds an
    instance at the default; a rule that means any value binds it (`:dilation ?d`)."""
    written = {key for key, _ in term.attrs}
    return tuple(spec.name for spec in get_op(term.op).attrs
                 if spec.name not in written and spec.default is not REQUIRED)


def _at_defaults(op: str, names: tuple[str, ...], attrs: Mapping[str, Any],
                 in_types: tuple[TensorType, ...]) -> bool:
    """Whether the node's attributes `names` are what the operator makes of their defaults
    for these inputs (a default softmax axis is the last one of the input's rank)."""
    given = tuple(sorted((k, v) for k, v in attrs.items() if k not in names))
    try:
        hash(given)
    except TypeError:  # an unhashable attribute value (an array): not through the cache
        defaults = _canonical_defaults.__wrapped__(op, given, in_types)
    else:
        defaults = _canonical_defaults(op, given, in_types)
    return defaults is not None and all(attrs.get(k) == defaults.get(k) for k in names)


@lru_cache(maxsize=4096)
def _canonical_defaults(op: str, given: tuple[tuple[str, Any], ...],
                        in_types: tuple[TensorType, ...]) -> Mapping[str, Any] | None:
    try:
        return get_op(op).make_attrs(dict(given), in_types)
    except (GraphsubError, ValueError, IndexError):  # its attributes do not go with the defaults
        return None


#: What a computed attribute pattern wants where it cannot be computed (matching nothing).
_UNKNOWN = object()


def _wanted(host: PatternHost[H], st: Bindings[H], e: Any) -> Any:
    """The value a computed attribute pattern asks for under these bindings (_UNKNOWN where
    it cannot be computed: it reads a variable this match does not bind)."""
    try:
        ok, want = try_evaluate(e, Env(host, st.tensors, st.attrs))
    except RuleError:
        return _UNKNOWN
    return want if ok else _UNKNOWN


def _match_chain(host: PatternHost[H], term: OpTerm, chain: tuple[Term, ...], handle: H,
                 st: Bindings[H], tracer: Tracer | None) -> Iterator[Bindings[H]]:
    """Every way the pattern's chain of operands matches `handle` read as a chain of the
    same length, in any association and order (graphsub.rules.chains); each set of bindings
    once."""
    seen: set[tuple[Any, ...]] = set()
    found = False
    for leaves, nodes in frontiers(host.chain_views, term.op, handle, len(chain)):
        found = True
        start = st.copy()
        start.nodes |= nodes
        for done in _match_operands(host, _operand_order(chain), leaves, start, tracer):
            key = (tuple(sorted(done.tensors.items(), key=lambda kv: kv[0])),
                   tuple(sorted(done.attrs.items(), key=lambda kv: kv[0])),
                   frozenset(done.nodes))
            if key not in seen:
                seen.add(key)
                yield done
    if not found and tracer is not None:
        tracer.fail(term, handle, f"not a chain of {len(chain)} operands of {term.op} in any "
                                  "association")


def _operand_order(chain: tuple[Term, ...]) -> tuple[Term, ...]:
    """Operator terms first: they bind variables that the bare ones then only compare."""
    return tuple(sorted(chain, key=lambda t: not isinstance(t, OpTerm)))


def _match_operands(host: PatternHost[H], terms: tuple[Term, ...], leaves: tuple[H, ...],
                    st: Bindings[H], tracer: Tracer | None) -> Iterator[Bindings[H]]:
    """The pattern's operands matched to the graph's in any order, one to one."""
    if not terms:
        yield st
        return
    tried: list[H] = []
    for i, leaf in enumerate(leaves):
        if any(host.same(t, leaf) for t in tried):
            continue  # the same operand twice (x * x): one order is enough
        tried.append(leaf)
        for st2 in match_term(host, terms[0], leaf, st, tracer):
            yield from _match_operands(host, terms[1:], leaves[:i] + leaves[i + 1:], st2,
                                       tracer)


def _match_args(host: PatternHost[H], terms: tuple[Term, ...], handles: tuple[H, ...],
                st: Bindings[H], tracer: Tracer | None = None) -> Iterator[Bindings[H]]:
    if not terms:
        yield st
        return
    for st2 in match_term(host, terms[0], handles[0], st, tracer):
        yield from _match_args(host, terms[1:], handles[1:], st2, tracer)


def conditions_hold(host: TensorHost[H], rule: Rule, tensors: Mapping[str, H],
                    attrs: Mapping[str, Any], roots: tuple[H, ...]) -> bool:
    """Whether the rule's `where` conditions hold for these bindings."""
    env = Env(host, tensors, attrs, roots)
    for cond in rule.conditions:
        ok, value = try_evaluate(cond, env)
        if not ok or not value:
            return False
    return True


@by_identity
def symmetric_sources(rule: Rule) -> bool:
    """Whether all source terms are the same up to variable names, so that root order does not
    matter and each set of roots need be matched once."""
    from graphsub.rules.parser import print_term

    if len(rule.sources) < 2:
        return False
    return len({re.sub(r"\?[\w-]+", "?", print_term(t)) for t in rule.sources}) == 1


# ---- matches in a graph ---------------------------------------------------------------------

@by_identity
def reads_forms(rule: Rule) -> bool:
    """Whether the rule writes a chain (a product or sum of three or more operands, chains.
    pattern_chain): such a rule recognises an expression however it is written, and its
    products are read in every form; any other rule matches as written."""
    return any(has_chain(s) for s in rule.sources)


def root_ops(rule: Rule) -> tuple[str, ...]:
    """The operators of the nodes the rule's first source root may match: where the rule
    reads forms, a product may be a scalar multiplication, a division or a power
    (graphsub.rules.chains)."""
    return _term_ops(rule.sources[0], reads_forms(rule))


def _term_ops(term: Term, forms: bool) -> tuple[str, ...]:
    if not isinstance(term, OpTerm):
        raise RuleError("a source term must be an operator, not a bare variable")
    return ("mul", *PRODUCT_VIEWS) if forms and term.op == "mul" else (term.op,)


@by_identity
def built_variables(rule: Rule) -> frozenset[str]:
    """The tensor variables a rule's targets build with."""
    names: set[str] = set()

    def walk(term: Term) -> None:
        if isinstance(term, Var):
            names.add(term.name)
        elif isinstance(term, OpTerm):
            for arg in term.args:
                walk(arg)

    for term in (*rule.targets, *(t for _, t in rule.lets)):
        walk(term)
    return frozenset(names)


def _reads_only(rule: Rule, tensors: Mapping[str, Any]) -> bool:
    """Whether the match builds nothing from a reciprocal it read (chains.Reciprocal): one
    is compared by value, never made into a tensor, so that reading `x / c` as `x * (1/c)`
    lets a rule recognise a form without letting it rewrite divisions into products."""
    built = built_variables(rule)
    return not any(type(h) is Reciprocal and name in built for name, h in tensors.items())


def _root_candidates(graph: Graph, term: Term, st: Bindings[Value], forms: bool
                     ) -> Iterator[Value]:
    ops = _term_ops(term, forms)
    assert isinstance(term, OpTerm)
    # In every form, a product's operands need not be its root's inputs: no join there.
    for arg in () if forms else term.args:
        if isinstance(arg, Var) and arg.name in st.tensors:
            bound = st.tensors[arg.name]
            seen = set()
            for user, _ in graph.users().get(bound.node, ()):
                if user not in seen and graph[user].op in ops:
                    seen.add(user)
                    yield Value(user, term.index)
            return
    for op in ops:
        for nid in graph.nodes_by_op(op):
            yield Value(nid, term.index)


def find_matches(graph: Graph, rule: Rule, limit: int | None = None,
                 first_roots: Iterable[int] | None = None) -> list[Match[Value]]:
    """All matches of the rule in the graph (conditions checked), up to `limit`; with
    `first_roots`, only those whose first source root is one of these nodes."""
    out: list[Match[Value]] = []
    symmetric = symmetric_sources(rule)
    forms = reads_forms(rule)
    host = host_for(graph, rule)

    def extend(k: int, st: Bindings[Value], roots: tuple[Value, ...]) -> None:
        if limit is not None and len(out) >= limit:
            return
        if k == len(rule.sources):
            if forms and not _reads_only(rule, st.tensors) or not conditions_hold(
                    host, rule, st.tensors, st.attrs, roots):
                return
            out.append(Match(rule, roots, dict(st.tensors), dict(st.attrs), frozenset(st.nodes)))
            return
        if k == 0 and first_roots is not None:
            source = rule.sources[0]
            assert isinstance(source, OpTerm)
            ops = root_ops(rule)
            candidates: Iterable[Value] = (Value(n, source.index) for n in first_roots
                                           if graph[n].op in ops)
        else:
            candidates = _root_candidates(graph, rule.sources[k], st, forms)
        for cand in candidates:
            if cand in roots or cand.index >= len(graph[cand.node].outputs):
                continue
            if symmetric and roots and cand.node <= roots[-1].node:
                continue
            for matched in match_term(host, rule.sources[k], cand, st):
                extend(k + 1, matched, roots + (cand,))

    extend(0, no_bindings(), ())
    return out
