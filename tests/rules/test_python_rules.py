"""Rules written as two Python functions (graphsub.rules.python): traced into the rule
language, matched in every form as text rules are, checked numerically like them."""

from __future__ import annotations

import math

import pytest

import graphsub
from graphsub.cost import AnalyticCostModel
from graphsub.rules import (RuleCheckError, builtin_rules, find_matches, load_python_rules,
                            parse_rules, print_rule, python_rule)
from graphsub.rules.python import PythonRuleError
from graphsub.search.normal_form import normal_form
from tests.rules.test_forms import FORMS, gelu_model


def erf_gelu(op, x):
    return x * 0.5 * (1.0 + op.erf(x / math.sqrt(2.0)))


def gelu(op, x):
    return op.gelu(x, approximate="none")


def tanh_gelu(op, x):
    return op.gelu(x, approximate="tanh")


def test_a_python_rule_is_a_rule_of_the_language():
    rule = python_rule("py-gelu", erf_gelu, gelu, where=["(eq (shape $0) (shape ?x))"])
    text = print_rule(rule)
    assert text.startswith("rule py-gelu:\n  (mul (mul ?x ?c0) (add ?c2 (erf (mul ?x ?c1))))")
    assert "(gelu :approximate none ?x)" in text and "(close-to ?c1 0.7071067811865475)" in text
    assert parse_rules(text)[0] == rule


@pytest.mark.parametrize("form", [f for f, (_, _, approximate) in FORMS.items()
                                  if approximate == "none"])
def test_a_python_rule_matches_every_form_the_library_rule_matches(form):
    rule = load_python_rules([python_rule("py-gelu", erf_gelu, gelu,
                                          where=["(eq (shape $0) (shape ?x))"])])[0]
    [library] = [r for r in builtin_rules() if r.name == "gelu-kernel"]
    nodes, constants, _ = FORMS[form]
    graph = graphsub.load(gelu_model(nodes, constants).SerializeToString())
    ours, theirs = find_matches(graph, rule), find_matches(graph, library)
    assert len(ours) == 1 and [m.roots for m in ours] == [m.roots for m in theirs]
    rewritten, _ = normal_form(graph, [rule], AnalyticCostModel("cpu"))
    assert [rewritten[n].op for n in rewritten.nodes_by_op("gelu")] == ["gelu"]


def test_a_wrong_python_rule_fails_its_check(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHSUB_CACHE_DIR", str(tmp_path))
    with pytest.raises(RuleCheckError):
        load_python_rules([python_rule("py-wrong", erf_gelu, tanh_gelu)])


def test_numbers_in_a_replacement_are_constants_of_the_pattern_s_type():
    def scaled(op, x, y):
        return (x * y) * 2.0

    def rescaled(op, x, y):
        return x * (y * 2.0)

    rule = load_python_rules([python_rule("py-scale", scaled, rescaled)])[0]
    assert "(constant :value 2.0 :shape [] :dtype (dtype ?x))" in print_rule(rule)


def test_a_function_that_returns_no_tensor_is_a_clear_error():
    with pytest.raises(PythonRuleError, match="must return tensors"):
        python_rule("bad", lambda op, x: 3, gelu)
    with pytest.raises(PythonRuleError, match="neither a tensor"):
        python_rule("bad", lambda op, x: op.relu("x"), gelu)


def test_an_attribute_variable_carries_an_attribute_over():
    def pattern(op, x):
        return op.relu(op.transpose(x, perm=op.attr("p")))

    def replacement(op, x):
        return op.transpose(op.relu(x), perm=op.attr("p"))

    rule = load_python_rules([python_rule("py-relu-transpose", pattern, replacement)])[0]
    assert print_rule(rule).splitlines()[1:] == ["  (relu (transpose :perm ?p ?x))",
                                                 "  => (transpose :perm ?p (relu ?x))"]
