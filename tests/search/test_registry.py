"""The search contract: every algorithm is found by name with its own options; optimize()
hands a search one Limits and its options, and refuses a setting the algorithm does not have
(no branching on algorithm families)."""

from __future__ import annotations

import dataclasses

import pytest

import graphsub
from graphsub import zoo
from graphsub.cost import AnalyticCostModel
from graphsub.errors import GraphsubError
from graphsub.search import registry
from graphsub.search.result import OptimizeResult, SearchStats


def test_every_algorithm_is_registered_with_its_options_and_budget_unit():
    import graphsub.optimizer  # noqa: F401  (imports the e-graph searches too)

    algorithms = registry.ALGORITHMS
    assert set(algorithms) == {"backtracking", "greedy", "pruning", "dpp", "sampling",
                               "enumeration", "eqsat", "mcts"}
    assert set(algorithms["backtracking"].option_names()) == {"alpha", "max_node_factor"}
    assert algorithms["greedy"].option_names() == ["max_node_factor"]
    assert algorithms["pruning"].option_names() == ["k"]
    assert algorithms["enumeration"].make_options().k == 3
    assert algorithms["backtracking"].default_budget == 1000
    assert algorithms["mcts"].budget_unit == "MCTS iterations per decision"
    assert algorithms["eqsat"].egraph and not algorithms["greedy"].egraph
    for algorithm in algorithms.values():
        options = algorithm.make_options()
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(options, algorithm.option_names()[0], None)
    with pytest.raises(GraphsubError, match="greedy search has no setting alpha"):
        algorithms["greedy"].make_options(alpha=1.2)
    with pytest.raises(TypeError, match="dataclass"):
        registry.register("nothing", dict, "steps", None)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProbeOptions:
    k: int = 1
    temperature: float = 0.5


def test_optimize_hands_a_search_its_limits_and_options(monkeypatch):
    seen: dict[str, object] = {}

    def probe(graph, rules, cost_model, limits=registry.Limits(), options=ProbeOptions()):
        seen.update(limits=limits, options=options)
        cost = cost_model.graph_cost(graph)
        return OptimizeResult(graph, (), SearchStats(), cost, cost, [])

    with pytest.raises(GraphsubError, match="search probe is registered but not declared"):
        registry.register("probe", ProbeOptions, "probes", 3)(probe)
    monkeypatch.setitem(registry.DECLARED, "probe", registry.Declared(__name__, "a test probe"))
    registry.register("probe", ProbeOptions, "probes", 3)(probe)
    assert registry.ALGORITHMS["probe"].summary == "a test probe"
    graph = zoo.build("squeezenet")
    graphsub.optimize(graph, [], "probe", rules_only=True, k=4, budget=7,
                      cost=AnalyticCostModel("cpu"), time_limit=1, options={"temperature": 2.0})
    assert seen["options"] == ProbeOptions(k=4, temperature=2.0)
    limits = seen["limits"]
    assert isinstance(limits, registry.Limits)
    assert (limits.budget, limits.keep) == (7, 5)
    assert 0.5 < limits.time <= 1  # the limit counts from the call: the search gets the rest
    with pytest.raises(GraphsubError, match="probe search has no setting alpha"):
        graphsub.optimize(graph, [], "probe", alpha=2.0, cost=AnalyticCostModel("cpu"))
