"""The run's time budget: each stage's clock, and what a Ctrl-C in the search leaves to
measuring."""

from __future__ import annotations

import time

import pytest

from graphsub.budget import Budget, measure_reserve


def test_the_search_leaves_the_measure_reserve_and_measuring_ends_at_the_limit():
    budget = Budget(time_limit=300.0)
    search = budget.clock("search")
    assert search.deadline == pytest.approx(budget.started + 300.0 - measure_reserve(300.0))
    assert budget.clock("measure").deadline == pytest.approx(budget.started + 300.0)


def test_after_a_ctrl_c_measuring_gets_its_reserve_from_then_not_the_whole_limit():
    budget = Budget(time_limit=300.0, started=time.perf_counter() - 10.0)
    budget.clock("search")
    budget.interrupted()
    measure = budget.clock("measure")
    assert measure.remaining() == pytest.approx(measure_reserve(300.0), abs=1.0)
    assert measure_reserve(300.0) == 60.0  # not the 290 s the limit had left


def test_an_interruption_after_the_window_changes_nothing():
    budget = Budget(time_limit=10.0, started=time.perf_counter() - 9.5)
    budget.interrupted()
    assert budget.clock("measure").deadline == pytest.approx(budget.started + 10.0)


def test_a_measure_limit_is_measurings_own_whatever_the_search_did():
    budget = Budget(time_limit=5.0, measure_limit=30.0)
    budget.interrupted()
    assert budget.clock("measure").remaining() == pytest.approx(30.0, abs=1.0)
