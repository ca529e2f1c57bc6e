"""The rule text format: parsing, printing, round trips and clear syntax errors."""

from __future__ import annotations

import pytest

from graphsub.rules import (RuleSyntaxError, builtin_rules, library_files, parse_rules,
                            print_rule, print_rules)
from graphsub.rules.ast import AVar, Call, Lit, ListExpr, OpTerm, OutRef, Ref, Var

MERGE = """
# Two matmuls sharing an input.
rule merge:
  (matmul ?x ?w1 :activation ?a), (matmul ?x ?w2 :activation ?a)
  => let y = (matmul ?x (concat :axis -1 ?w1 ?w2) :activation ?a)
     in (split :axis -1 :sizes [(dim ?w1 -1) (dim ?w2 -1)] y).0,
        (split :axis -1 :sizes [(dim $0 -1) (dim $1 -1)] y).1
  where (eq (rank ?w1) 2), (weight ?w2)
"""


def test_parse_builds_the_expected_tree():
    (rule,) = parse_rules(MERGE)
    assert rule.name == "merge" and rule.doc == "Two matmuls sharing an input."
    assert rule.sources[0] == OpTerm("matmul", (("activation", AVar("a")),), (Var("x"), Var("w1")))
    (name, let_term), = rule.lets
    assert name == "y" and let_term.op == "matmul"
    split0, split1 = rule.targets
    assert split0.index == 0 and split1.index == 1 and split1.args == (Ref("y"),)
    assert dict(split0.attrs)["sizes"] == ListExpr((Call("dim", (AVar("w1"), Lit(-1))),
                                                    Call("dim", (AVar("w2"), Lit(-1)))))
    assert dict(split1.attrs)["sizes"].items[0].args[0] == OutRef(0)
    assert rule.conditions[1] == Call("weight", (AVar("w2"),))


def test_printer_and_parser_round_trip_every_library_rule():
    rules = builtin_rules(check=False)
    assert len(rules) >= 40
    again = parse_rules(print_rules(rules))
    assert again == rules
    for r in rules:
        assert parse_rules(print_rule(r)) == [r]


def test_literals_round_trip():
    text = "rule lits:\n  (clip ?x :min -1.5 :max 2e-3) => (clip ?x :min -1.5 :max 0.002)\n"
    (r,) = parse_rules(text)
    assert dict(r.sources[0].attrs)["min"] == Lit(-1.5)
    assert parse_rules(print_rule(r)) == [r]


@pytest.mark.parametrize("text, message", [
    ("rule r: (relu ?x) => ", "unexpected end"),
    ("rule r: (relu ?x) => (relu ?x), (relu ?x)", r"1 source term\(s\) but 2 target"),
    ("rule r: (relu ?x) (relu ?y)", "expected '=>'"),
    ("relu ?x", "expected 'rule'"),
    ("rule r: (relu ?x) => (relu @)", "unexpected character '@'"),
])
def test_syntax_errors_are_clear(text, message):
    with pytest.raises(RuleSyntaxError, match=message):
        parse_rules(text)


def test_library_files_exist_and_are_packaged():
    names = {p.name for p in library_files()}
    assert {"fusion.rules", "merge.rules", "algebra.rules", "cleanup.rules"} <= names
