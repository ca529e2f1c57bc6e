"""Rules: the text format, matching, applying, numerical checks and the built-in library.

    from graphsub.rules import builtin_rules, load_rules
    rules = builtin_rules()                       # verified where graphsub is built
    rules = load_rules(["my.rules"])              # a rule file of your own, checked on load
    rules = load_python_rules([python_rule("r", pattern_fn, replacement_fn)])  # in Python
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

from graphsub.errors import GraphsubError
from graphsub.rules.applier import Rejection, apply_match
from graphsub.rules.ast import Rule
from graphsub.rules.check import (CheckedRules, Decision, RuleCheckError, check_rule,
                                  numerical_check)
from graphsub.rules.matcher import Match, find_matches
from graphsub.rules.parser import RuleSyntaxError, parse_rules, print_rule, print_rules
from graphsub.rules.python import load_python_rules, python_rule

LIBRARY = Path(__file__).parent / "library"


def library_files() -> list[Path]:
    return sorted(LIBRARY.glob("*.rules"))


@lru_cache(maxsize=None)
def _checked(path: str, text: str, check: bool, decide: Decision) -> tuple[Rule, ...]:
    rules = parse_rules(text, origin=path)
    if check:
        with CheckedRules.load(decide) as passed:
            for r in rules:
                passed.check(r)
    return tuple(rules)


def load_rules(paths: Iterable[str | Path], check: bool = True,
               decide: Decision = numerical_check) -> list[Rule]:
    """Rules from rule files (graphsub text format, or TASO's .pb), each decided by `decide`
    (the numerical check; `graphsub.proofs.loading.load_verified_rules` loads with
    `graphsub verify`'s decision) unless `check` is False. Duplicate rule names are an
    error."""
    rules: list[Rule] = []
    for p in paths:
        path = Path(p)
        if not path.is_file():
            raise GraphsubError(f"rule file {path} does not exist" if not path.exists() else
                                f"rule file {path} is a folder; name the .rules file")
        if path.suffix == ".pb":
            from graphsub.rules.taso import import_taso_rules

            rules += import_taso_rules(path, check=check, decide=decide).rules
        else:
            try:
                text = path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                raise GraphsubError(f"rule file {path} is not text in UTF-8; give a graphsub "
                                    ".rules file, or TASO's rules as a .pb file") from None
            rules += _checked(str(path), text, check, decide)
    seen: dict[str, str] = {}
    for r in rules:
        if r.name in seen:
            raise GraphsubError(f"rule {r.name!r} is defined twice ({seen[r.name]} and {r.origin})")
        seen[r.name] = r.origin
    return rules


def builtin_rules(check: bool = False) -> list[Rule]:
    """The built-in library (src/graphsub/rules/library/*.rules). Its rules are verified
    where graphsub is built (every rule's two sides in the test suite, `graphsub verify`),
    not checked again at every first run: that took seconds of a user's first compilation;
    `check=True` checks them numerically as a user's file is checked."""
    return load_rules(library_files(), check=check)


__all__ = ["Match", "Rejection", "Rule", "RuleCheckError", "RuleSyntaxError", "apply_match", "builtin_rules",
           "check_rule", "find_matches", "library_files", "load_python_rules", "load_rules",
           "parse_rules", "print_rule", "print_rules", "python_rule"]
