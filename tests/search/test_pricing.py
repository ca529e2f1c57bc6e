"""price_rewrite gives exactly the cost and size of the graph apply_match builds."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from graphsub import zoo
from graphsub.cost import AnalyticCostModel, MultiObjectiveCostModel, Weights
from graphsub.rules import builtin_rules, load_rules
from graphsub.search import pricing
from graphsub.rules.applier import Rejection, apply_match
from graphsub.rules.rematching import IncrementalMatcher
from graphsub.search.pricing import price_rewrite

TASO_PB = Path(__file__).resolve().parents[3] / "shared" / "data" / "taso" / "graph_subst.pb"


@pytest.fixture(scope="module")
def rules():
    taso = load_rules([TASO_PB]) if TASO_PB.exists() else []
    return builtin_rules() + taso


def check_children(graph, matcher, cost_model, counts):
    """Every match of `graph`: priced == built. Returns the children that were built."""
    children = []
    for matches in matcher.matches(graph):
        for match in matches:
            priced = price_rewrite(graph, match, cost_model)
            built = apply_match(graph, match)
            if isinstance(built, Rejection):
                # Pricing does not prove acyclicity: a priced child may be a cyclic one.
                assert isinstance(priced, Rejection) or built.reason == "cycle", match.rule.name
                continue
            assert not isinstance(priced, Rejection), (match.rule.name, priced)
            assert priced.nodes == len(built), match.rule.name
            assert math.isclose(priced.cost, cost_model.graph_cost(built), rel_tol=1e-9,
                                abs_tol=1e-15), match.rule.name
            counts["priced"] += 1
            children.append(built)
    return children


@pytest.mark.parametrize("model", ["nasrnn", "bert", "squeezenet", "nasnet_a", "resnext50",
                                   "inception_e_blocks:n=1", "sru"])
def test_priced_children_cost_what_built_children_cost(model, rules, monkeypatch):
    """On zoo models and on graphs reached by random rewrite walks (so that parents are
    themselves edited graphs), with the built-in and TASO's rules."""
    built_calls = []
    real = pricing._built_and_priced
    monkeypatch.setattr(pricing, "_built_and_priced",
                        lambda *a: built_calls.append(1) or real(*a))
    rng = random.Random(0)
    cost_model = AnalyticCostModel("a100")
    matcher = IncrementalMatcher(rules)
    counts = {"priced": 0}
    graph = zoo.build(model)
    for _ in range(3):
        children = check_children(graph, matcher, cost_model, counts)
        if not children:
            break
        graph = rng.choice(children)
    assert counts["priced"] > 20
    # The shortcut, not the fallback, priced almost all of them.
    assert len(built_calls) < 0.1 * counts["priced"]


def test_costs_that_are_not_a_sum_over_nodes_are_priced_by_building(rules):
    graph = zoo.build("squeezenet")
    cost_model = MultiObjectiveCostModel(AnalyticCostModel("a100"), Weights(memory=1e-12))
    assert not cost_model.sum_of_nodes
    counts = {"priced": 0}
    check_children(graph, IncrementalMatcher(rules), cost_model, counts)
    assert counts["priced"] > 5
