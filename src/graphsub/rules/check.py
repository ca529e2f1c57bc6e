"""Numerical check of rules on concrete examples.

For each rule, graphsub builds small example graphs that are instances of the source (shapes
chosen from the role each variable plays, attributes drawn from typical values), matches the
rule on them with the real matcher, applies it with the real applier, and compares both graphs'
outputs on random inputs. A rule passes when at least one example exists and every example
agrees within the tolerance; a rule for which no example can be built fails too, since it
cannot have been tested.

The shapes cover every rank an operator accepts and broadcasting, not only the common case:
matmul associativity holds for matrices and batches of them but not when the middle operand
is a vector (numpy's matmul turns a 1-D operand into a row or a column depending on its side),
and the types of both sides agree, so only an example of that shape tells the rule is wrong.
So the checker draws examples for every combination of operand ranks the roles accept
(where there are not too many), and then random ones.

What to draw is the operators' knowledge, in their definitions: the shapes each input's role
takes and whether it must be positive (`OpDef.roles`), and the values to try for attributes a
rule leaves open (`AttrSpec.tries`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import os
from functools import lru_cache
from pathlib import Path
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable

import numpy as np

from graphsub.cache import cache_dir
from graphsub.errors import GraphsubError
from graphsub.ir.builder import GraphBuilder
from graphsub.ir.graph import Graph, Value
from graphsub.ops import get_op
from graphsub.ops.base import ANY_SHAPES, OperandRole, Shape
from graphsub.rules.applier import TYPES_DIFFER, BuildingHost, Rejection, apply_match
from graphsub.rules.ast import (AVar, Call, Expr, ListExpr, Lit, OpTerm, Rule, Term, Var,
                                term_vars)
from graphsub.rules.expr import Env, try_evaluate
from graphsub.rules.matcher import SAME_SHAPES, find_matches
from graphsub.rules.parser import print_rule
from graphsub.verdicts.equivalence import diff_arrays
from graphsub.runtime.reference import evaluate


class RuleCheckError(GraphsubError):
    """A rule's two sides disagree numerically, or it cannot be tested."""


#: Rules whose variables' ranks combine in more ways than this are checked by random draws.
MAX_RANK_PLANS = 256
#: Draws per combination of ranks, until one fits the source.
PLAN_ATTEMPTS = 6
#: Draws more for a combination of ranks where the source matched but the target never
#: built: the instances where it builds are the coincidences of sizes a wrong target needs.
UNBUILT_ATTEMPTS = 400


def _roles(rule: Rule) -> dict[str, tuple[str, int]]:
    """The (op, argument position) where each variable first appears in the source."""
    roles: dict[str, tuple[str, int]] = {}

    def walk(t: Term) -> None:
        if isinstance(t, OpTerm):
            for i, a in enumerate(t.args):
                if isinstance(a, Var):
                    roles.setdefault(a.name, (t.op, i))
                walk(a)

    for s in rule.sources:
        walk(s)
    return roles


def _condition_vars(rule: Rule, fn: str) -> dict[str, Expr | None]:
    """Variables that conditions such as (weight ?w) or (all-equal ?w 1) constrain, or that
    the target's attributes read with `fn` (a (value ?s) there needs ?s to be a weight)."""
    found: dict[str, Expr | None] = {}

    def walk(e: Expr) -> None:
        if isinstance(e, Call):
            if e.fn == fn and e.args and isinstance(e.args[0], AVar):
                found[e.args[0].name] = e.args[1] if len(e.args) > 1 else None
            for a in e.args:
                walk(a)

    def walk_term(t: Term) -> None:
        if isinstance(t, OpTerm):
            for _, e in t.attrs:
                walk(e)
            for a in t.args:
                walk_term(a)

    for c in rule.conditions:
        walk(c)
    for t in (*rule.targets, *(term for _, term in rule.lets)):
        walk_term(t)
    return found


def _positive_vars(rule: Rule) -> set[str]:
    """Variables anywhere inside the operand of a square root, a logarithm, a reciprocal or a
    divisor in the source: drawn positive, so that sqrt(var + eps) is defined (the role of a
    variable is only where it first appears, an add inside the sqrt)."""
    found: set[str] = set()

    def walk(t: Term, positive: bool) -> None:
        if isinstance(t, Var):
            if positive:
                found.add(t.name)
        elif isinstance(t, OpTerm):
            for i, a in enumerate(t.args):
                walk(a, positive or _role((t.op, i)).positive)

    for source in rule.sources:
        walk(source, False)
    return found


def _expr_vars(e: Expr) -> set[str]:
    if isinstance(e, AVar):
        return {e.name}
    if isinstance(e, Call):
        return set().union(*(_expr_vars(a) for a in e.args))
    if isinstance(e, ListExpr):
        return set().union(*(_expr_vars(a) for a in e.items))
    return set()


def _shape_conditions(rule: Rule) -> dict[str, tuple[Expr, ...]]:
    """Variables whose shape a condition (eq (shape ?v) E) or (in (shape ?v) E1 E2 ...) fixes,
    with the shapes it allows: drawing ?v with one of them makes examples of rules that relate
    several operands' shapes (a batch norm's per-channel vectors, a bias of one value per
    channel) likely, where random draws almost never fit."""
    found: dict[str, tuple[Expr, ...]] = {}
    for c in rule.conditions:
        if isinstance(c, Call) and c.fn in ("eq", "in") and len(c.args) >= 2:
            lhs, *options = c.args
            if (isinstance(lhs, Call) and lhs.fn == "shape" and len(lhs.args) == 1
                    and isinstance(lhs.args[0], AVar)
                    and not any(lhs.args[0].name in _expr_vars(o) for o in options)):
                found.setdefault(lhs.args[0].name, tuple(options))
    return found


def _dtype_conditions(rule: Rule) -> dict[str, str]:
    """Variables whose element type a condition (eq (dtype ?v) T) fixes, with T: drawn in
    that type (a rule about half-precision models has no float32 example)."""
    found: dict[str, str] = {}
    for c in rule.conditions:
        if isinstance(c, Call) and c.fn == "eq" and len(c.args) == 2:
            lhs, rhs = c.args
            if (isinstance(lhs, Call) and lhs.fn == "dtype" and len(lhs.args) == 1
                    and isinstance(lhs.args[0], AVar) and isinstance(rhs, Lit)
                    and isinstance(rhs.value, str)):
                found.setdefault(lhs.args[0].name, rhs.value)
    return found


@dataclass
class _Example:
    graph: Graph
    feeds: dict[str, np.ndarray]


def _default_attr(op: str, key: str, in_shapes: list[Shape], attrs: dict[str, Any],
                  rng: np.random.Generator) -> Any:
    """A value for an attribute the source leaves open: one of the operator's tries for it
    (`AttrSpec.tries`), drawn where there are several; None leaves it at its default."""
    spec = get_op(op).attr_spec(key)
    values = spec.tried(in_shapes, attrs) if spec is not None else ()
    if len(values) > 1:
        return values[rng.integers(len(values))]
    return values[0] if values else None


def _domain_edges(data: np.ndarray, rng: np.random.Generator, zero: bool = True) -> np.ndarray:
    """Values at the edges of a divisor's, a root's or a logarithm's domain, each element at
    random: zero, negative, tiny, huge, or an ordinary positive value. There IEEE arithmetic
    gives infinities and NaNs, and a rule right only away from them (x*y/y = x) differs:
    a NaN against a number is a difference, whatever the tolerance. A rule meant for positive
    values says so in a condition."""
    kind = rng.integers(5, size=data.shape)
    magnitude = np.abs(data) + np.float32(0.5)
    edges = np.choose(kind, [magnitude, np.zeros_like(data) if zero else magnitude, -magnitude,
                             magnitude * np.float32(1e-4), magnitude * np.float32(1e4)])
    return np.asarray(edges, dtype=np.float32)


def _fully_masked_row(data: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A mask with one row along the last axis all -inf: the one place models carry an
    infinity on purpose, and where softmax gives 0/0 (NaN) and a guarded softmax or a fused
    attention zeros. Everywhere else the values drawn are finite: the verdicts hold for finite
    inputs (docs/rules.md)."""
    out = np.array(data, dtype=np.float32, copy=True)
    out[tuple(int(rng.integers(n)) for n in out.shape[:-1])] = -np.inf  # a scalar: all of it
    return out


def _mask_vars(rule: Rule) -> set[str]:
    """Variables in a mask's place in the source: an operand of a sum (or scaling) that a
    softmax reads, and a fused attention's mask."""
    found: set[str] = set()

    def scores(t: Term) -> None:
        if isinstance(t, Var):
            found.add(t.name)
        elif isinstance(t, OpTerm) and t.op in ("add", "sub", "mul", "smul"):
            for a in t.args:
                scores(a)

    def walk(t: Term) -> None:
        if isinstance(t, OpTerm):
            if t.op in ("softmax", "guarded_softmax") and t.args:
                scores(t.args[0])
            if t.op == "attention" and len(t.args) > 3:
                scores(t.args[3])
            for a in t.args:
                walk(a)

    for source in rule.sources:
        walk(source)
    return found


def _role(role: tuple[str, int]) -> OperandRole:
    """The operator's role for the input at a position (`OperandRole()` for a variable that is a
    whole source, which no operator reads)."""
    op, position = role
    return get_op(op).role(position) if op else OperandRole()


def _role_shapes(role: tuple[str, int]) -> tuple[Shape, ...]:
    return _role(role).shapes


#: The integer types generic operands are drawn in, one per integer example: small signed
#: values (truncating division, negative quotients), and unsigned and signed bytes over their
#: whole range (wrapping sums and products).
INTEGER_TYPES = ("int32", "uint8", "int8")


def _integer_values(dtype: str, shape: Shape, rng: np.random.Generator, *, divisor: bool,
                    small: bool) -> np.ndarray:
    """Integers of a generic operand drawn in an integer type: over the type's whole range
    (sums and products wrap) but for int32, small there (what truncating division shows);
    a divisor is never zero (integer division by zero is undefined in ONNX, and a crash in
    onnxruntime, not a value), `small` (a scale an attribute takes) one to four."""
    if small:
        return rng.integers(1, 5, shape).astype(dtype)
    info = np.iinfo(dtype)
    low, high = (-9, 9) if dtype == "int32" else (int(info.min), int(info.max))
    data = rng.integers(low, high + 1, shape)
    if divisor:
        data = np.where(data == 0, 1, data)
    return np.asarray(data).astype(dtype)


def _build_example(rule: Rule, rng: np.random.Generator, ranks: dict[str, int] | None = None,
                   square: bool = False, edges: bool | None = None, odd: bool = False,
                   distinct: bool = False, grouped: bool = False,
                   integer: str | None = None) -> _Example | None:
    """A random instance of the rule's source (None when the draw does not fit it); with
    `ranks`, each variable named there gets a shape of that rank; with `square`, one whose
    last two sizes are 4 where its role allows one, the draw that fits the most sources
    (a vector in a product of square matrices: where matmul's associativity fails); with
    `odd`, one with an odd size above 1 (a slice off by one, a batch of more than one, sizes
    all different: what rules right only for even or equal sizes miss); with `distinct`, most
    variables a shape no other has (two convolutions' kernels with different numbers of
    outputs over one image: what a rule right only for equal operands misses); with
    `grouped`, each convolution's kernel one of 1, 2 or 4 groups over its image (what the
    axioms, which describe ungrouped convolution, cannot see); with `integer`, the operands
    no role or condition types are drawn in that integer type (a rule right in the reals but
    not with truncating division or wrapping sums; None where the source takes no integers);
    `edges` draws divisors and the operands of roots and logarithms at their domains' edges (None:
    at random)."""
    roles = _roles(rule)
    images = conv_images(rule)
    # A variable whose (value ?t) a rule reads is a weight of one value: drawn as a positive
    # scalar (an epsilon or a scale, the constants such rules carry into attributes).
    scalars = _condition_vars(rule, "value")
    nonzero, positive_weights = _condition_vars(rule, "nonzero"), _condition_vars(rule, "positive")
    weights = {**_condition_vars(rule, "weight"), **scalars, **nonzero, **positive_weights}
    constants = {**_condition_vars(rule, "all-equal"), **_condition_vars(rule, "close-to")}
    causal = _condition_vars(rule, "causal")
    unmasked = _condition_vars(rule, "unmasked-rows")
    shaped = _shape_conditions(rule)
    typed = _dtype_conditions(rule)
    positive = _positive_vars(rule)
    masks = _mask_vars(rule)
    b = GraphBuilder(seed=int(rng.integers(1 << 30)))
    feeds: dict[str, np.ndarray] = {}
    values: dict[str, Value] = {}
    attr_vars: dict[str, Any] = {}

    def var_value(name: str) -> Value:
        if name in values:
            return values[name]
        role = roles.get(name, ("", 0))
        choices: tuple[Shape, ...] | list[Shape] = _role_shapes(role)
        if name in shaped:  # (eq (shape ?name) E): E's value, once what it reads is drawn
            allowed = []
            for option in shaped[name]:
                try:
                    has_value, shape = try_evaluate(option,
                                                    Env(BuildingHost(b), values, attr_vars))
                except GraphsubError:  # E reads a variable not drawn yet
                    has_value = False
                if has_value:
                    allowed.append(tuple(shape))
            if allowed:
                choices = allowed
        if ranks is not None and name in ranks:
            choices = [c for c in choices if len(c) == ranks[name]]
        if square:
            choices = [c for c in choices if all(d == 4 for d in c[-2:])] or choices
        elif odd:
            choices = [c for c in choices if any(d % 2 and d > 1 for d in c)] or choices
        if name in scalars:
            choices = [()]
        elif name in causal:  # a mask over square scores, what square draws make, and else
            # also one of a single zero, which is causal and masks nothing
            choices = [(4, 4)] if square else [(4, 4), (1, 1)]
        used = [b.shape(v) for v in values.values() if b.shape(v) in choices]
        if grouped and name in images and images[name] in values:
            channels = b.shape(values[images[name]])[1]
            kernels = [b.shape(values[k]) for k in images if k in values]
            outs, sizes = ((4, 8), (1, 3)) if not kernels or rng.random() < 0.3 else \
                ((kernels[0][0],), (kernels[0][2],))  # merges need equal outputs or sizes
            choices = [(out, channels // g, k, k) for g in (1, 2, 4) if channels % g == 0
                       for out in outs if out % g == 0 for k in sizes]
        elif used and rng.random() < (0.3 if distinct else 0.6):
            choices = used  # rules often need equal shapes: reuse one already drawn
        else:  # or one no other variable has
            choices = [c for c in choices if c not in used] or choices
        if not choices:
            raise GraphsubError("no shape its conditions allow has the rank planned")
        shape = choices[rng.integers(len(choices))]
        dtype = _role(role).dtype
        if integer is not None and dtype == "float32" and name not in typed:
            if name in causal or name in unmasked or name in masks:
                raise GraphsubError("a mask holds -inf, which no integer type has")
            data = _integer_values(integer, shape, rng, small=name in scalars,
                                   divisor=name in positive or name in nonzero
                                   or name in positive_weights)
            if name in positive_weights and np.issubdtype(data.dtype, np.signedinteger):
                data = np.abs(data).astype(data.dtype)
            dtype = integer
        elif dtype != "float32":  # quantized values: integers over the type's whole range
            info = np.iinfo(dtype)
            data = rng.integers(info.min, int(info.max) + 1, shape).astype(dtype)
        else:
            data = rng.standard_normal(shape).astype(np.float32)
        if dtype == "float32" and name in scalars:
            data = np.abs(data) + np.float32(0.5)  # an epsilon or a scale an attribute takes
        elif dtype == "float32" and name in positive_weights:  # (positive ?name)
            data = np.abs(_domain_edges(data, rng, zero=False))
        elif dtype == "float32" and name in nonzero:  # (nonzero ?name)
            data = _domain_edges(data, rng, zero=False)
        elif dtype == "float32" and name in positive:  # a divisor, a root's or a log's operand
            at_edges = rng.random() < 0.5 if edges is None else edges
            data = _domain_edges(data, rng) if at_edges else np.abs(data) + np.float32(0.5)
        elif dtype == "float32" and edges and name in masks:  # a mask's place: -inf rows
            data = _fully_masked_row(data, rng)
        if dtype == "float32" and name in typed:
            data = data.astype(typed[name])
        if name in constants:
            fill = constants[name]
            value = fill.value if isinstance(fill, Lit) else 1.0
            if dtype != "float32":  # a constant of an integer example: one the type holds
                info = np.iinfo(dtype)
                if not (isinstance(value, (int, float)) and float(value).is_integer()
                        and info.min <= value <= info.max):
                    raise GraphsubError(f"{dtype} does not hold the constant {value}")
            data = np.full(shape, value, dtype if dtype != "float32" else np.float32)
            values[name] = b.weight(data, name=name)
        elif name in causal and len(shape) >= 2:
            # each form a causal mask takes: additive, boolean, or built from positions
            form = rng.integers(3)
            if form == 2:
                values[name] = b.causal_mask(shape=shape, dtype="bool")
            else:
                keep = np.broadcast_to(np.tril(np.ones(shape[-2:], dtype=bool)), shape)
                data = keep if form == 1 else np.where(keep, 0.0, -np.inf).astype(np.float32)
                values[name] = b.weight(data, name=name)
        elif name in unmasked:  # -inf in about half the places, one score left in every row
            keep = rng.random(shape) < 0.5
            if len(shape):
                first = rng.integers(shape[-1], size=shape[:-1])
                np.put_along_axis(keep, first[..., None], True, axis=-1)
            data = np.where(keep, data, -np.inf).astype(np.float32)
            values[name] = b.weight(data, name=name)
        elif name in weights:
            values[name] = b.weight(data, name=name)
        else:
            values[name] = b.input(name, shape, str(data.dtype))
            feeds[name] = data
        return values[name]

    def build(t: Term) -> Value:
        if isinstance(t, Var):
            return var_value(t.name)
        assert isinstance(t, OpTerm)
        args = [build(a) for a in t.args]
        in_shapes = [b.shape(a) for a in args]
        attrs: dict[str, Any] = {}
        for key, e in t.attrs:
            if key == SAME_SHAPES:
                continue
            if isinstance(e, Lit):
                attrs[key] = e.value
            elif isinstance(e, AVar):
                if e.name not in attr_vars:
                    attr_vars[e.name] = _default_attr(t.op, key, in_shapes, attrs, rng)
                attrs[key] = attr_vars[e.name]
            else:  # a computed expression such as [1 1] or [(dim ?b 1) (dim ?c 1)]
                env = Env(BuildingHost(b), values, attr_vars)
                has_value, attrs[key] = try_evaluate(e, env)
                if not has_value:
                    raise GraphsubError("the draw gives the expression no value")
        if any(k == SAME_SHAPES for k, _ in t.attrs) and len(set(in_shapes)) > 1:
            raise GraphsubError("example does not have equal input shapes")
        # An attribute the pattern leaves unwritten stays at its default: it matches only that
        # (rules.matcher), so an instance with any other value would not be one of the rule.
        attrs = {k: v for k, v in attrs.items() if v is not None}
        out: Value | tuple[Value, ...] = b.op(t.op, *args, **attrs)
        return out[t.index] if isinstance(out, tuple) and not isinstance(out, Value) else out

    try:
        roots = [build(s) for s in rule.sources]
        for i, r in enumerate(roots):
            b.output(r, f"out{i}")
        return _Example(b.build(), feeds)
    except (GraphsubError, AttributeError, KeyError, IndexError):
        return None  # this draw of shapes and attributes does not fit the source: try another


def rewritten_example(rule: Rule, rng: np.random.Generator, ranks: dict[str, int] | None = None,
                      square: bool = False, edges: bool | None = None, odd: bool = False,
                      distinct: bool = False, grouped: bool = False, integer: str | None = None,
                      unbuilt: list[str] | None = None) -> tuple[_Example, Graph] | None:
    """A random instance of the rule's source (as _build_example draws it) and the graph the
    rule rewrites it into, matched at the whole source; None when the draw does not fit
    (where the source matched but its target could not be built, the reason is added to
    `unbuilt`)."""
    ex = _build_example(rule, rng, ranks, square, edges, odd, distinct, grouped, integer)
    if ex is None:
        return None
    matches = [m for m in find_matches(ex.graph, rule)
               if set(m.roots) == set(ex.graph.outputs)]
    if not matches:
        return None
    after = apply_match(ex.graph, matches[0])
    if isinstance(after, Rejection) and after.reason == TYPES_DIFFER:
        raise RuleCheckError(f"rule {rule.name} ({rule.origin}) is wrong: its target's type "
                             f"differs from its source's on\n{ex.graph.format()}")
    if isinstance(after, Rejection):
        if unbuilt is not None:
            unbuilt.append(after.reason)
        return None
    return ex, after


@dataclass(frozen=True)
class RuleCheck:
    rule: str
    examples: int
    max_rel: float
    #: The operand ranks the examples covered: one tuple of (variable, rank) per combination.
    ranks: tuple[tuple[tuple[str, int], ...], ...] = ()


def _ranks(example: _Example, rule: Rule) -> tuple[tuple[str, int], ...]:
    """The rank of every source variable in an example (its input or weight carries the
    variable's name)."""
    graph = example.graph
    named = {graph[n].name: graph[n].type.rank for n in graph.nodes_by_op("weight")}
    named.update((name, graph[n].type.rank) for n, name in zip(graph.inputs, graph.input_names))
    return tuple(sorted((v, named[v]) for v in rule.source_vars if v in named))


def conv_images(rule: Rule) -> dict[str, str]:
    """Each source convolution's kernel variable and its image's (for grouped draws)."""
    found: dict[str, str] = {}

    def walk(t: Term) -> None:
        if isinstance(t, OpTerm):
            if t.op == "conv2d" and len(t.args) >= 2 and isinstance(t.args[0], Var) \
                    and isinstance(t.args[1], Var):
                found.setdefault(t.args[1].name, t.args[0].name)
            for a in t.args:
                walk(a)

    for source in rule.sources:
        walk(source)
    return found


def _bound_attributes(rule: Rule) -> set[str]:
    """The attribute variables the rule's source binds (`:dilation ?d`)."""
    found: set[str] = set()

    def walk(t: Term) -> None:
        if isinstance(t, OpTerm):
            found.update(e.name for _, e in t.attrs if isinstance(e, AVar))
            for a in t.args:
                walk(a)

    for source in rule.sources:
        walk(source)
    return found


def _rank_plans(rule: Rule, rng: np.random.Generator) -> list[dict[str, int] | None]:
    """What to draw examples for: every combination of the ranks the source variables' roles
    accept (in random order), when there are at most MAX_RANK_PLANS of them; otherwise
    unconstrained draws. None in a plan: no constraint."""
    roles = _roles(rule)
    names = sorted(rule.source_vars & set(roles))
    if math.prod(len({len(s) for s in _role_shapes(roles[n])}) for n in names) > MAX_RANK_PLANS:
        # Too many: plan the ranks of operands with roles of their own (matmul's), and leave
        # the others (element-wise operands) to the draw.
        names = [n for n in names if _role_shapes(roles[n]) != ANY_SHAPES]
    options = [sorted({len(s) for s in _role_shapes(roles[n])}) for n in names]
    if not names or math.prod(len(o) for o in options) > MAX_RANK_PLANS:
        return [None]
    plans: list[dict[str, int] | None] = [dict(zip(names, combo))
                                          for combo in itertools.product(*options)]
    rng.shuffle(plans)
    return plans


def rule_seed(rule: Rule) -> int:
    """The checks' random seed for a rule: fixed by its text, so that a verdict is the same on
    every run, yet different for every rule (one seed for all would let a rule be written
    against the draws it gets)."""
    text = print_rule(dataclasses.replace(rule, name="r", doc=""))  # two names, one rule
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little")


def check_rule(rule: Rule, examples: int = 3, attempts: int = 1000, rtol: float = 1e-4,
               seed: int | None = None) -> RuleCheck:
    """Check a rule numerically; raises RuleCheckError when it is wrong or untestable. Every
    combination of operand ranks gets a square draw, one of odd sizes and one of distinct
    shapes, then, where none fits, up to PLAN_ATTEMPTS random ones (most combinations do not fit the source, and fail
    fast); then unconstrained draws, every other of odd sizes, until `examples` examples have
    been tested or `attempts` draws made. Every other example draws divisors at their
    domains' edges."""
    unbound = sorted(set().union(*(term_vars(t) for t in rule.targets),
                                 *(term_vars(t) for _, t in rule.lets)) - rule.source_vars)
    if unbound:
        raise RuleCheckError(f"rule {rule.name} ({rule.origin}): its target uses "
                             f"{', '.join('?' + v for v in unbound)}, which the source does not bind")
    rng = np.random.default_rng(rule_seed(rule) if seed is None else seed)
    images = conv_images(rule)
    # each attribute a rule binds multiplies the cases a wrong rule may hide in (explicit
    # pads with count_include_pad off, one of twenty-four): more examples where there are more
    examples = min(max(examples, 6 + 3 * len(_bound_attributes(rule))), 18)
    done, worst = 0, 0.0
    covered: set[tuple[tuple[str, int], ...]] = set()

    unbuilt: list[str] = []

    def try_example(ranks: dict[str, int] | None, square: bool = False, odd: bool = False,
                    distinct: bool = False, grouped: bool = False,
                    integer: str | None = None) -> bool:
        nonlocal done, worst
        # every other example at the domains' edges: the others keep ordinary magnitudes,
        # whose differences the tolerance (scaled by the largest output) still sees
        drawn = rewritten_example(rule, rng, ranks, square, edges=done % 2 == 1, odd=odd,
                                  distinct=distinct, grouped=grouped, integer=integer,
                                  unbuilt=unbuilt)
        if drawn is None:
            return False
        ex, after = drawn
        with np.errstate(all="ignore"):  # infinities and NaNs at a domain's edges, on purpose
            before_out = evaluate(ex.graph, ex.feeds)
            after_out = evaluate(after, ex.feeds)
        for name in before_out:
            expected, got = before_out[name], after_out[name]
            if expected.shape != got.shape or expected.dtype != got.dtype:
                raise RuleCheckError(
                    f"rule {rule.name} ({rule.origin}) is wrong: its two sides differ in shape "
                    f"or type on output {name}: {expected.dtype}{list(expected.shape)} before, "
                    f"{got.dtype}{list(got.shape)} after\n  example source graph:\n"
                    f"{ex.graph.format()}")
            finite = np.abs(expected[np.isfinite(expected)]) if expected.size else expected
            scale = float(finite.max()) if finite.size else 0.0
            if expected.dtype.kind == "f":
                # Where both sides are infinite or NaN (a division by zero on each), IEEE's
                # choice between the two is not the rewrite's business; a NaN or an infinity
                # against a number is a difference.
                undefined = ~np.isfinite(expected) & ~np.isfinite(got)
                got = np.where(undefined, expected, got)
            # integers are exact: a quotient one off is a different answer
            exact = expected.dtype.kind in "iub"
            d = diff_arrays(name, expected, got, 0.0 if exact else rtol,
                            0.0 if exact else max(rtol * scale, 1e-6))
            worst = max(worst, d.max_abs / max(scale, 1e-6))
            if not d.ok:
                raise RuleCheckError(
                    f"rule {rule.name} ({rule.origin}) is wrong: its two sides differ on random "
                    f"inputs: {d.describe()}\n  example source graph:\n{ex.graph.format()}")
        covered.add(_ranks(ex, rule))
        done += 1
        return True

    for plan in _rank_plans(rule, rng):
        if plan is not None:
            unbuilt.clear()
            fitted = [try_example(plan, square=True),
                      any(try_example(plan, odd=True) for _ in range(PLAN_ATTEMPTS)),
                      sum(try_example(plan, distinct=True)
                          for _ in range(3 * PLAN_ATTEMPTS)) > 0,
                      bool(images) and sum(try_example(plan, grouped=True)
                                           for _ in range(40 * PLAN_ATTEMPTS)) > 0]
            if not any(fitted) and not any(try_example(plan) for _ in range(PLAN_ATTEMPTS)) \
                    and unbuilt:
                # The source matched and the target could not be built: at these ranks the
                # target builds at sizes that coincide (a split's sizes summing to an axis
                # they were not meant for), where it may be wrong. Look for them.
                any(try_example(plan) for _ in range(UNBUILT_ATTEMPTS))
    for integer in INTEGER_TYPES:  # where the source takes integers: one example in each type
        any(try_example(None, odd=True, integer=integer) for _ in range(PLAN_ATTEMPTS))
    for attempt in range(attempts):
        if done >= examples:
            break
        try_example(None, odd=attempt % 2 == 1)
    if done == 0:
        raise RuleCheckError(f"rule {rule.name} ({rule.origin}) could not be tested: no example "
                             f"graph of its source could be built and rewritten in {attempts} "
                             "attempts (check its shapes and conditions)")
    return RuleCheck(rule.name, done, worst, tuple(sorted(covered)))


#: How a rule is decided when it is loaded: raises RuleCheckError where it must not load. The
#: numerical check here; `graphsub.proofs.loading.verified` is `graphsub verify`'s decision,
#: which the layers above (`--rules`, the pipeline) load with.
Decision = Callable[[Rule], None]


def numerical_check(rule: Rule) -> None:
    """The numerical check alone (check_rule at the rule's own seed)."""
    check_rule(rule)


class CheckedRules:
    """The rules that passed a decision, kept across runs: deciding a rule file takes seconds,
    which every run would pay. A rule is known by its text, the decision's name and the
    source of everything that decides it (the checker, matcher, applier, the operators'
    semantics and the prover), so any change to either decides it again."""

    FILE = "checked_rules.json"

    def __init__(self, path: Path, keys: set[str], decide: Decision = numerical_check) -> None:
        self.path, self.keys, self._dirty, self.decide = path, keys, False, decide

    @classmethod
    def load(cls, decide: Decision = numerical_check) -> CheckedRules:
        path = cache_dir() / cls.FILE
        try:
            keys = set(json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            keys = set()  # no cache yet, or a damaged one: check again
        return cls(path, keys, decide)

    def key(self, rule: Rule) -> str:
        text = f"{_checker_fingerprint()}{self.decide.__module__}.{self.decide.__qualname__}"
        return hashlib.sha256((text + print_rule(rule)).encode()).hexdigest()

    def has(self, rule: Rule) -> bool:
        return self.key(rule) in self.keys

    def add(self, rule: Rule) -> None:
        self.keys.add(self.key(rule))
        self._dirty = True

    def check(self, rule: Rule) -> None:
        """The decision, unless the rule passed it before (raises RuleCheckError as it does)."""
        if not self.has(rule):
            self.decide(rule)
            self.add(rule)

    def __enter__(self) -> CheckedRules:
        return self

    def __exit__(self, *exc: object) -> None:
        self.save()

    def save(self) -> None:
        if not self._dirty:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(sorted(self.keys)))
            os.replace(tmp, self.path)
        except OSError:
            pass  # a read-only cache folder: the rules are checked again next time


@lru_cache(maxsize=1)
def _checker_fingerprint() -> str:
    package = Path(__file__).resolve().parents[1]
    sources = sorted([*package.joinpath("ops").glob("*.py"), package / "runtime" / "reference.py",
                      *package.joinpath("proofs").glob("*.py"),
                      *(package / "rules" / f"{m}.py" for m in ("check", "matcher", "applier",
                                                                 "expr", "ast", "parser"))])
    h = hashlib.sha256()
    for source in sources:
        h.update(source.read_bytes())
    return h.hexdigest()
