"""One rule, every form: GELU as exporters, TensorFlow and model code write it (erf or tanh,
any association and order of its products and sums, constants divided or multiplied,
pow(x, 3) or x * x * x, in float32 and float16) becomes one operator through the library's
normal form, and computes what it computed (graphsub.rules.chains, library/activations.rules).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphsub
from graphsub.cost import AnalyticCostModel
from graphsub.rules import builtin_rules, find_matches, parse_rules
from graphsub.rules.explain import explain
from graphsub.runtime import evaluate, graph_input_specs, random_feeds
from graphsub.verdicts.equivalence import SAME_FUNCTION, compare_outputs
from graphsub.rules.roles import Role, with_role
from graphsub.search.normal_form import normal_form

RULES = with_role(builtin_rules(), Role.NORMAL_FORM)
SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
N = helper.make_node

#: name -> (nodes from input x to output y, constants, approximate). Each as an exporter or a
#: framework writes it (the comment), or a re-association of one.
FORMS = {
    # TorchScript exporter, opset < 20: (x * (erf(x / sqrt 2) + 1)) * 0.5
    "torchscript-erf": ([N("Div", ["x", "sqrt2"], ["a"]), N("Erf", ["a"], ["b"]),
                         N("Add", ["b", "one"], ["c"]), N("Mul", ["x", "c"], ["d"]),
                         N("Mul", ["d", "half"], ["y"])],
                        {"sqrt2": math.sqrt(2), "one": 1.0, "half": 0.5}, "none"),
    # torch's decomposition (dynamo exporter, inductor): x * 0.5 * (1 + erf(x * 0.7071))
    "torch-erf": ([N("Mul", ["x", "half"], ["h"]), N("Mul", ["x", "r"], ["a"]),
                   N("Erf", ["a"], ["b"]), N("Add", ["b", "one"], ["c"]),
                   N("Mul", ["h", "c"], ["y"])],
                  {"r": 1 / math.sqrt(2), "one": 1.0, "half": 0.5}, "none"),
    # TensorFlow / tf2onnx: 0.5 * x * (1 + erf(x / sqrt 2)), the constants first
    "tensorflow-erf": ([N("Mul", ["half", "x"], ["h"]), N("Div", ["x", "sqrt2"], ["a"]),
                        N("Erf", ["a"], ["b"]), N("Add", ["one", "b"], ["c"]),
                        N("Mul", ["h", "c"], ["y"])],
                       {"sqrt2": math.sqrt(2), "one": 1.0, "half": 0.5}, "none"),
    # the half applied last, as a division: (x * (1 + erf(x * 0.7071))) / 2
    "halved-last": ([N("Mul", ["x", "r"], ["a"]), N("Erf", ["a"], ["b"]),
                     N("Add", ["b", "one"], ["c"]), N("Mul", ["c", "x"], ["d"]),
                     N("Div", ["d", "two"], ["y"])],
                    {"r": 1 / math.sqrt(2), "one": 1.0, "two": 2.0}, "none"),
    # the half inside: x * (0.5 * (1 + erf(x / sqrt 2)))
    "half-inside": ([N("Div", ["x", "sqrt2"], ["a"]), N("Erf", ["a"], ["b"]),
                     N("Add", ["one", "b"], ["c"]), N("Mul", ["half", "c"], ["d"]),
                     N("Mul", ["x", "d"], ["y"])],
                    {"sqrt2": math.sqrt(2), "one": 1.0, "half": 0.5}, "none"),
    # torch's tanh decomposition: x * x * x, 0.5 * x * (1 + tanh(c * (x + k * x^3)))
    "torch-tanh": ([N("Mul", ["x", "x"], ["x2"]), N("Mul", ["x2", "x"], ["x3"]),
                    N("Mul", ["x3", "k"], ["kx3"]), N("Add", ["x", "kx3"], ["i"]),
                    N("Mul", ["i", "c"], ["ci"]), N("Tanh", ["ci"], ["t"]),
                    N("Add", ["t", "one"], ["o"]), N("Mul", ["x", "half"], ["h"]),
                    N("Mul", ["h", "o"], ["y"])],
                   {"k": 0.044715, "c": SQRT_2_OVER_PI, "one": 1.0, "half": 0.5}, "tanh"),
    # GPT-2's NewGELU and TensorFlow's approximate gelu: pow(x, 3.0)
    "gpt2-tanh-pow": ([N("Pow", ["x", "three"], ["x3"]), N("Mul", ["k", "x3"], ["kx3"]),
                       N("Add", ["x", "kx3"], ["i"]), N("Mul", ["c", "i"], ["ci"]),
                       N("Tanh", ["ci"], ["t"]), N("Add", ["one", "t"], ["o"]),
                       N("Mul", ["half", "x"], ["h"]), N("Mul", ["h", "o"], ["y"])],
                      {"three": 3.0, "k": 0.044715, "c": SQRT_2_OVER_PI, "one": 1.0,
                       "half": 0.5}, "tanh"),
    # Megatron's and T5's: sqrt(2/pi) x factored out, x * 0.5 * (1 + tanh(c x (1 + k x x)))
    "megatron-tanh": ([N("Mul", ["x", "x"], ["x2"]), N("Mul", ["k", "x2"], ["kx2"]),
                       N("Add", ["one", "kx2"], ["p"]), N("Mul", ["c", "x"], ["cx"]),
                       N("Mul", ["cx", "p"], ["ci"]), N("Tanh", ["ci"], ["t"]),
                       N("Add", ["one", "t"], ["o"]), N("Mul", ["x", "half"], ["h"]),
                       N("Mul", ["h", "o"], ["y"])],
                      {"k": 0.044715, "c": 0.79788456, "one": 1.0, "half": 0.5}, "tanh"),
}


def gelu_model(nodes, constants, dtype=TensorProto.FLOAT, shape=(4, 16)):
    numpy_type = np.float16 if dtype == TensorProto.FLOAT16 else np.float32
    weights = [numpy_helper.from_array(np.array(v, dtype=numpy_type), name=k)
               for k, v in constants.items()]
    graph = helper.make_graph(nodes, "gelu", [helper.make_tensor_value_info("x", dtype, shape)],
                              [helper.make_tensor_value_info("y", dtype, shape)], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def assert_one_gelu(graph, approximate, count=1):
    """The normal form computes the graph's function with `count` GELUs and nothing of
    their primitives left."""
    rewritten, steps = normal_form(graph, RULES, AnalyticCostModel("cpu"))
    gelus = [rewritten[n] for n in rewritten.nodes_by_op("gelu")]
    assert len(gelus) == count, [s.rule for s in steps]
    assert all(g.attrs["approximate"] == approximate for g in gelus)
    for op in ("erf", "tanh", "pow"):
        assert not rewritten.nodes_by_op(op)
    feeds = random_feeds(graph_input_specs(graph), seed=5)
    tolerance = SAME_FUNCTION.for_precision({t.dtype for n in graph.nodes.values()
                                             for t in n.outputs})
    diffs, problems = compare_outputs(evaluate(graph, feeds), evaluate(rewritten, feeds),
                                      tolerance)
    assert not problems and all(d.ok for d in diffs), [d.describe() for d in diffs]
    return rewritten


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("dtype", [TensorProto.FLOAT, TensorProto.FLOAT16],
                         ids=["float32", "float16"])
def test_every_written_form_of_gelu_becomes_one_operator(form, dtype):
    nodes, constants, approximate = FORMS[form]
    assert_one_gelu(graphsub.load(gelu_model(nodes, constants, dtype).SerializeToString()),
                    approximate)


def test_an_integer_exponent_and_a_broadcast_constant_are_read_too():
    """tf2onnx writes the cube's exponent as it was typed; a constant may be a one-element
    tensor that broadcasts."""
    nodes, constants, _ = FORMS["gpt2-tanh-pow"]
    model = gelu_model(nodes, {k: v for k, v in constants.items() if k != "three"})
    model.graph.initializer.append(numpy_helper.from_array(np.array(3, np.int64), "three"))
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(
        np.array([0.044715], np.float32), "k"))
    assert_one_gelu(graphsub.load(model.SerializeToString()), "tanh")


def test_a_wrong_constant_is_not_a_gelu():
    """Constants are compared by value: 0.7 for 1/sqrt(2) is another function."""
    nodes, constants, _ = FORMS["torch-erf"]
    graph = graphsub.load(gelu_model(nodes, {**constants, "r": 0.7}).SerializeToString())
    rewritten, _ = normal_form(graph, RULES, AnalyticCostModel("cpu"))
    assert not rewritten.nodes_by_op("gelu")


def rule(text):
    [r] = parse_rules(text)
    return r


def test_a_chain_matches_any_association_and_reads_a_division_as_its_reciprocal():
    r = rule("rule r: (mul (mul ?x ?c) (erf ?x)) => (mul ?x (erf ?x)) where (close-to ?c 0.5)")
    for nodes in ([N("Mul", ["x", "c"], ["p"]), N("Erf", ["x"], ["e"]),
                   N("Mul", ["p", "e"], ["y"])],                       # (x * c) * erf x
                  [N("Erf", ["x"], ["e"]), N("Mul", ["e", "c"], ["p"]),
                   N("Mul", ["x", "p"], ["y"])],                       # x * (erf x * c)
                  [N("Erf", ["x"], ["e"]), N("Mul", ["e", "x"], ["p"]),
                   N("Div", ["p", "two"], ["y"])]):                    # (erf x * x) / 2
        graph = graphsub.load(gelu_model(nodes, {"c": 0.5, "two": 2.0}).SerializeToString())
        assert len(find_matches(graph, r)) == 1


def test_a_reciprocal_is_only_compared_never_built():
    """Reading x / 2 as x * 0.5 lets a rule recognise a form; a rule whose target would build
    with the reciprocal does not match there, so no rule turns divisions into products."""
    builds = rule("rule r: (mul (mul ?x ?c) (erf ?x)) => (mul ?c (mul ?x (erf ?x)))")
    nodes = [N("Erf", ["x"], ["e"]), N("Mul", ["e", "x"], ["p"]), N("Div", ["p", "two"], ["y"])]
    graph = graphsub.load(gelu_model(nodes, {"two": 2.0}).SerializeToString())
    assert find_matches(graph, builds) == []
    nodes[-1] = N("Mul", ["p", "two"], ["y"])
    graph = graphsub.load(gelu_model(nodes, {"two": 2.0}).SerializeToString())
    assert len(find_matches(graph, builds)) == 1


def test_a_chain_of_distinct_variables_matches_as_written():
    """Associativity's own rules (mul-assoc) are about the association: they are not read in
    every form, and a rule with no chain matches a product as written."""
    assoc = rule("rule a: (mul (mul ?x ?y) ?z) => (mul ?x (mul ?y ?z))")
    nodes = [N("Erf", ["x"], ["e"]), N("Mul", ["e", "c"], ["p"]), N("Mul", ["x", "p"], ["y"])]
    graph = graphsub.load(gelu_model(nodes, {"c": 0.5}).SerializeToString())
    assert [m.roots[0].node for m in find_matches(graph, assoc)] == []
    plain = rule("rule p: (mul ?x ?c) => ?x where (close-to ?c 0.5)")
    nodes = [N("Div", ["x", "two"], ["y"])]
    graph = graphsub.load(gelu_model(nodes, {"two": 2.0}).SerializeToString())
    assert find_matches(graph, plain) == []


def test_explain_says_when_no_association_fits():
    nodes = [N("Erf", ["x"], ["e"]), N("Mul", ["x", "e"], ["y"])]
    graph = graphsub.load(gelu_model(nodes, {}).SerializeToString())
    [gelu] = [r for r in builtin_rules() if r.name == "gelu-kernel"]
    [e] = explain(graph, gelu)
    assert not e.matched and "not a chain of 3 operands of mul" in e.reason
