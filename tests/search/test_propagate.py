"""What a search found in one block is applied in every block like it (issue 29): the rules
its trace used, wherever they lower the cost, each step priced, the result equivalent."""

from __future__ import annotations

import numpy as np

from graphsub.cost import AnalyticCostModel
from graphsub.ir import GraphBuilder
from graphsub.rules import builtin_rules
from graphsub.runtime import evaluate, graph_input_specs, random_feeds
from graphsub.search import Limits, backtracking_search
from graphsub.search.propagate import propagate

RULES = builtin_rules(check=False)
COST = AnalyticCostModel()


def layers(n: int):
    """n copies of one block: a product with a bias, through a reshape pair that folds."""
    b = GraphBuilder(seed=1)
    x = b.input("x", (8, 64))
    for _ in range(n):
        h = b.add(b.matmul(x, b.he_weight((64, 64))), b.uniform_weight((64,), -0.5, 0.5))
        x = b.relu(b.reshape(b.reshape(h, shape=(8, 4, 16)), shape=(8, 64)))
    b.output(x, "y")
    return b.build()


def test_one_layers_rewrite_reaches_every_layer():
    graph = layers(6)
    first = backtracking_search(graph, RULES, COST, Limits(budget=1))
    assert sum(first.rules_used().values()) == 1  # one expansion: one rewrite, one layer
    spread = propagate(first, RULES, COST, deadline=None)
    (rule,) = first.rules_used()
    assert spread.rules_used()[rule] == 6 and spread.stats.propagated == 5
    assert set(spread.rules_used()) == {rule}  # only the rules the search used
    assert spread.final_cost < first.final_cost
    assert spread.final_cost == COST.graph_cost(spread.graph)
    assert spread.candidates[0].graph is spread.graph
    feeds = random_feeds(graph_input_specs(graph), seed=3)
    want, got = evaluate(graph, feeds)["y"], evaluate(spread.graph, feeds)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_nothing_more_to_apply_leaves_the_result_as_it_was():
    graph = layers(2)
    full = backtracking_search(graph, RULES, COST, Limits(budget=200))
    assert propagate(full, RULES, COST, deadline=None) is full
    empty = backtracking_search(graph, [], COST, Limits(budget=5))
    assert propagate(empty, RULES, COST, deadline=None) is empty


def test_a_passed_deadline_applies_nothing():
    first = backtracking_search(layers(4), RULES, COST, Limits(budget=1))
    assert propagate(first, RULES, COST, deadline=0.0) is first
