"""egg's back-off scheduler in equality saturation, and the record of each iteration."""

from __future__ import annotations

import pytest

from graphsub import zoo
from graphsub.cost import AnalyticCostModel
from graphsub.egraph.saturation import EqsatOptions, eqsat_search
from graphsub.egraph.schedule import BackoffScheduler
from graphsub.errors import GraphsubError
from graphsub.pipeline import Settings
from graphsub.rules import builtin_rules
from graphsub.search import Limits
from tests.egraph.test_egraph_search import assert_equivalent

RULES = builtin_rules(check=False)
COST = AnalyticCostModel("a100")


def test_a_rule_over_its_limit_is_banned_and_each_ban_doubles():
    s = BackoffScheduler(match_limit=10, ban_length=2)
    assert s.admit(0, 0, 10)  # at the limit: applied
    assert not s.admit(0, 0, 11)  # over it: banned for 2 iterations
    assert not s.can_search(0, 1) and s.can_search(0, 2)
    assert s.banned(1) == [0] and s.banned(2) == []
    assert s.admit(0, 2, 20)  # the limit is now 20
    assert not s.admit(0, 2, 21)  # banned again, for 4 iterations
    assert not s.can_search(0, 5) and s.can_search(0, 6)
    assert s.can_search(1, 0)  # other rules are not touched


def test_exempt_rules_are_never_banned():
    s = BackoffScheduler(match_limit=1, ban_length=5, exempt=frozenset({3}))
    assert s.admit(3, 0, 1_000_000) and s.can_search(3, 1)


def test_an_unchanged_iteration_with_rules_banned_is_not_saturation():
    """egg's fast-forward: the bans are lifted and the search goes on."""
    s = BackoffScheduler(match_limit=1, ban_length=100)
    s.admit(0, 0, 5)
    assert not s.can_stop(1)
    assert s.can_search(0, 1) and s.banned(1) == []
    assert s.can_stop(1)


def test_the_backoff_scheduler_saturates_to_the_same_best_graph_and_records_iterations():
    """A match limit of 2 bans most rules of squeezenet's first iterations; the bans are
    lifted when nothing else changes, so the e-graph still saturates, and the best graph
    costs what every rule every iteration finds."""
    graph = zoo.build("squeezenet")
    simple = eqsat_search(graph, RULES, COST, Limits(time=60), EqsatOptions(scheduler="simple"))
    backoff = eqsat_search(graph, RULES, COST, Limits(time=60),
                           EqsatOptions(match_limit=2, ban_length=1))
    assert backoff.stats.egraph["stopped_by"] == "saturated"
    assert backoff.final_cost == pytest.approx(simple.final_cost, rel=1e-9)
    assert_equivalent(graph, backoff.graph)
    log = backoff.stats.egraph["log"]
    assert [r["iteration"] for r in log] == list(range(backoff.stats.egraph["iterations"]))
    assert any(r["banned"] for r in log)
    assert not any(r["banned"] for r in simple.stats.egraph["log"])
    assert sum(sum(r["applied"].values()) for r in log) == \
        backoff.stats.egraph["applications"]
    for r in log:
        assert r["search_s"] >= 0 and r["apply_s"] >= 0 and r["rebuild_s"] >= 0
        assert r["nodes"] >= r["classes"] > 0


@pytest.mark.parametrize("options, message", [
    ({"scheduler": "fifo"}, "unknown e-graph scheduler 'fifo'"),
    ({"match_limit": 0}, "must be at least 1"),
])
def test_bad_scheduler_options_are_clear_errors_where_settings_are_made(options, message):
    with pytest.raises(GraphsubError, match=message):
        Settings.make(algorithm="eqsat", **options)
    with pytest.raises(GraphsubError, match="unknown e-graph scheduler|must be positive"):
        EqsatOptions(**options)
