"""How much of a reference rule set (TASO's graph_subst.pb) the generator finds.

Rules are compared in a canonical text form that ignores what does not change a
substitution: variable names (renamed in order of first appearance), the operand order of
commutative operators (add, mul), the order of a rule's outputs, the order of attributes,
split sizes (they follow from the shapes), and the direction of the rule.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from graphsub.ops import get_op
from graphsub.rules.ast import ListExpr, OpTerm, Ref, Rule, Term, Var
from graphsub.rules.parser import print_term


def _normal(t: Term, lets: dict[str, OpTerm]) -> Term:
    if isinstance(t, Ref):
        base = lets[t.name]
        t = OpTerm(base.op, base.attrs, base.args, t.index)
    if not isinstance(t, OpTerm):
        return t
    args = [_normal(a, lets) for a in t.args]
    op = get_op(t.op) if t.op != "constant" else None
    if op is not None and op.commutative:
        args.sort(key=_masked)
    attrs = tuple(sorted((k, v) for k, v in t.attrs
                         if not (t.op == "split" and k == "sizes" and isinstance(v, ListExpr))))
    return OpTerm(t.op, attrs, tuple(args), t.index)


def _masked(t: Term) -> str:
    return re.sub(r"\?[\w-]+", "?", print_term(t)) if not isinstance(t, Var) else "?"


def _side_text(terms: Sequence[Term]) -> list[str]:
    return [print_term(t) for t in terms]


def _renamed(texts: Sequence[str]) -> str:
    names: dict[str, str] = {}
    joined = " , ".join(texts)
    for v in re.findall(r"\?([\w-]+)", joined):
        names.setdefault(v, f"v{len(names)}")
    return re.sub(r"\?([\w-]+)", lambda m: "?" + names[m.group(1)], joined)


def canonical_forms(rule: Rule) -> tuple[str, str]:
    """The rule's canonical text in both directions."""
    lets = dict(rule.lets)  # type: ignore[arg-type]
    pairs = [(_normal(s, lets), _normal(t, lets)) for s, t in zip(rule.sources, rule.targets)]
    pairs.sort(key=lambda p: (_masked(p[0]), _masked(p[1])))
    fwd = _renamed(_side_text([s for s, _ in pairs]) + ["=>"] + _side_text([t for _, t in pairs]))
    back = sorted(pairs, key=lambda p: (_masked(p[1]), _masked(p[0])))
    bwd = _renamed(_side_text([t for _, t in back]) + ["=>"] + _side_text([s for s, _ in back]))
    return fwd, bwd


@dataclass
class Recall:
    found: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        total = len(self.found) + len(self.missing)
        return len(self.found) / total if total else 1.0


def recall(generated: Iterable[Rule], reference: Iterable[Rule]) -> Recall:
    """Which reference rules the generated ones contain, in either direction."""
    known: set[str] = set()
    for r in generated:
        known.update(canonical_forms(r))
    result = Recall()
    for r in reference:
        fwd, bwd = canonical_forms(r)
        (result.found if fwd in known or bwd in known else result.missing).append(r.name)
    return result
