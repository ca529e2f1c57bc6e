"""Building a rule's targets, and applying a match to a graph.

`build_targets` instantiates a rule's target terms (computed attributes, `let` names, weight
constants, :same-shapes checks, equal subterms shared) into a sink: a GraphEditor for a real
rewrite, the dry-run pricer of graphsub.search.pricing, an e-graph (graphsub.egraph.rewrite).
A target that cannot be built is a `Rejection`, a value the caller counts, not an exception.

`apply_match` rewrites a graph: it builds the targets, redirects the source roots' readers to
them and cleans up. It rejects a match when a matched node that is not a mapped root is read
outside the match (its value would be lost), when a target's type differs from its source's,
when the target cannot be built (shapes that do not fit), or when the result has a cycle
(TASO figure 6).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from graphsub.errors import CycleError, GraphsubError, ShapeError
from graphsub.ir.graph import Graph, Node, Value, make_node
from graphsub.tensors.types import Constant, TensorType
from graphsub.ops import is_dequantization, is_quantization
from graphsub.rules.ast import OpTerm, Ref, Rule, Term, Var
from graphsub.rules.expr import Env, try_evaluate
from graphsub.rules.matcher import SAME_SHAPES, Match, host_for

H = TypeVar("H")


@dataclass(frozen=True)
class Rejection:
    """Why a match was not rewritten. Searches count these in their statistics."""

    reason: str


class TargetSink(Protocol[H]):
    """Where targets are built (a GraphEditor is one as it is): the types of the handles
    they read, and how nodes are added."""

    def type_of(self, handle: H) -> TensorType: ...

    def add(self, op: str, inputs: Sequence[H] = (),
            attrs: Mapping[str, Any] | None = None) -> tuple[H, ...]:
        """Add a node (raising the op's GraphsubError when it does not apply); its outputs."""
        ...


class UnderConstruction(Protocol):
    """A graph being built or edited (GraphBuilder, GraphEditor): its values' types and nodes."""

    def type_of(self, value: Value) -> TensorType: ...

    def node(self, node_id: int) -> Node: ...


class BuildingHost:
    """What rule expressions read (a TensorHost) from a graph under construction: its values'
    types, and its weight nodes' values."""

    def __init__(self, graph: UnderConstruction) -> None:
        self._graph = graph

    def type_of(self, value: Value) -> TensorType:
        return self._graph.type_of(value)

    def is_weight(self, value: Value) -> bool:
        return self._graph.node(value.node).op == "weight"

    def constant(self, value: Value) -> Constant | None:
        node = self._graph.node(value.node)
        return node.attrs["value"] if node.op == "weight" else None

    def made_by(self, value: Value, op: str) -> bool:
        return self._graph.node(value.node).op == op


class _Rejected(Exception):
    """Unwinds a target build; turned into a Rejection at the edge of this module."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


#: The rejection of a target whose type (shape or element type) is not its source's: not a
#: draw that does not fit, but a rule that is wrong there (rules.check says so).
TYPES_DIFFER = "the target's type differs from its source's"


def rejection_of(exc: GraphsubError) -> Rejection:
    """The rejection an op's error during a target build stands for."""
    if isinstance(exc, CycleError):
        return Rejection("cycle")
    if isinstance(exc, ShapeError):
        return Rejection(TYPES_DIFFER if "types differ" in str(exc) else "shape or type mismatch")
    return Rejection("target not buildable")


class _TargetBuilder(Generic[H]):
    """Instantiates target terms into a sink, sharing identical subterms (hash-consing)."""

    def __init__(self, sink: TargetSink[H], env: Env[H], rule: Rule | None = None) -> None:
        self.sink = sink
        self.env = env
        self.memo: dict[Any, tuple[H, ...]] = {}
        self.lets: dict[str, tuple[H, ...]] = {}
        # A target with a cast could compute something in another precision than the source
        # did: its operators may compute only in the float types the source's compute in.
        self.precisions = _source_precisions(rule, env) if rule is not None and any(
            _has_cast(t) for t in (*rule.targets, *(t for _, t in rule.lets))) else None

    def build(self, term: Term) -> H:
        if isinstance(term, Var):
            if term.name not in self.env.tensors:
                raise _Rejected(f"target variable ?{term.name} is not bound by the source")
            return self.env.tensors[term.name]
        outs = self.build_outputs(term)
        index = term.index if isinstance(term, (OpTerm, Ref)) else 0
        if index >= len(outs):
            raise _Rejected(f"target has no output {index}")
        return outs[index]

    def build_outputs(self, term: Term) -> tuple[H, ...]:
        if isinstance(term, Ref):
            outs = self.lets.get(term.name)
            if outs is None:
                raise _Rejected(f"let name {term.name!r} is not defined")
            return outs
        if isinstance(term, Var):
            return (self.build(term),)
        assert isinstance(term, OpTerm)
        inputs = tuple(self.build(a) for a in term.args)
        attrs = target_attrs(term, self.env, [self.sink.type_of(v).shape for v in inputs])
        key = (term.op, tuple(sorted((k, repr(v)) for k, v in attrs.items())), inputs)
        if key not in self.memo:
            if term.op == "constant":
                self.memo[key] = self.sink.add("weight", (), {"value": constant_from_attrs(attrs)})
            else:
                self.memo[key] = self.sink.add(term.op, inputs, attrs)
                if self.precisions is not None and term.op != "cast":
                    for out in self.memo[key]:
                        dtype = self.sink.type_of(out).dtype
                        if dtype.startswith(("float", "bfloat")) and dtype not in self.precisions:
                            raise _Rejected(PRECISION_CHANGED)
        return self.memo[key]


#: Why a rewrite that would compute an operator in another float type is refused.
PRECISION_CHANGED = "it would compute in another precision than the source"


def _has_cast(term: Term) -> bool:
    return isinstance(term, OpTerm) and (term.op == "cast" or any(_has_cast(a) for a in term.args))


def _source_precisions(rule: Rule, env: Env[Any]) -> frozenset[str]:
    """The float types the source's operators (casts aside) compute in for this match, from
    the bound tensors' types and each operator's type inference."""
    found: set[str] = set()

    def types(term: Term) -> tuple[TensorType, ...]:
        if isinstance(term, Var):
            return (env.host.type_of(env.tensors[term.name]),)
        if not isinstance(term, OpTerm):
            raise _Rejected(PRECISION_CHANGED)
        ins = tuple(types(a)[a.index if isinstance(a, OpTerm) else 0] for a in term.args)
        attrs = target_attrs(term, env, [t.shape for t in ins])
        try:
            node = make_node(term.op, (), ins, attrs)
        except GraphsubError:
            raise _Rejected(PRECISION_CHANGED) from None
        if term.op != "cast":
            found.update(t.dtype for t in node.outputs)
        return node.outputs

    for source in rule.sources:
        types(source)
    return frozenset(found)


def build_targets(sink: TargetSink[H], rule: Rule, env: Env[H]) -> tuple[H, ...] | Rejection:
    """The handles of the rule's targets built into `sink` for the match `env` describes, one
    per source root; or why they cannot be built. The handles env binds are read as they are
    (an e-graph's must be canonical). What the sink holds after a rejection is
    whatever was built before it (a GraphEditor is dropped, an e-graph keeps unread nodes)."""
    try:
        builder = _TargetBuilder(sink, env, rule)
        for name, term in rule.lets:
            builder.lets[name] = builder.build_outputs(term)
        return tuple(builder.build(t) for t in rule.targets)
    except _Rejected as exc:
        return Rejection(exc.reason)
    except GraphsubError as exc:
        return rejection_of(exc)


def target_attrs(term: OpTerm, env: Env[Any], input_shapes: Sequence[tuple[int, ...]]
                 ) -> dict[str, Any]:
    """A target term's attributes evaluated for a match, after checking its :same-shapes flag
    against the shapes of its built inputs."""
    attrs = {}
    for k, e in term.attrs:
        if k != SAME_SHAPES:
            ok, attrs[k] = try_evaluate(e, env)
            if not ok:
                raise _Rejected("a target attribute has no value for this match")
    if any(k == SAME_SHAPES for k, _ in term.attrs) and len(set(input_shapes)) > 1:
        raise _Rejected("broadcasting where the rule forbids it")
    return attrs


def constant_from_attrs(attrs: dict[str, Any]) -> np.ndarray:
    """(constant :value v :shape [..] [:dtype d] [:pattern p]): a weight of one value, or
    an identity (TASO's I_matmul, I_conv) with `:pattern eye` or `:pattern conv-identity`."""
    return constant_array(tuple(attrs.get("shape", ())), attrs.get("value", 1.0),
                          attrs.get("pattern", "full"), attrs.get("dtype", "float32"))


def constant_array(shape: tuple[int, ...], value: float, pattern: str, dtype: str) -> np.ndarray:
    if not all(type(d) is int for d in shape):
        raise _Rejected("a constant over symbolic sizes")  # a weight has numbers for sizes
    if pattern == "full":
        return np.full(shape, value, dtype=dtype)
    arr = np.zeros(shape, dtype=dtype)
    if pattern == "eye" and len(shape) == 2 and shape[0] == shape[1]:
        arr[np.arange(shape[0]), np.arange(shape[0])] = value
    elif pattern == "conv-identity" and len(shape) == 4 and shape[0] == shape[1]:
        arr[np.arange(shape[0]), np.arange(shape[0]), shape[2] // 2, shape[3] // 2] = value
    elif pattern == "causal" and len(shape) >= 2:
        # An additive causal mask: `value` on and below the diagonal, -inf above.
        keep = np.tril(np.ones(shape[-2:], dtype=bool))
        arr = np.broadcast_to(np.where(keep, value, -np.inf).astype(dtype), shape).copy()
    else:
        raise _Rejected(f"constant pattern {pattern!r} does not fit shape {shape}")
    return arr


def external_use(graph: Graph, match: Match[Value]) -> Rejection | None:
    """Why rewriting the match would lose a value: a matched node that is not a mapped root
    read outside the match or as a graph output; None when nothing is lost."""
    roots = set(match.roots)
    outputs = set(graph.outputs)
    users = graph.users()
    for nid in match.nodes:
        for i in range(len(graph[nid].outputs)):
            v = Value(nid, i)
            if v in roots:
                continue
            if v in outputs:
                return Rejection("unmapped output")
            for user, pos in users.get(nid, ()):
                if graph[user].inputs[pos] == v and user not in match.nodes:
                    return Rejection("unmapped external use")
    return None


#: Why a rewrite next to a quantization is refused.
AT_QUANTIZATION = "it touches what a quantization reads or a dequantization gives"
def at_quantization(graph: Graph, match: Match[Value]) -> Rejection | None:
    """Why rewriting the match would touch a quantized region: a matched node that reads a
    dequantized value, or whose value is quantized. Rounding to integers turns any change of
    a float sum's order into a step of the quantized value, and onnxruntime fuses exactly
    these DequantizeLinear -> op -> QuantizeLinear patterns into integer kernels, which a
    rewrite there would break. A rule that matches the (de)quantization itself is exact by
    its check (quantization.rules: layout moved through it, a pair that cancels), and may."""
    if any(is_quantization(graph[nid]) or is_dequantization(graph[nid]) for nid in match.nodes):
        return None
    users = graph.users()
    for nid in match.nodes:
        node = graph[nid]
        if any(is_dequantization(graph[v.node]) for v in node.inputs):
            return Rejection(AT_QUANTIZATION)
        if any(is_quantization(graph[u]) for u, _ in users.get(nid, ())):
            return Rejection(AT_QUANTIZATION)
    return None


def build_in_graph(sink: TargetSink[Value], graph: Graph, match: Match[Value]
                   ) -> tuple[Value, ...] | Rejection:
    """The match's targets built into `sink` (an editor of `graph`, or the dry-run pricer's),
    or why the rewrite is not allowed."""
    lost = external_use(graph, match) or at_quantization(graph, match)
    if lost is not None:
        return lost
    return build_targets(sink, match.rule,
                         Env(host_for(graph, match.rule), match.tensors, match.attrs, match.roots))


def apply_match(graph: Graph, match: Match[Value]) -> Graph | Rejection:
    """The graph with the match rewritten, or why the rewrite is not allowed."""
    editor = graph.edit()
    targets = build_in_graph(editor, graph, match)
    if isinstance(targets, Rejection):
        return targets
    try:
        for old, new in zip(match.roots, targets):
            if old != new:
                editor.replace_uses(old, new)
        return editor.finish()
    except GraphsubError as exc:
        return rejection_of(exc)
