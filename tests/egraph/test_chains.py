"""Chains in the e-graph: a rule whose source is a product or sum of three or more operands
matches in eqsat and mcts in any association and operand order, as it does in a graph
(graphsub.rules.chains), so that the e-graph searches and the graph searches apply the same
rules to the same models."""

from __future__ import annotations

import numpy as np
import pytest

from graphsub.cost import AnalyticCostModel
from graphsub.egraph.egraph import egraph_from_graph
from graphsub.egraph.ematch import match_source, term_depth
from graphsub.ir import GraphBuilder
from graphsub.ir.graph import Value
from graphsub.optimizer import optimize
from graphsub.rules import parse_rules
from graphsub.rules.matcher import find_matches
from graphsub.runtime import evaluate, graph_input_specs, random_feeds

# Two exponentials in one product are one exponential of the sum (one exp fewer); the
# product's three factors written as one association of them.
PRODUCT = parse_rules("""
rule exp-product:
  (mul (mul (exp ?a) (exp ?b)) ?c) => (mul (exp (add ?a ?b)) ?c)
""")[0]
# A negated term in a sum is a subtraction (one neg fewer).
SUM = parse_rules("""
rule sum-with-negation:
  (add (add ?a (neg ?b)) ?c) => (add (sub ?a ?b) ?c)
""")[0]


def product_graph(form: str):
    """exp(a) * exp(b) * c in another association and order than the rule's: no product of
    the two exponentials, so the rule's tree as written matches nowhere."""
    b = GraphBuilder(seed=0)
    x, y, z = (b.input(name, (8, 64)) for name in ("x", "y", "z"))
    ex, ey = b.exp(x), b.exp(y)
    if form == "right":    # exp(y) * (z * exp(x))
        out = b.mul(ey, b.mul(z, ex))
    else:                  # (exp(x) * z) * exp(y)
        out = b.mul(b.mul(ex, z), ey)
    b.output(b.tanh(out), "out")
    return b.build()


def sum_graph(form: str):
    """x + (-y) + z in another association and order than the rule's: the negation is
    added last, so the rule's tree as written matches nowhere."""
    b = GraphBuilder(seed=0)
    x, y, z = (b.input(name, (8, 64)) for name in ("x", "y", "z"))
    if form == "right":    # neg(y) + (x + z)
        out = b.add(b.neg(y), b.add(x, z))
    else:                  # (z + x) + neg(y)
        out = b.add(b.add(z, x), b.neg(y))
    b.output(b.tanh(out), "out")
    return b.build()


CASES = [(PRODUCT, product_graph, "exp"), (SUM, sum_graph, "neg")]


def assert_same_outputs(a, b):
    feeds = random_feeds(graph_input_specs(a), seed=3)
    ra, rb = evaluate(a, feeds), evaluate(b, feeds)
    for name in ra:
        np.testing.assert_allclose(rb[name], ra[name], rtol=1e-5, atol=1e-6)


def compute_ops(graph):
    return [graph[n].op for n in graph.topo_order() if graph[n].op != "input"]


@pytest.mark.parametrize("rule, build, saved", CASES, ids=["product", "sum"])
@pytest.mark.parametrize("form", ["right", "left"])
@pytest.mark.parametrize("algorithm", ["eqsat", "mcts", "greedy", "backtracking"])
def test_a_chain_rule_applies_to_any_association_and_order(rule, build, saved, form,
                                                           algorithm):
    graph = build(form)
    result = optimize(graph, [rule], algorithm, rules_only=True, time_limit=20,
                      cost=AnalyticCostModel("cpu"), **({"budget": 8} if algorithm == "mcts"
                                                        else {}))
    assert result.rules_used()[rule.name] >= 1, result.rules_used()
    assert compute_ops(result.graph).count(saved) == compute_ops(graph).count(saved) - 1
    assert_same_outputs(graph, result.graph)


@pytest.mark.parametrize("rule, build", [(PRODUCT, product_graph), (SUM, sum_graph)],
                         ids=["product", "sum"])
@pytest.mark.parametrize("form", ["right", "left"])
def test_the_e_matcher_binds_a_chain_as_the_graph_matcher_does(rule, build, form):
    """The same bindings at the same root: the e-graph of a graph has one class per value,
    so a match binds the classes of the values the graph's match binds."""
    graph = build(form)
    enc = egraph_from_graph(graph)
    class_of = {Value(nid, 0): cls for nid, cls in zip(graph.inputs, enc.inputs)}
    (root,) = enc.outputs
    in_graph = {frozenset((k, class_of[v]) for k, v in m.tensors.items())
                for m in find_matches(graph, rule)}
    in_egraph = {frozenset(tensors.items()) for _, tensors, _ in
                 match_source(enc.egraph, rule.sources[0])}
    assert in_graph == in_egraph and len(in_graph) >= 1
    roots = {r for r, _, _ in match_source(enc.egraph, rule.sources[0])}
    assert roots == {enc.egraph.node(n).children[0] for n in enc.egraph.nodes_of(root)}


def test_a_chain_is_searched_as_deep_as_its_deepest_association():
    """Semi-naive matching re-searches roots up to a pattern's depth above what changed: a
    chain of three is read down to two products above its deepest operand (x * (h * exp a)),
    one level deeper than the tree as written."""
    (rule,) = parse_rules("rule r: (mul (mul ?x ?h) (exp ?a)) => (mul ?x (mul ?h (exp ?a)))")
    assert term_depth(rule.sources[0]) == 3
    (plain,) = parse_rules("rule p: (mul (mul ?x ?y) ?z) => (mul ?x (mul ?y ?z))")
    assert term_depth(plain.sources[0]) == 2  # distinct variables alone: matched as written
