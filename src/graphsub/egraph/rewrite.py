"""Applying a rule's match in an e-graph: add the target's e-nodes, union each target output
with its source root. Nothing is removed: the source stays, as equality saturation wants.

Targets are instantiated as in graphsub.rules.applier (computed attributes, `let`, weight
constants), their types inferred by the op registry and checked against the source roots'.
A target that does not fit (a shape that does not divide, a type that would change) is not
added; the reason is counted like the graph applier's rejections.
"""

from __future__ import annotations

from collections import Counter

from graphsub.egraph.cycles import Descendants
from graphsub.egraph.egraph import EGraph, EGraphError
from graphsub.egraph.ematch import EGraphEnv, EMatch
from graphsub.errors import GraphsubError, ShapeError
from graphsub.ir.types import Attrs, Constant
from graphsub.rules.applier import Rejected, constant_from_attrs, target_attrs
from graphsub.rules.ast import OpTerm, Ref, Term, Var, term_vars


class _TargetBuilder:
    """Adds a rule's target terms to the e-graph (hash-consing shares equal subterms)."""

    def __init__(self, eg: EGraph, match: EMatch, origin: int) -> None:
        self.eg = eg
        self.match = match
        self.origin = origin
        self.env = EGraphEnv(eg, match.tensors, match.attrs, match.roots)
        self.lets: dict[str, tuple[int, ...]] = {}

    def build(self, term: Term) -> int:
        if isinstance(term, Var):
            if term.name not in self.match.tensors:
                raise Rejected(f"target variable ?{term.name} is not bound by the source")
            return self.eg.find(self.match.tensors[term.name])
        outs = self.build_outputs(term)
        index = term.index if isinstance(term, (OpTerm, Ref)) else 0
        if index >= len(outs):
            raise Rejected(f"target has no output {index}")
        return outs[index]

    def build_outputs(self, term: Term) -> tuple[int, ...]:
        if isinstance(term, Ref):
            if term.name not in self.lets:
                raise Rejected(f"let name {term.name!r} is not defined")
            return self.lets[term.name]
        if isinstance(term, Var):
            return (self.build(term),)
        assert isinstance(term, OpTerm)
        children = tuple(self.build(a) for a in term.args)
        attrs = target_attrs(term, self.env, [self.eg[c].types[0].shape for c in children])
        if term.op == "constant":
            return self.eg.add_op("weight", Attrs({"value": Constant(constant_from_attrs(attrs))}),
                                  (), self.origin)
        return self.eg.add_op(term.op, attrs, children, self.origin)


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
    builder = _TargetBuilder(eg, match, origin)
    try:
        for name, term in match.rule.lets:
            builder.lets[name] = builder.build_outputs(term)
        targets = [builder.build(t) for t in match.rule.targets]
        for root, new in zip(match.roots, targets):
            if eg[root].types != eg[new].types:
                raise Rejected("the target's type differs from the source's")
        for root, new in zip(match.roots, targets):
            eg.union(root, new)
    except Rejected as exc:
        rejections[exc.reason] += 1
    except ShapeError:
        rejections["shape or type mismatch"] += 1
    except EGraphError:
        rejections["the target's type differs from the source's"] += 1
    except GraphsubError:
        rejections["target not buildable"] += 1
    return eg.version != before
