"""The rules one run reads: the built-in library with the user's rules added, or the user's
alone.

A rule file given to a run (`--rules FILE`, `rules=` in the Python API) adds to the library,
so that the library's normal form (graphsub.search.normal_form) and the search's rules stay
in force beside it; `rules_only` (`--rules-only`) runs the given rules alone, and the normal
form is then whatever they declare (graphsub.rules.roles). Where a given rule has the name of
a library rule, the given one is used in the library one's place: a user's file can correct
or restrict one rule without the whole library being dropped; the run's notes say so, and
what else the choice left out (the library's normal form, under rules only; rules whose
roles no part of a run reads).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from graphsub.rules import Rule, builtin_rules
from graphsub.rules.roles import RUN_ROLES, Role, role_names, with_role


@dataclass(frozen=True)
class RuleSet:
    """The rules a run reads, in order, and what the reader should know of the choice (the
    run's notes)."""

    rules: tuple[Rule, ...]
    notes: tuple[str, ...] = ()


def rule_set(given: Sequence[Rule] | None, rules_only: bool = False) -> RuleSet:
    """The library (None given), the library with `given` added, or `given` alone
    (`rules_only`). A given rule equal to the library's of its name is the library's; one
    that differs takes the library one's place, with a note."""
    library = builtin_rules()
    if given is None:
        return RuleSet(tuple(library))
    notes = _unread(given)
    if rules_only:
        return RuleSet(tuple(given), (*notes, *_normal_form_left_out(library, given)))
    mine = {r.name: r for r in given}
    chosen: list[Rule] = []
    for rule in library:
        theirs = mine.pop(rule.name, None)
        if theirs is None or theirs == rule:
            chosen.append(rule)
            continue
        chosen.append(theirs)
        notes.append(f"rule {rule.name} of {theirs.origin} is used in place of the library's "
                     f"({Path(rule.origin).name}, roles {role_names(rule.roles)})")
    chosen += [r for r in given if r.name in mine]
    return RuleSet(tuple(chosen), tuple(notes))


def load_rule_files(paths: Sequence[str | Path], rules_only: bool = False) -> RuleSet:
    """The rules a run reads given these files (graphsub .rules or TASO .pb, each verified on
    load as `graphsub verify` verifies it): added to the library, or alone with
    `rules_only`; no files: the library."""
    if not paths:
        return rule_set(None, rules_only)
    from graphsub.proofs.loading import load_verified_rules  # Z3's import, only when asked

    return rule_set(load_verified_rules([Path(p) for p in paths]), rules_only)


def _normal_form_left_out(library: Sequence[Rule], given: Sequence[Rule]) -> list[str]:
    """The note for a run of the given rules alone that leaves out the library's normal
    form (a caller that passes the library itself among them keeps it)."""
    mine = {r.name: r for r in given}
    if all(mine.get(r.name) == r for r in with_role(library, Role.NORMAL_FORM)):
        return []
    own = len(with_role(given, Role.NORMAL_FORM))
    return ["the library's normal form is not applied (rules only): "
            + (f"the normal form is the {own} rule(s) given that declare the normal-form role"
               if own else "no rule given declares the normal-form role, so there is none")]


def _unread(given: Sequence[Rule]) -> list[str]:
    """A note for each file whose rules declare no role a run reads (fission's roles are read
    from graphsub's own files: graphsub.fission.primitives)."""
    files: dict[str, set[Role]] = {}
    for r in given:
        if not r.roles & RUN_ROLES:
            files.setdefault(r.origin, set()).update(r.roles)
    return [f"the rules of {origin} declare only {role_names(roles)}, which a run reads "
            f"from graphsub's own rule files: they take no part in this run"
            for origin, roles in files.items()]


__all__ = ["RuleSet", "load_rule_files", "rule_set"]
