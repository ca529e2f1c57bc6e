"""The search registry: every algorithm is found by name, and optimize() hands each only the
settings it declares (no branching on algorithm families)."""

from __future__ import annotations

import pytest

import graphsub
from graphsub import zoo
from graphsub.cost import AnalyticCostModel
from graphsub.search import registry
from graphsub.search.result import OptimizeResult, SearchStats


def test_every_algorithm_is_registered_with_the_settings_it_takes():
    import graphsub.optimizer  # noqa: F401  (imports the e-graph searches too)

    algorithms = registry.ALGORITHMS
    assert set(algorithms) == {"backtracking", "greedy", "pruning", "dpp", "sampling",
                               "enumeration", "eqsat", "mcts"}
    assert algorithms["backtracking"].settings == {"alpha", "budget"}
    assert algorithms["pruning"].settings == {"k"}
    assert algorithms["eqsat"].egraph and not algorithms["greedy"].egraph
    with pytest.raises(ValueError, match="unknown settings"):
        registry.register("nothing", ("temperature",))


def test_optimize_hands_a_search_only_its_settings(monkeypatch):
    seen: dict[str, object] = {}

    def probe(graph, rules, cost_model, **kwargs):
        seen.update(kwargs)
        cost = cost_model.graph_cost(graph)
        return OptimizeResult(graph, (), SearchStats(), cost, cost, [])

    monkeypatch.setitem(registry.ALGORITHMS, "probe",
                        registry.SearchAlgorithm("probe", probe, frozenset({"k"})))
    monkeypatch.setattr(graphsub.optimizer, "check_settings", lambda *a, **k: None)
    graphsub.optimize(zoo.build("squeezenet"), [], "probe", alpha=2.0, k=4, budget=7,
                      cost=AnalyticCostModel("cpu"), time_limit=1)
    assert seen.keys() == {"time_limit", "progress", "keep", "k"} and seen["k"] == 4
