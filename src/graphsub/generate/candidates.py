"""Step 2 of TASO's generator: graphs with the same fingerprint are tested on random floats in
[-1, 1] (threshold 1e-5); each pair that agrees on every test becomes a candidate substitution,
with its output mapping inferred from the test values, written as a graphsub rule."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from graphsub.generate.enumerate import Enumeration, GenGraph, GenNode
from graphsub.generate.opset import OPS, GenTensor
from graphsub.ops import get_op
from graphsub.ops.base import REQUIRED
from graphsub.rules.ast import AVar, Call, Expr, ListExpr, Lit, OpTerm, Rule, Term, Var, term_vars
from graphsub.rules.parser import print_term

THRESHOLD = 1e-5
#: Groups larger than this are paired as a star around their smallest graph rather than all
#: pairs: every graph of the group stays reachable from every other in two steps.
ALL_PAIRS_LIMIT = 40


@dataclass(frozen=True)
class RuleCandidate:
    source: GenGraph
    target: GenGraph
    mapping: tuple[tuple[int, int], ...]  # (source output id, target output id)


def _same(a: GenTensor, b: GenTensor) -> bool:
    return a.shape == b.shape and all(
        np.allclose(x, y, rtol=0, atol=THRESHOLD) for x, y in zip(a.tests, b.tests))


def output_mapping(g1: GenGraph, g2: GenGraph) -> tuple[tuple[int, int], ...] | None:
    """A bijection between the two graphs' outputs under which all test values agree."""
    if len(g1.outputs) != len(g2.outputs):
        return None
    for perm in itertools.permutations(g2.outputs):
        if all(_same(g1.tensors[a], g2.tensors[b]) for a, b in zip(g1.outputs, perm)):
            return tuple(zip(g1.outputs, perm))
    return None


def _uses_constant(g: GenGraph) -> bool:
    return any(g.tensors[i].role == "constant" for n in g.nodes for i in n.inputs)


def _orientations(g1: GenGraph, g2: GenGraph) -> list[tuple[GenGraph, GenGraph]]:
    """(source, target) pairs. Whether a rewrite pays off is the cost model's call (TASO's
    figure 2b merges two matmuls into a larger one plus a split), so a pair gives a rule in
    each direction; but a constant tensor cannot be matched in a graph, so a side with one
    is only ever a target."""
    const1, const2 = _uses_constant(g1), _uses_constant(g2)
    if const1 and const2:
        return []
    if const1:
        return [(g2, g1)]
    if const2:
        return [(g1, g2)]
    return [(g1, g2), (g2, g1)]


def pair_candidates(g1: GenGraph, g2: GenGraph) -> list[RuleCandidate]:
    """The candidates two graphs of one fingerprint group give: none when the float tests
    tell them apart, else one per allowed direction."""
    mapping = output_mapping(g1, g2)
    if mapping is None:
        return []
    return [RuleCandidate(src, dst, mapping if src is g1 else tuple((b, a) for a, b in mapping))
            for src, dst in _orientations(g1, g2)]


def group_pairs(sizes: Sequence[int]) -> Iterator[tuple[int, int]]:
    """Which members of a group to pair: all pairs, or for a large group a star around its
    smallest graph (every graph stays reachable from every other in two steps)."""
    if len(sizes) <= ALL_PAIRS_LIMIT:
        yield from itertools.combinations(range(len(sizes)), 2)
    else:
        hub = min(range(len(sizes)), key=lambda i: sizes[i])
        yield from ((hub, i) for i in range(len(sizes)) if i != hub)


def pair_group(group: Sequence[GenGraph]) -> Iterator[RuleCandidate]:
    """Candidates from one fingerprint group."""
    for i, j in group_pairs([g.size for g in group]):
        yield from pair_candidates(group[i], group[j])


def candidates(enum: Enumeration) -> Iterator[RuleCandidate]:
    """Every candidate of an in-memory enumeration."""
    for group in enum.groups():
        yield from pair_group(group)


def _constant_term(g: GenGraph, tensor: int, consumer: GenNode, terms: dict[int, Term]) -> Term:
    """A constant tensor as a rule term, its shape written from the operand it meets."""
    spec = g.inputs[tensor]
    params = dict(spec.params)
    other = [i for i in consumer.inputs if i != tensor]
    fits = {"c-pool": ("conv", "conv-strided"), "i-conv": ("conv", "conv-strided"),
            "i-matmul": ("matmul", "ewadd", "ewmul", "sub", "div"),
            "i-ewmul": ("ewadd", "ewmul", "sub", "div")}
    if not other or consumer.op not in fits[spec.constant or ""] or (
            consumer.op.startswith("conv") and consumer.inputs[1] != tensor):
        raise _Unrepresentable("a constant whose shape its consumer does not determine")
    dims = g.tensors[other[0]].dims
    if spec.constant == "c-pool":
        k = params["kernel"]
        shape, value, pattern = [dims[1], Lit(1), Lit(k[0]), Lit(k[1])], 1.0 / (k[0] * k[1]), "full"
    elif spec.constant == "i-conv":
        k = params["kernel"]
        shape, value, pattern = [dims[1], dims[1], Lit(k[0]), Lit(k[1])], 1.0, "conv-identity"
    elif spec.constant == "i-matmul" and consumer.op == "matmul":
        side = dims[-1] if consumer.inputs[1] == tensor else dims[0]
        shape, value, pattern = [side, side], 1.0, "eye"
    elif spec.constant == "i-matmul":  # element-wise with a square matrix: its shape
        shape, value, pattern = list(dims), 1.0, "eye"
    else:  # i-ewmul: ones shaped like the other operand
        shape, value, pattern = list(dims), 1.0, "full"
    if not all(_expressible(d) for d in shape):
        raise _Unrepresentable("a constant whose shape is not expressible")
    attrs: list[tuple[str, Expr]] = [("value", Lit(value)), ("shape", ListExpr(tuple(shape)))]
    if pattern != "full":
        attrs.append(("pattern", Lit(pattern)))
    return OpTerm("constant", tuple(attrs), (), 0)


class _Unrepresentable(Exception):
    pass


def _expressible(e: object) -> bool:
    """No part of the expression is a size the enumeration could not name (None)."""
    if e is None:
        return False
    if isinstance(e, ListExpr):
        return all(_expressible(i) for i in e.items)
    if isinstance(e, Call):
        return all(_expressible(a) for a in e.args)
    return True


def _lit(value: object) -> Lit | ListExpr:
    if isinstance(value, tuple):
        return ListExpr(tuple(Lit(v) for v in value))
    return Lit(value)


def _terms(g: GenGraph) -> dict[int, Term]:
    """A rule term for every tensor of the graph, by id."""
    terms: dict[int, Term] = {i: Var(s.name) for i, s in enumerate(g.inputs) if s.constant is None}
    for node in g.nodes:
        op = OPS[node.op]
        attrs = dict(node.attrs)
        args = []
        for i in node.inputs:
            if i not in terms:
                terms[i] = _constant_term(g, i, node, terms)
            args.append(terms[i])
        rule_attrs: list[tuple[str, Expr]] = [(k, _lit(v)) for k, v in sorted(attrs.items())]
        if node.op == "split":
            sizes = ListExpr(tuple(g.tensors[o].dims[attrs["axis"]] for o in node.outputs))
            if not _expressible(sizes):
                raise _Unrepresentable("split sizes of a constant's concatenation")
            rule_attrs.append(("sizes", sizes))
        given = {k for k, _ in rule_attrs}
        for spec in get_op(op.op).attrs:  # pin the rest to defaults: a free attribute
            if spec.name not in given and spec.default not in (None, REQUIRED):  # would match
                rule_attrs.append((spec.name, _lit(spec.default)))  # e.g. a fused activation
        if node.op in ("ewadd", "ewmul", "sub", "div"):
            rule_attrs.append(("same-shapes", Lit(True)))  # TASO's ops do not broadcast
        for k, o in enumerate(node.outputs):
            terms[o] = OpTerm(op.op, tuple(rule_attrs), tuple(args), k)
    return terms


def to_rule(c: RuleCandidate, name: str) -> Rule | None:
    """The candidate as a graphsub rule; outputs computed identically on both sides are left
    out (they are a common subgraph), and None when nothing is left or the rule needs a
    constant whose shape it cannot write."""
    try:
        src, dst = _terms(c.source), _terms(c.target)
    except _Unrepresentable:
        return None
    pairs = [(src[a], dst[b]) for a, b in c.mapping if print_term(src[a]) != print_term(dst[b])]
    if not pairs:
        return None
    bound = set().union(*(term_vars(s) for s, _ in pairs))
    if not all(term_vars(t) <= bound for _, t in pairs):
        return None  # the target reads an input the source does not (it cancels out)
    return Rule(name, tuple(s for s, _ in pairs), tuple(t for _, t in pairs),
                conditions=_rank_conditions(c.source, bound),
                doc=f"generated: {c.source.size} -> {c.target.size} operators", origin="generator")


def _rank_conditions(g: GenGraph, names: set[str]) -> tuple[Expr, ...]:
    """(eq (rank ?x) r) for every input, r its rank in the enumeration: the candidate was
    tested at those ranks only, and many identities do not hold at others (matmul's
    associativity fails once an operand is a vector, which the rule checker now tries)."""
    return tuple(Call("eq", (Call("rank", (AVar(s.name),)), Lit(len(s.shape))))
                 for s in g.inputs if s.name in names)
