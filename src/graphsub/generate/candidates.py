"""Step 2 of TASO's generator: graphs with the same fingerprint are tested on random floats in
[-1, 1] (threshold 1e-5); each pair that agrees on every test becomes a candidate substitution,
with its output mapping inferred from the test values, written as a graphsub rule."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from graphsub.generate.enumerate import Enumeration, GenGraph
from graphsub.generate.opset import OPS
from graphsub.ops import get_op
from graphsub.ops.base import REQUIRED
from graphsub.rules.ast import Lit, ListExpr, OpTerm, Rule, Term, Var

THRESHOLD = 1e-5


@dataclass(frozen=True)
class Candidate:
    source: GenGraph
    target: GenGraph
    mapping: tuple[tuple[int, int], ...]  # (source output id, target output id)


def _same(a, b) -> bool:
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


def candidates(enum: Enumeration) -> Iterator[Candidate]:
    """Every pair of distinct graphs in a fingerprint group that passes the float tests; the
    larger graph is the source."""
    for group in enum.by_fingerprint.values():
        for g1, g2 in itertools.combinations(group, 2):
            src, dst = (g1, g2) if g1.size >= g2.size else (g2, g1)
            mapping = output_mapping(src, dst)
            if mapping is not None:
                yield Candidate(src, dst, mapping)


def _terms(g: GenGraph) -> dict[int, Term]:
    """A rule term for every tensor of the graph, by id."""
    terms: dict[int, Term] = {i: Var(name) for i, name in enumerate(g.input_names)}
    for node in g.nodes:
        op = OPS[node.op]
        attrs = dict(node.attrs)
        args = tuple(terms[i] for i in node.inputs)
        rule_attrs: list[tuple[str, object]] = [(k, Lit(v)) for k, v in sorted(attrs.items())]
        if node.op == "split":
            sizes = ListExpr(tuple(g.tensors[o].dims[attrs["axis"]] for o in node.outputs))
            rule_attrs.append(("sizes", sizes))
        if node.op == "transpose":
            rank = len(g.tensors[node.inputs[0]].shape)
            perm = list(range(rank - 2)) + [rank - 1, rank - 2]  # swap the last two axes
            rule_attrs.append(("perm", ListExpr(tuple(Lit(p) for p in perm))))
        given = {k for k, _ in rule_attrs}
        for spec in get_op(op.name).attrs:  # pin the rest to defaults: a free attribute
            if spec.name not in given and spec.default not in (None, REQUIRED):  # would match
                rule_attrs.append((spec.name, Lit(spec.default)))  # e.g. a fused activation
        if node.op in ("ewadd", "ewmul"):
            rule_attrs.append(("same-shapes", Lit(True)))  # TASO's ops do not broadcast
        for k, o in enumerate(node.outputs):
            terms[o] = OpTerm(op.name, tuple(rule_attrs), args, k)  # type: ignore[arg-type]
    return terms


def to_rule(c: Candidate, name: str) -> Rule:
    src, dst = _terms(c.source), _terms(c.target)
    return Rule(name, tuple(src[a] for a, _ in c.mapping), tuple(dst[b] for _, b in c.mapping),
                doc=f"generated: {c.source.size} -> {c.target.size} operators", origin="generator")
