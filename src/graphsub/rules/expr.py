"""Evaluation of attribute expressions and conditions against a match.

Expressions see the tensor variables bound by the source (their types, and for weights their
values), the attribute variables, and the types of the source roots ($i).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import ml_dtypes
import numpy as np

from graphsub.errors import GraphsubError
from graphsub.tensors.symbolic import Dim, at_most, equal, is_symbolic
from graphsub.tensors.types import Constant, TensorType, WeightDataUnavailable
from graphsub.rules.ast import AVar, Call, Expr, Lit, ListExpr, OutRef


class RuleError(GraphsubError):
    """A rule is malformed (unknown function, unbound variable, ...)."""


H = TypeVar("H")
H_contra = TypeVar("H_contra", contravariant=True)


class TensorHost(Protocol[H_contra]):
    """What rule expressions read of whatever a rule's tensor variables are bound to: a
    graph's values (graphsub.rules.matcher.GraphHost), an e-graph's classes
    (graphsub.egraph.ematch.EGraphHost), a rule example under construction (rules.check)."""

    def type_of(self, handle: H_contra) -> TensorType: ...

    def is_weight(self, handle: H_contra) -> bool:
        """Whether the tensor is computed from weights alone."""
        ...

    def constant(self, handle: H_contra) -> Constant | None:
        """The tensor's value when it is a weight, else None."""
        ...

    def made_by(self, handle: H_contra, op: str) -> bool:
        """Whether an operator `op` computes the tensor (in an e-graph: one of its class's
        nodes): what a condition reads of a value known by how it is made, not by its
        elements (a `causal_mask` at a symbolic length)."""
        ...


@dataclass
class Env(Generic[H]):
    """The bindings of one match, as expressions read them: tensor variables and the source
    roots ($i) to handles of a host, attribute variables to values."""

    host: TensorHost[H]
    tensors: Mapping[str, H]
    attrs: Mapping[str, Any]
    roots: tuple[H, ...] = ()

    def handle(self, e: Expr) -> H:
        if isinstance(e, AVar) and e.name in self.tensors:
            return self.tensors[e.name]
        if isinstance(e, OutRef) and e.index < len(self.roots):
            return self.roots[e.index]
        raise RuleError(f"{_show(e)} is not a matched tensor")

    def tensor_type(self, e: Expr) -> TensorType:
        return self.host.type_of(self.handle(e))

    def is_weight(self, e: Expr) -> bool:
        return self.host.is_weight(self.handle(e))

    def constant(self, e: Expr) -> Constant | None:
        return self.host.constant(self.handle(e))

    def made_by(self, e: Expr, op: str) -> bool:
        return self.host.made_by(self.handle(e), op)


def _show(e: Expr) -> str:
    from graphsub.rules.parser import print_expr

    return print_expr(e)


def _dim(env: Env[Any], t: Expr, i: Expr) -> Dim:
    shape = env.tensor_type(t).shape
    k: int = evaluate(i, env)
    if not -len(shape) <= k < len(shape):
        raise _NoValue()
    return shape[k]


def _all_equal(env: Env[Any], t: Expr, x: Expr) -> bool:
    """Whether the matched tensor is a weight whose elements all equal x."""
    constant = env.constant(t)
    return constant is not None and constant.all_equal(evaluate(x, env))


def _close_to(env: Env[Any], t: Expr, x: Expr) -> bool:
    """Whether the matched tensor is a weight whose elements all equal x as its dtype stores
    it: a constant such as 1/sqrt(2) is written in float64 and stored in float32 or half
    precision, rounded to nearest (directly, or through float32 first). Nothing else: a slack
    of a few units in the last place would let (mul ?x ?c) => ?x match c = 1.0039 in float16,
    and no check draws the slack's edges."""
    constant = env.constant(t)
    if constant is None or (value := constant.uniform()) is None:
        return False
    target = float(evaluate(x, env))
    dtype = constant.type.dtype
    if not dtype.startswith(("float", "bfloat")):
        return bool(value == target)
    stored = np.dtype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
    return value in (float(np.asarray(target).astype(stored)),
                     float(np.asarray(target, np.float32).astype(stored)))


def _nonzero(env: Env[Any], t: Expr) -> bool:
    """Whether the matched tensor is a weight with no zero element (a quantization's scale):
    the condition of a rule right only away from a division by zero."""
    constant = env.constant(t)
    try:
        return constant is not None and bool(np.all(constant.array != 0))
    except WeightDataUnavailable:
        return False


def _positive(env: Env[Any], t: Expr) -> bool:
    """Whether the matched tensor is a weight whose elements are all positive: the condition
    of a rule right only where a root or a logarithm is real."""
    constant = env.constant(t)
    try:
        return constant is not None and bool(np.all(constant.array > 0))
    except WeightDataUnavailable:
        return False


#: Scores at or below this are masked out: -inf, or the dtype's lowest value as Hugging Face's
#: causal masks hold it (float16's lowest, -65504, is above it: see `masked_at`).
MASKED = -1e30


def masked_at(dtype: str) -> float:
    """The score at or below which a mask of this float type masks: MASKED, or the type's
    lowest value where that is higher (float16: exp(-65504 - max) is 0 in float32 as
    exp(-inf) is)."""
    # ml_dtypes.finfo is unannotated
    return max(MASKED, float(ml_dtypes.finfo(dtype).min))  # type: ignore[no-untyped-call]


def _is_causal(env: Env[Any], t: Expr) -> bool:
    """Whether the matched tensor is a causal mask: a `causal_mask` (a mask a model builds
    from positions, proven causal where it was read: frontends.fx_position_masks), or a
    weight whose last two axes keep key j for query i exactly where j <= i, its other axes
    1: boolean (True kept), or additive (0 kept, masked above: -inf, or the dtype's
    lowest)."""
    if env.made_by(t, "causal_mask"):
        return True
    constant = env.constant(t)
    if constant is None or constant.type.rank < 2 or any(d != 1 for d in constant.type.shape[:-2]):
        return False
    below = np.tril(np.ones(constant.type.shape[-2:], dtype=bool))
    if constant.type.dtype == "bool":
        return bool(np.array_equal(constant.array.reshape(below.shape), below))
    if not constant.type.dtype.startswith(("float", "bfloat")):
        return False
    arr = constant.array.reshape(below.shape).astype(np.float64)
    return bool(np.all(arr[below] == 0)
                and np.all(arr[~below] <= masked_at(constant.type.dtype)))


def _unmasked_rows(env: Env[Any], t: Expr) -> bool:
    """Whether the matched tensor is an additive mask that leaves every row (along its last
    axis) a score: a weight without NaN or +inf with an entry above MASKED in every row. A
    softmax of scores plus such a mask has no fully masked row, so it is NaN only where the
    scores are (a NaN or infinite input), which graphsub's rules, like TASO's, leave aside."""
    constant = env.constant(t)
    if constant is None or constant.type.rank == 0 or not constant.type.dtype.startswith(
            ("float", "bfloat")):
        return False
    arr = constant.array.astype(np.float64)
    return bool(not np.isnan(arr).any() and not np.isposinf(arr).any()
                and np.all(np.any(arr > masked_at(constant.type.dtype), axis=-1)))


def _uniform_value(env: Env[Any], t: Expr) -> float:
    """The one value of a weight whose elements are all equal (an epsilon a rule carries over
    into an attribute); no value (no match) otherwise."""
    constant = env.constant(t)
    value = constant.uniform() if constant is not None else None
    if value is None:
        raise _NoValue()
    return value


def _is_weight(env: Env[Any], t: Expr) -> bool:
    return env.is_weight(t)


def _compose(p: tuple[int, ...], q: tuple[int, ...]) -> tuple[int, ...]:
    """transpose(transpose(x, p), q) == transpose(x, compose(p, q))."""
    return tuple(p[i] for i in q)


def _non_unit(shape: tuple[int, ...]) -> list[int]:
    return [d for d in shape if d != 1]


def _unit_reshape(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Whether reshaping shape a to shape b only inserts or removes dimensions of size 1."""
    return _non_unit(tuple(a)) == _non_unit(tuple(b))


def _unit_perm(a: tuple[int, ...], b: tuple[int, ...], p: tuple[int, ...]) -> tuple[int, ...]:
    """For a reshape from a to b that only moves size-1 dimensions, the permutation q of a
    such that transpose(reshape(x, b), p) == reshape(transpose(x, q), permute(b, p)): the
    non-unit axes of a in the order p puts b's non-unit axes, size-1 axes first."""
    a, b = tuple(a), tuple(b)
    if not _unit_reshape(a, b):
        raise _NoValue()
    a_axes = [i for i, d in enumerate(a) if d != 1]
    b_rank = {axis: k for k, axis in enumerate(i for i, d in enumerate(b) if d != 1)}
    order = [a_axes[b_rank[axis]] for axis in p if axis in b_rank]
    return tuple([i for i, d in enumerate(a) if d == 1] + order)


def _with_dim(shape: tuple[int, ...], axis: int, size: int) -> tuple[int, ...]:
    """`shape` with the size of one axis replaced (the shape of a reduction's ones vector)."""
    if not -len(shape) <= axis < len(shape):
        raise _NoValue()
    axis %= len(shape)
    return shape[:axis] + (size,) + shape[axis + 1:]


class _NoValue(Exception):
    """An expression has no value for this match (e.g. a dim out of range): no match."""


class _Undecided(_NoValue):
    """A shape condition that holds for some values of the size symbols and not for others:
    no match, counted apart (a rewrite applies only where it is right at every size)."""


def _decided(static: Callable[[Any, Any], bool], symbolic: Callable[[Any, Any], bool | None]
             ) -> Callable[[Any, Any], bool]:
    """A comparison that holds or fails for every value of the size symbols it meets; where
    it depends on them (is `seq` equal to 128?) the rule has no match there, and the search
    counts it (`undecided`)."""
    def compare(a: Any, b: Any) -> bool:
        if type(a) is int and type(b) is int or not (_has_symbol(a) or _has_symbol(b)):
            return static(a, b)
        result = symbolic(a, b)
        if result is None:
            raise _Undecided()
        return result
    return compare


def _has_symbol(v: Any) -> bool:
    return any(is_symbolic(x) for x in v) if isinstance(v, tuple) else is_symbolic(v)


def _equal(a: Any, b: Any) -> bool | None:
    if isinstance(a, tuple) or isinstance(b, tuple):
        if not (isinstance(a, tuple) and isinstance(b, tuple)) or len(a) != len(b):
            return False
        answers = [equal(x, y) for x, y in zip(a, b)]
        return False if False in answers else None if None in answers else True
    return equal(a, b)


def _not(answer: bool | None) -> bool | None:
    return None if answer is None else not answer


def _max(*args: Any) -> Any:
    return _pick(args, lambda a, b: at_most(a, b))


def _min(*args: Any) -> Any:
    return _pick(args, lambda a, b: at_most(b, a))


def _pick(args: tuple[Any, ...], second_wins: Callable[[Any, Any], bool | None]) -> Any:
    if len(args) == 1:
        args = tuple(args[0])
    best = args[0]
    for x in args[1:]:
        wins = second_wins(best, x)
        if wins is None:
            raise _Undecided()
        best = x if wins else best
    return best


_ARITH: dict[str, Callable[..., Any]] = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
    "//": operator.floordiv, "%": operator.mod, "max": _max, "min": _min,
    "eq": _decided(operator.eq, _equal),
    "ne": _decided(operator.ne, lambda a, b: _not(_equal(a, b))),
    "lt": _decided(operator.lt, lambda a, b: _not(at_most(b, a))),
    "le": _decided(operator.le, at_most),
    "gt": _decided(operator.gt, lambda a, b: _not(at_most(a, b))),
    "ge": _decided(operator.ge, lambda a, b: at_most(b, a)),
}

_TENSOR_FNS: dict[str, Callable[..., Any]] = {
    "dim": _dim,
    "rank": lambda env, t: env.tensor_type(t).rank,
    "shape": lambda env, t: env.tensor_type(t).shape,
    "dtype": lambda env, t: env.tensor_type(t).dtype,
    "weight": _is_weight,
    "all-equal": _all_equal,
    "close-to": _close_to,
    "nonzero": _nonzero,
    "positive": _positive,
    "causal": _is_causal,
    "unmasked-rows": _unmasked_rows,
    "value": _uniform_value,
}

FUNCTIONS = sorted(set(_ARITH) | set(_TENSOR_FNS) | {"and", "or", "not", "in", "identity-perm",
                                                     "compose", "len", "neg", "at", "permute",
                                                     "unit-reshape", "unit-perm", "range",
                                                     "with-dim", "swap-last", "exact-cast"})


def evaluate(e: Expr, env: Env[Any]) -> Any:
    if isinstance(e, Lit):
        return e.value
    if isinstance(e, AVar):
        if e.name in env.attrs:
            return env.attrs[e.name]
        raise RuleError(f"attribute variable ?{e.name} is not bound by the source")
    if isinstance(e, ListExpr):
        return tuple(evaluate(i, env) for i in e.items)
    if isinstance(e, OutRef):
        raise RuleError(f"${e.index} is a tensor; use it inside dim, rank or shape")
    assert isinstance(e, Call)
    fn = e.fn
    if fn in _TENSOR_FNS:
        return _TENSOR_FNS[fn](env, *e.args)
    if fn == "and":
        return all(evaluate(a, env) for a in e.args)
    if fn == "or":
        return any(evaluate(a, env) for a in e.args)
    args = [evaluate(a, env) for a in e.args]
    if fn in _ARITH:
        try:
            return _ARITH[fn](*args)
        except (TypeError, ZeroDivisionError):
            raise _NoValue() from None
    if fn == "not":
        return not args[0]
    if fn == "in":
        answers = [_ARITH["eq"](args[0], x) for x in args[1:]]
        return any(answers)
    if fn == "identity-perm":
        return tuple(args[0]) == tuple(range(len(args[0])))
    if fn == "compose":
        return _compose(tuple(args[0]), tuple(args[1]))
    if fn == "len":
        return len(args[0])
    if fn == "permute":
        try:
            return tuple(args[0][i] for i in args[1])
        except (IndexError, TypeError):
            raise _NoValue() from None
    if fn == "unit-reshape":
        return _unit_reshape(args[0], args[1])
    if fn == "unit-perm":
        return _unit_perm(args[0], args[1], args[2])
    if fn == "neg":
        return -args[0]
    if fn == "at":
        try:
            return args[0][args[1]]
        except (IndexError, TypeError):
            raise _NoValue() from None
    if fn == "range":
        return tuple(range(*args))
    if fn == "swap-last":
        n = args[0]
        return tuple(range(n - 2)) + (n - 1, n - 2) if n >= 2 else tuple(range(n))
    if fn == "with-dim":
        return _with_dim(tuple(args[0]), args[1], args[2])
    if fn == "exact-cast":
        return exact_cast(str(args[0]), str(args[1]))
    raise RuleError(f"unknown function {fn!r} in a rule; known: {', '.join(FUNCTIONS)}")


#: For each type, the types that hold every one of its values exactly (a cast there and
#: back returns the value, and casting on from there equals casting directly).
_EXACT_CASTS = {
    "bool": {"int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
             "float16", "bfloat16", "float32", "float64"},
    "int8": {"int16", "int32", "int64", "float16", "float32", "float64"},
    "uint8": {"int16", "uint16", "int32", "uint32", "int64", "uint64", "float16", "float32",
              "float64"},
    "int16": {"int32", "int64", "float32", "float64"},
    "uint16": {"int32", "uint32", "int64", "uint64", "float32", "float64"},
    "int32": {"int64", "float64"},
    "uint32": {"int64", "uint64", "float64"},
    "float16": {"float32", "float64"},
    "bfloat16": {"float32", "float64"},
    "float32": {"float64"},
}


def exact_cast(source: str, target: str) -> bool:
    """Whether every value of type `source` is exactly a value of type `target`."""
    return source == target or target in _EXACT_CASTS.get(source, ())


#: Shape conditions this process found undecided over size symbols (a search reports how
#: many of them its own matching met).
_undecided = 0


def undecided_conditions() -> int:
    """How many shape conditions were undecided in this process so far."""
    return _undecided


def try_evaluate(e: Expr, env: Env[Any]) -> tuple[bool, Any]:
    """(True, value), or (False, None) when the expression has no value for this match."""
    global _undecided
    try:
        return True, evaluate(e, env)
    except _Undecided:
        _undecided += 1
        return False, None
    except (_NoValue, WeightDataUnavailable):  # values a split's worker does not have
        return False, None
