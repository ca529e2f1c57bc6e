"""Chains of an associative, commutative operator (sums, products), so that one pattern
matches every association, order and constant form of the same expression.

A GELU is written `x * 0.5 * (1 + erf(x / sqrt 2))` by one exporter, `(x * (erf(x * 0.7071) +
1)) * 0.5` by another and `0.5 * x * (...)` by TensorFlow: one tree each, the same product of
three factors. A pattern whose product (or sum) nests another of the same operator is read
as its chain of operands (`pattern_chain`); in a graph the same chain is read through any
association (`frontiers`), and its operands are matched to the pattern's in any order
(graphsub.rules.matcher). A product also reads a division by a float constant as the
product with its reciprocal, and a square or cube as the product of its base (`x / 1.4142`
is `x * 0.7071`, `pow(x, 3)` is `x * x * x`): a pattern's constant is then compared by
value (`close-to`), whichever way the graph wrote it. Floating point makes these equal to
within rounding, as every rewrite that reorders arithmetic is, and each rewrite is verified
on the model like any other.

An e-graph (graphsub.egraph.ematch) reads a pattern's chain through any association and order
too, from the e-nodes that compute each class; a product's other forms (divisions by a
constant, scalar multiplications, powers) only a graph reads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import wraps
from typing import Any, TypeGuard, TypeVar, final

import numpy as np

from graphsub.ir.graph import Graph, Value
from graphsub.ops import get_op
from graphsub.rules.ast import OpTerm, Term, Var
from graphsub.tensors.types import Constant

#: The most operands a chain is read with: a GELU's longest is 4 (0.044715 * x * x * x).
MAX_CHAIN = 6

#: The other operators a product is read through (see `graph_chain_views`).
PRODUCT_VIEWS = ("smul", "div", "pow")


@final
@dataclass(frozen=True)
class Reciprocal:
    """A handle for 1 / c, c a float constant of the graph that a division divides by: what
    a product's chain reads as its operand. A rule's target that uses it gets a new weight."""

    divisor: Value
    value: Constant = field(compare=False, hash=False)


T = TypeVar("T")
R = TypeVar("R")


def by_identity(fn: Callable[[T], R]) -> Callable[[T], R]:
    """`fn` of a rule or term computed once per object. Rules and terms are frozen
    dataclasses whose hash walks the whole tree: an lru_cache keyed on them costs as much as
    what it saves in the matcher's inner loop. The object is kept alive with its value, so
    that its id is not reused."""
    cache: dict[int, tuple[T, R]] = {}

    @wraps(fn)
    def cached(obj: T) -> R:
        hit = cache.get(id(obj))
        if hit is not None and hit[0] is obj:
            return hit[1]
        value = fn(obj)
        cache[id(obj)] = (obj, value)
        return value

    return cached


def _chainable(term: Term, op: str) -> TypeGuard[OpTerm]:
    return isinstance(term, OpTerm) and term.op == op and not term.attrs and term.index == 0


@by_identity
def pattern_chain(term: OpTerm) -> tuple[Term, ...] | None:
    """The operands of the chain a pattern term heads, where it nests its own associative
    operator (`(mul (mul ?x ?h) (erf ?y))`: ?x, ?h, (erf ?y)); None for any other term, which
    matches as written (a binary commutative op in either order), and for a chain of distinct
    variables alone, which says something about association itself."""
    if not _chainable(term, term.op) or not get_op(term.op).associative:
        return None
    operands: list[Term] = []

    def flatten(t: Term) -> None:
        if _chainable(t, term.op):
            for arg in t.args:
                flatten(arg)
        else:
            operands.append(t)

    flatten(term)
    if not 2 < len(operands) <= MAX_CHAIN:
        return None
    names = [t.name for t in operands if isinstance(t, Var)]
    if len(names) == len(operands) == len(set(names)):
        return None  # distinct free operands: a rule about association itself (mul-assoc)
    return tuple(operands)


def has_chain(term: Term) -> bool:
    """Whether a pattern reads a chain somewhere in it (`pattern_chain`)."""
    return isinstance(term, OpTerm) and (pattern_chain(term) is not None
                                         or any(has_chain(a) for a in term.args))


def _float_constant(graph: Graph, value: Value) -> Constant | None:
    node = graph[value.node]
    if node.op != "weight":
        return None
    constant: Constant = node.attrs["value"]
    return constant if constant.type.dtype.startswith(("float", "bfloat")) else None


def graph_chain_views(graph: Graph, op: str, value: Value) -> list[tuple[int, tuple[Any, ...]]]:
    """The ways `value` is computed as `op` of operands, as (node id, operands): its node when
    it is one; for a product, also a scalar multiplication, a division by a float constant
    with no zero (the dividend times a Reciprocal) and a float raised to a constant 2 or 3
    (its base, two or three times)."""
    node = graph[value.node]
    if value.index != 0:
        return []
    if node.op == op or (op == "mul" and node.op == "smul"):
        return [(value.node, node.inputs)]
    if op != "mul" or not node.inputs or not graph.type_of(value).dtype.startswith(
            ("float", "bfloat")):
        return []
    if node.op == "div":
        divisor = _float_constant(graph, node.inputs[1])
        if divisor is None or not np.all(divisor.array != 0):
            return []
        inverse = Constant((1.0 / divisor.array.astype(np.float64)).astype(divisor.array.dtype))
        return [(value.node, (node.inputs[0], Reciprocal(node.inputs[1], inverse)))]
    if node.op == "pow":
        exponent = graph[node.inputs[1].node]
        power = exponent.attrs["value"].uniform() if exponent.op == "weight" else None
        if power in (2.0, 3.0) and graph.type_of(value).shape == graph.type_of(
                node.inputs[0]).shape:
            return [(value.node, (node.inputs[0],) * int(power))]
    return []


def frontiers(views: Any, op: str, handle: Any, k: int
              ) -> Iterator[tuple[tuple[Any, ...], frozenset[int]]]:
    """Every way to read `handle` as a chain of `k` operands of `op`, through any association:
    (the operands in order, the ids of the nodes read). `views(op, handle)` gives the ways a
    handle is computed as `op` (GraphHost.chain_views)."""
    if k == 1:
        yield (handle,), frozenset()
        return
    for nid, operands in views(op, handle):
        if len(operands) <= k:
            for leaves, nodes in _spread(views, op, operands, k):
                yield leaves, nodes | {nid}


def _spread(views: Any, op: str, operands: Sequence[Any], k: int
            ) -> Iterator[tuple[tuple[Any, ...], frozenset[int]]]:
    """`k` chain operands spread over `operands`, each read as a chain of one or more."""
    first, rest = operands[0], operands[1:]
    if not rest:
        yield from frontiers(views, op, first, k)
        return
    for j in range(1, k - len(rest) + 1):
        for head, head_nodes in frontiers(views, op, first, j):
            for tail, tail_nodes in _spread(views, op, rest, k - j):
                yield head + tail, head_nodes | tail_nodes
