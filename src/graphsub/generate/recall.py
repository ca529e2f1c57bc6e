"""How much of a reference rule set (TASO's graph_subst.pb) the generator finds.

Rules are compared in a canonical text form that ignores what does not change a
substitution: variable names (renamed in order of first appearance), the operand order of
commutative operators (add, mul), the order of a rule's outputs, the order of attributes,
split sizes (they follow from the shapes), and the direction of the rule.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from graphsub.ops import get_op
from graphsub.rules.ast import ListExpr, OpTerm, Ref, Rule, Term, Var
from graphsub.rules.parser import print_expr, print_term


def _expand(t: Term, lets: dict[str, Term]) -> Term:
    if isinstance(t, Ref):
        base = lets[t.name]
        assert isinstance(base, OpTerm)  # a reference projects an operator's output
        t = OpTerm(base.op, base.attrs, base.args, t.index)
    if not isinstance(t, OpTerm):
        return t
    attrs = tuple(sorted((k, v) for k, v in t.attrs
                         if not (t.op == "split" and k == "sizes" and isinstance(v, ListExpr))))
    return OpTerm(t.op, attrs, tuple(_expand(a, lets) for a in t.args), t.index)


def _render(t: Term, names: dict[str, str]) -> str:
    """The term's text under a variable renaming, commutative operands sorted."""
    if isinstance(t, Var):
        return "?" + names[t.name]
    assert isinstance(t, OpTerm)
    args = [_render(a, names) for a in t.args]
    if t.op != "constant" and get_op(t.op).commutative:
        args.sort()
    attrs = "".join(f" :{k} {print_expr(v)}" for k, v in t.attrs)
    attrs = re.sub(r"\?([\w-]+)", lambda m: "?" + names.get(m.group(1), m.group(1)), attrs)
    index = f".{t.index}" if t.index else ""
    return f"({t.op}{attrs} {' '.join(args)}){index}"


def _variables(terms: Sequence[Term]) -> list[str]:
    seen: dict[str, None] = {}
    for t in terms:
        for m in re.findall(r"\?([\w-]+)", print_term(t)):
            seen.setdefault(m, None)
    return list(seen)


def _canonical(sources: Sequence[Term], targets: Sequence[Term]) -> str:
    """The smallest text over all renamings of the variables to v0, v1, ... (rules have a
    handful of variables), with commutative operands and output pairs sorted."""
    variables = _variables(list(sources) + list(targets))
    best = None
    orders = (itertools.permutations(range(len(variables))) if len(variables) <= 6
              else [tuple(range(len(variables)))])
    for order in orders:
        names = {v: f"v{k}" for v, k in zip(variables, order)}
        pairs = sorted((_render(s, names), _render(t, names)) for s, t in zip(sources, targets))
        text = " , ".join(p[0] for p in pairs) + " => " + " , ".join(p[1] for p in pairs)
        if best is None or text < best:
            best = text
    return best or ""


def canonical_forms(rule: Rule) -> tuple[str, str]:
    """The rule's canonical text in both directions."""
    lets = dict(rule.lets)
    sources = [_expand(t, lets) for t in rule.sources]
    targets = [_expand(t, lets) for t in rule.targets]
    return _canonical(sources, targets), _canonical(targets, sources)


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
