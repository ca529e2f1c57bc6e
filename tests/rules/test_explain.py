"""`explain`: why a rule matches a node or where it fails, checked against the matcher on
hand-made graphs and on every rule of the library over zoo models."""

from __future__ import annotations

import json

import pytest
from onnx import helper
from typer.testing import CliRunner

import graphsub
from graphsub import zoo
from graphsub.cli import app
from graphsub.rules import builtin_rules, find_matches, parse_rules
from graphsub.rules.explain import explain
from graphsub.rules.matcher import root_ops
from tests.onnx_io.helpers import make_model, vi

RULES = builtin_rules(check=False)


def rule(text: str):
    return parse_rules(text)[0]


def transposed_relu(perm: list[int]):
    """y = relu(transpose(x, perm)) on a 4x6 input (4x6 or 6x4 out)."""
    out = [6, 4] if perm == [1, 0] else [4, 6]
    return graphsub.load(make_model(
        [helper.make_node("Transpose", ["x"], ["t"], perm=perm),
         helper.make_node("Relu", ["t"], ["y"])], [vi("x", [4, 6])], [vi("y", out)]))


RELU_OF_TRANSPOSE = rule("rule relu-of-transpose:\n"
                         "  (relu (transpose :perm [1 0] ?x)) => (transpose :perm [1 0] (relu ?x))")


def test_a_match_is_rewritten():
    [e] = explain(transposed_relu([1, 0]), RELU_OF_TRANSPOSE)
    assert e.matched and e.rewritten and "rewritten" in e.reason


def test_the_failure_deepest_in_the_pattern_is_the_one_given():
    graph = transposed_relu([0, 1])
    [e] = explain(graph, RELU_OF_TRANSPOSE)
    transpose = next(n for n in graph.nodes if graph[n].op == "transpose")
    assert not e.matched and e.at == transpose
    assert e.pattern == "(transpose :perm [1 0] ?x)"
    assert e.reason == "perm is (0, 1), the pattern asks for (1, 0)"


def test_an_operator_that_is_not_the_patterns_is_named():
    graph = graphsub.load(make_model([helper.make_node("Sigmoid", ["x"], ["s"]),
                                      helper.make_node("Relu", ["s"], ["y"])],
                                     [vi("x", [4, 6])], [vi("y", [4, 6])]))
    [e] = explain(graph, RELU_OF_TRANSPOSE)
    assert e.reason == f"node {e.at} is sigmoid, the pattern asks for transpose"


def test_a_variable_bound_twice_and_a_failing_condition():
    graph = graphsub.load(make_model([helper.make_node("Add", ["a", "b"], ["y"])],
                                     [vi("a", [4]), vi("b", [4])], [vi("y", [4])]))
    [e] = explain(graph, rule("rule double: (add ?x ?x) => (add ?x ?x)"))
    assert not e.matched and e.reason == "?x is already bound to another tensor"
    [e] = explain(graph, rule("rule ranked: (add ?x ?y) => (add ?y ?x) where (eq (rank ?x) 3)"))
    assert e.reason == "the condition (eq (rank ?x) 3) does not hold"
    assert e.pattern == "(eq (rank ?x) 3)"


def test_no_node_of_the_first_patterns_operator_is_an_empty_answer():
    assert explain(transposed_relu([1, 0]), rule("rule c: (sigmoid ?x) => (sigmoid ?x)")) == []


@pytest.mark.parametrize("model", ["bert", "squeezenet", "nasrnn", "resnext50"])
def test_every_library_rule_is_explained_as_the_matcher_finds(model):
    """For every rule of the library: an answer at each node of its first pattern's
    operator, `matched` exactly where the matcher finds a match rooted there, a reason
    wherever it does not."""
    graph = zoo.build(model)
    for r in RULES:
        found = explain(graph, r)
        roots = {m.roots[0].node for m in find_matches(graph, r)}
        assert {e.node for e in found if e.matched} == roots, r.name
        assert {e.node for e in found} == {n for op in root_ops(r)
                                           for n in graph.nodes_by_op(op)}, r.name
        assert all(e.reason for e in found)
        assert all(e.pattern for e in found if not e.matched), r.name


runner = CliRunner()


def test_explain_command_lists_nodes_and_answers_in_json():
    result = runner.invoke(app, ["explain", "merge-matmuls-shared-input", "bert", "--show", "3"])
    assert result.exit_code == 0, result.output
    assert "matmul node(s) in bert" in result.output and "more" in result.output
    result = runner.invoke(app, ["explain", "merge-matmuls-shared-input", "bert", "--json"])
    data = json.loads(result.output)
    assert data["rule"] == "merge-matmuls-shared-input"
    assert any(n["rewritten"] for n in data["nodes"])


def test_an_unknown_rule_is_one_clear_line_with_close_names():
    result = runner.invoke(app, ["explain", "merge-matmul-shared-input", "bert"])
    assert result.exit_code == 2
    assert "no rule named 'merge-matmul-shared-input'" in result.output
    assert "did you mean merge-matmuls-shared-input" in result.output
