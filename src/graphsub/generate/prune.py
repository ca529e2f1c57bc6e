"""Pruning redundant substitutions (TASO section 4).

A substitution is redundant when a more general valid one subsumes it; pruning keeps every
optimization reachable. Three steps, in TASO's order:

1. Input tensor renaming: of rules that are the same up to renaming their variables, keep one;
   a rule that is an instance of a more general one (variables identified, e.g. C renamed A) is
   dropped.
2. Common subgraph, first form: an operator with the same inputs on both sides is replaced by
   a fresh input variable, giving a more general rule.
3. Common subgraph, second form: when both sides end in the same operator over the same
   other inputs, that operator is removed and its differing inputs become the outputs.

A generalized rule replaces the specific one only if it is valid (checked numerically here;
the Z3 verifier of issue 4 will prove it), and it is then deduplicated like any other.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from graphsub.executors import Executor
from graphsub.rules.ast import AVar, Call, Expr, ListExpr, OpTerm, Rule, Term, Var, term_vars
from graphsub.rules.check import RuleCheckError, check_rule
from graphsub.rules.parser import parse_rules, print_expr, print_rule, print_term

Validator = Callable[[Rule], bool]


def numerically_valid(rule: Rule) -> bool:
    """Both sides agree on random inputs (a generalization that cannot be tested is not
    taken: the specific rule stays)."""
    try:
        check_rule(rule, examples=2, attempts=100)
        return True
    except RuleCheckError:
        return False


def _text(rule: Rule) -> str:
    """Sides and conditions: two rules that differ only in where they hold are different."""
    text = " , ".join(print_term(t) for t in rule.sources) + " => " + \
        " , ".join(print_term(t) for t in rule.targets)
    return text + "".join(" where " + print_expr(c) for c in rule.conditions)


def _names(e: Expr) -> set[str]:
    if isinstance(e, AVar):
        return {e.name}
    if isinstance(e, (Call, ListExpr)):
        return set().union(*(_names(a) for a in (e.args if isinstance(e, Call) else e.items)))
    return set()


def _generalized(rule: Rule, sources: tuple[Term, ...], targets: tuple[Term, ...],
                 how: str) -> Rule | None:
    """The rule with new sides; conditions on variables the sides no longer have go (a
    fresh variable has none: the validator tries it at every rank), and None when the target
    reads a variable the source does not bind."""
    bound = set().union(*(term_vars(t) for t in sources))
    kept = tuple(c for c in rule.conditions if _names(c) <= bound)
    general = Rule(rule.name, sources, targets, rule.lets, kept, rule.doc + how, rule.origin,
                   rule.roles)
    return general if _closed(general) else None


def _var_sequence(text: str) -> list[str]:
    return re.findall(r"\?([\w-]+)", text)


def canonical(rule: Rule) -> str:
    """The rule's text with variables renamed v0, v1, ... in order of first appearance."""
    text = _text(rule)
    names: dict[str, str] = {}
    for v in _var_sequence(text):
        names.setdefault(v, f"v{len(names)}")
    return re.sub(r"\?([\w-]+)", lambda m: "?" + names[m.group(1)], text)


def _shape_key(rule: Rule) -> str:
    return re.sub(r"\?[\w-]+", "?", _text(rule))


def instance_of(specific: Rule, general: Rule) -> bool:
    """Whether `specific` is `general` with its variables renamed (not necessarily one to one)."""
    a, b = _var_sequence(_text(general)), _var_sequence(_text(specific))
    if len(a) != len(b) or _shape_key(general) != _shape_key(specific):
        return False
    mapping: dict[str, str] = {}
    for g, s in zip(a, b):
        if mapping.setdefault(g, s) != s:
            return False
    return True


def prune_renaming(rules: Sequence[Rule]) -> list[Rule]:
    """Keep one rule per renaming class, and drop rules that are instances of more general
    ones (more distinct variables)."""
    by_canon: dict[str, Rule] = {}
    for r in rules:
        by_canon.setdefault(canonical(r), r)
    unique = list(by_canon.values())
    groups: dict[str, list[Rule]] = {}
    for r in unique:
        groups.setdefault(_shape_key(r), []).append(r)
    kept = []
    for group in groups.values():
        group.sort(key=lambda r: -len(set(_var_sequence(_text(r)))))
        for i, r in enumerate(group):
            if not any(instance_of(r, g) for g in group[:i]):
                kept.append(r)
    return kept


def _subterms(t: Term) -> Iterable[OpTerm]:
    if isinstance(t, OpTerm):
        yield t
        for a in t.args:
            yield from _subterms(a)


def _replace(t: Term, old: Term, new: Term) -> Term:
    if t == old:
        return new
    if isinstance(t, OpTerm):
        return OpTerm(t.op, t.attrs, tuple(_replace(a, old, new) for a in t.args), t.index)
    return t


def _base(t: OpTerm) -> OpTerm:
    """The operator application itself, whichever of its outputs `t` projects."""
    return OpTerm(t.op, t.attrs, t.args, 0)


def generalize_common_operator(rule: Rule) -> Rule | None:
    """Form 1: an operator (with its inputs) that appears on both sides, but is not a whole
    side, becomes a fresh variable."""
    roots = {_base(t) for t in rule.sources + rule.targets if isinstance(t, OpTerm)}
    src = {_base(t) for s in rule.sources for t in _subterms(s)}
    tgt = {_base(t) for s in rule.targets for t in _subterms(s)}
    common = [t for t in src & tgt if t not in roots]
    if not common:
        return None
    # The largest common operator first: replacing it removes the most.
    target = max(common, key=lambda t: len(print_term(t)))
    if any(_base(t) == target and t.index != 0 for s in rule.sources + rule.targets
           for t in _subterms(s)):
        return None  # a multi-output operator used through several outputs: keep it
    taken = set(_var_sequence(_text(rule)))
    fresh = Var(next(f"s{k}" for k in range(len(taken) + 1) if f"s{k}" not in taken))
    return _generalized(rule, tuple(_replace(s, target, fresh) for s in rule.sources),
                        tuple(_replace(t, target, fresh) for t in rule.targets),
                        " (common operator generalized)")


def _closed(rule: Rule) -> bool:
    """Every variable of the target is bound by the source."""
    return all(term_vars(t) <= rule.source_vars for t in rule.targets)


def strip_common_output(rule: Rule) -> Rule | None:
    """Form 2: both sides end in the same operator whose other inputs are the same: remove it,
    and its differing inputs become the rule's outputs."""
    if len(rule.sources) != 1:
        return None
    s, t = rule.sources[0], rule.targets[0]
    if not (isinstance(s, OpTerm) and isinstance(t, OpTerm)) or (s.op, s.attrs, s.index) != (
            t.op, t.attrs, t.index) or len(s.args) != len(t.args):
        return None
    differ = [i for i, (a, b) in enumerate(zip(s.args, t.args)) if a != b]
    if not differ or not all(isinstance(s.args[i], OpTerm) for i in differ):
        return None  # a source output must be an operator for the rule to match anything
    return _generalized(rule, tuple(s.args[i] for i in differ), tuple(t.args[i] for i in differ),
                        " (common output operator removed)")


STEPS: dict[str, Callable[[Rule], Rule | None]] = {
    "common-operator": generalize_common_operator,
    "common-output": strip_common_output,
}


def _generalize_one(rule: Rule, step: Callable[[Rule], Rule | None], valid: Validator) -> Rule:
    current = rule
    while (general := step(current)) is not None and valid(general):
        current = general
    return current


def generalize_texts(texts: Sequence[str], step: str) -> list[str]:
    """One batch of generalizations, as a task for an executor (rules travel as text)."""
    return [print_rule(_generalize_one(r, STEPS[step], numerically_valid))
            for t in texts for r in parse_rules(t, origin="generator")]


def _generalize(rules: Sequence[Rule], step: str, valid: Validator, tick: Callable[[int], None],
                executor: Executor | None = None) -> list[Rule]:
    if executor is None or valid is not numerically_valid:
        out = []
        for r in rules:
            out.append(_generalize_one(r, STEPS[step], valid))
            tick(1)
        return prune_renaming(out)
    n = max(1, min(len(rules), 8 * executor.workers))
    batches = [[print_rule(r) for r in rules[i::n]] for i in range(n)]
    general: dict[str, Rule] = {}
    for done in executor.run(generalize_texts, [(b, step) for b in batches]):
        for text in done:
            (r,) = parse_rules(text, origin="generator")
            general[r.name] = dataclasses.replace(r, origin=rules[0].origin)
        tick(len(done))
    return prune_renaming([general[r.name] for r in rules])


@dataclass
class PruneReport:
    """Remaining substitutions after each step (TASO Table 3)."""

    counts: list[tuple[str, int]] = field(default_factory=list)

    def table(self) -> str:
        initial = self.counts[0][1] if self.counts else 0
        lines = ["| pruning step | remaining | reduction |", "|---|---|---|"]
        for name, n in self.counts:
            lines.append(f"| {name} | {n} | {initial / n:.1f}x |" if n else f"| {name} | 0 | - |")
        return "\n".join(lines)


def prune(rules: Sequence[Rule], valid: Validator = numerically_valid,
          on_progress: Callable[[str, int, int], None] | None = None,
          executor: Executor | None = None) -> tuple[list[Rule], PruneReport]:
    """Prune (rules must have distinct names). Generalizations are checked by `valid`; with
    the default numeric check they can run as batches on `executor`. `on_progress` gets
    (step, rules done, rules in the step)."""
    report = PruneReport([("initial", len(rules))])
    common = prune_renaming(rules)
    report.counts.append(("input tensor renaming", len(common)))
    for step in STEPS:
        done, total = 0, len(common)

        def tick(n: int, step: str = step, total: int = total) -> None:
            nonlocal done
            done += n
            if on_progress is not None:
                on_progress(step, done, total)

        common = _generalize(common, step, valid, tick, executor)
    report.counts.append(("common subgraph", len(common)))
    return common, report
