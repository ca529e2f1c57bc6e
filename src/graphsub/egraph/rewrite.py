"""Applying a rule's match in an e-graph: add the target's e-nodes, union each target output
with its source root. Nothing is removed: the source stays, as equality saturation wants.

Targets are built by graphsub.rules.applier.build_targets into the e-graph (computed
attributes, `let`, weight constants), their types inferred by the op registry and checked
against the source roots'. A target that does not fit (a shape that does not divide, a type
that would change) is not merged; its rejection is counted like the graph applier's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from graphsub.egraph.cycles import Descendants
from graphsub.egraph.egraph import EGraph, EGraphError
from graphsub.egraph.ematch import EGraphHost, EMatch
from graphsub.tensors.types import TensorType
from graphsub.rules.applier import Rejection, build_targets
from graphsub.rules.ast import term_vars
from graphsub.rules.expr import Env

TYPE_CHANGED = "the target's type differs from the source's"


class _EGraphSink:
    """An e-graph as a target sink (graphsub.rules.applier.TargetSink): targets are added as
    e-nodes, tagged with the rewrite that made them."""

    __slots__ = ("egraph", "origin")

    def __init__(self, egraph: EGraph, origin: int) -> None:
        self.egraph = egraph
        self.origin = origin

    def type_of(self, cls: int) -> TensorType:
        return self.egraph[cls].types[0]

    def add(self, op: str, inputs: Sequence[int] = (),
            attrs: Mapping[str, Any] | None = None) -> tuple[int, ...]:
        return self.egraph.add_op(op, attrs, inputs, self.origin)


def target_reads(match: EMatch) -> list[int]:
    """The classes a match's targets read from the source (its variables' classes)."""
    names: set[str] = set()
    for t in match.rule.targets:
        names |= term_vars(t)
    for _, t in match.rule.lets:
        names |= term_vars(t)
    return [match.tensors[n] for n in names if n in match.tensors]


def apply_ematch(eg: EGraph, match: EMatch, origin: int, rejections: Counter[str],
                 descendants: Descendants | None = None) -> bool:
    """Apply one match; whether the e-graph changed. With `descendants` (computed at the start
    of the iteration), a match whose target reads a class that has a source root among its
    descendants is filtered out: the root would become its own descendant."""
    if descendants is not None:
        for root in match.roots:
            if any(descendants.reaches(v, root) for v in target_reads(match)):
                rejections["cycle (filtered)"] += 1
                return False
    before = eg.version
    env = Env(EGraphHost(eg), {k: eg.find(c) for k, c in match.tensors.items()}, match.attrs,
              tuple(eg.find(r) for r in match.roots))
    targets = build_targets(_EGraphSink(eg, origin), match.rule, env)
    if isinstance(targets, Rejection):
        rejections[targets.reason] += 1
        return eg.version != before
    if any(eg[root].types != eg[new].types for root, new in zip(match.roots, targets)):
        rejections[TYPE_CHANGED] += 1
        return eg.version != before
    try:
        for root, new in zip(match.roots, targets):
            eg.union(root, new)
    except EGraphError:
        rejections[TYPE_CHANGED] += 1
    return eg.version != before
