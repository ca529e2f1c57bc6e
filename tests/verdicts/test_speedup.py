"""The one statistic and decision of every comparison: the interval of the median round's
speedup (against scipy's), the gain convention, the error spent over several looks, and the
sequential comparison that keeps measuring while undecided."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest

from graphsub.verdicts import speedup
from graphsub.verdicts.speedup import (ALPHA, MIN_GAIN, Contention, Decision, confidence, decide,
                                      describe, fewest_rounds, median_interval,
                                      required_speedup, sequential, usable_cores)
from graphsub.runtime.timing import PairedComparison, Timer, Timing


def paired(ratios) -> PairedComparison:
    """Rounds whose ratios (before / after) are `ratios`: the challenger takes 1 s a round."""
    return PairedComparison(Timing(tuple(ratios)), Timing((1.0,) * len(ratios)))


@pytest.mark.parametrize("n", [6, 7, 10, 23, 64, 301])
@pytest.mark.parametrize("level", [0.95, 0.975, 0.99])
def test_the_interval_is_scipys_distribution_free_interval_of_a_median(n, level):
    from scipy import stats

    values = np.random.default_rng(n).lognormal(0.1, 0.2, n)
    reference = stats.quantile_test(values, q=np.median(values), p=0.5).confidence_interval(level)
    low, high = median_interval(list(values), level)
    if n < fewest_rounds(level):
        assert (low, high) == (None, None) and np.isnan(reference.low)
    else:
        assert (low, high) == (reference.low, reference.high)


def test_too_few_rounds_have_no_interval_and_decide_nothing():
    for level in (0.95, 0.975, 0.99):
        n = fewest_rounds(level)
        assert median_interval([1.5] * (n - 1), level) == (None, None)
        assert median_interval([1.5] * n, level) == (1.5, 1.5)
    result = decide(paired([3.0] * 5), None)  # 5 rounds, all much faster: not enough
    assert result.low is None and result.decision == Decision.UNDECIDED
    assert "too few for a 95% interval" in describe(result.as_dict())


def test_a_later_looks_higher_confidence_is_explained():
    """Sequential comparisons print intervals at 97.5%, 98.75%, ...: the text says why."""
    rng = np.random.default_rng(4)
    ratios = list(1.1 + 0.05 * rng.standard_normal(40))
    first = describe(decide(paired(ratios), None, look=1, final=False).as_dict())
    later = describe(decide(paired(ratios), None, look=8, final=True).as_dict())
    assert "97.5% interval" in first and "look 1" in first
    assert "99.96% interval" in later
    assert "look 8 of a sequential comparison, whose looks together err at most 5%" in later
    assert "looks together" not in describe(decide(paired(ratios), None).as_dict())


def test_the_looks_together_spend_the_error_allowance_once():
    for looks in range(1, 9):
        spent = sum(1 - confidence(k, False) for k in range(1, looks)) \
            + (1 - confidence(looks, True))
        assert spent == pytest.approx(ALPHA)
    assert confidence(1, True) == pytest.approx(0.95)


def test_one_gain_convention_min_gain_of_the_latency():
    """MIN_GAIN is a share of the incumbent's latency saved: 2% less latency is a speedup of
    1/0.98; a speedup of 1.02 (the race's old rule, 1 + g) saves only 1.96%."""
    assert required_speedup() == pytest.approx(1 / (1 - MIN_GAIN))
    saves_the_gain = 1 / (1 - MIN_GAIN)
    assert decide(paired([saves_the_gain] * 12), None).decision == Decision.FASTER
    assert decide(paired([1 + MIN_GAIN] * 12), None).decision == Decision.NOT_FASTER


@pytest.mark.parametrize("centre, final, load, decision", [
    (1.30, False, None, Decision.FASTER),
    (0.97, False, None, Decision.NOT_FASTER),
    (1.02, False, None, Decision.UNDECIDED),  # straddles, more rounds may tell
    (1.02, True, 0.0, Decision.UNDECIDED),    # out of time on a quiet machine
    (1.02, True, 1e3, Decision.CONTENDED),    # out of time on a busy one: refuse to claim
])
def test_the_decision(centre, final, load, decision):
    ratios = centre * np.random.default_rng(1).lognormal(0.0, 0.03, 40)
    result = decide(paired(ratios), load, look=1, final=final)
    assert result.decision == decision
    assert result.speedup == pytest.approx(np.median(ratios))
    assert result.low <= result.speedup <= result.high
    assert result.rounds == 40 and result.wins == pytest.approx(np.mean(ratios > 1))
    assert result.contention.busy == (load == 1e3)
    assert result.as_dict()["decision"] == str(decision)


def test_contention_is_the_load_against_the_cores_this_process_may_use():
    cores = usable_cores()
    assert Contention(cores + 0.5, cores, 0.1).busy
    assert not Contention(cores - 0.5, cores, 0.1).busy
    assert not Contention(None, cores, 0.1).busy  # no load average: never called busy
    assert Contention(7.6, 2, 0.24).describe() == "load 7.6 on 2 core(s), rounds ±24.0%"
    ratios = [0.9, 1.0, 1.0, 1.1, 1.2]
    q1, q3 = np.percentile(ratios, [25, 75])
    assert speedup.spread(ratios) == pytest.approx((q3 - q1) / 2 / 1.0)


class Blocks(Timer):
    """A stand-in model whose blocks of runs take the given seconds in turn (one value per
    call of more than one run; the untimed single run before a block takes the block's
    value): rounds with a known pattern, whatever the machine does. Each call sleeps `pace`
    seconds, so that time passes as in a real comparison."""

    def __init__(self, per_block, pace: float = 0.0) -> None:
        self.values = itertools.cycle(per_block)
        self.value = next(self.values)
        self.pace = pace

    def bind(self, feeds):
        pass

    def timed(self, n):
        if n > 1:
            self.value = next(self.values)
        time.sleep(self.pace)
        return [self.value] * n


@pytest.fixture
def quiet(monkeypatch):
    """A machine whose load average reads 0: an undecided result is not called contended."""
    monkeypatch.setattr(speedup, "read_load", lambda: 0.0)


def test_a_clear_result_is_decided_at_the_first_look(quiet):
    original = Blocks([0.1])
    for candidate, decision in ((Blocks([0.05, 0.052]), Decision.FASTER),
                                (Blocks([0.1, 0.101]), Decision.NOT_FASTER)):
        _, result = sequential(original, candidate, {}, time.perf_counter() + 30,
                               min_rounds=10, block=5, pause=0.0)
        assert result.decision == decision and result.looks == 1 and result.rounds == 10


def test_an_undecided_comparison_spends_the_time_it_has_before_deciding(quiet):
    """The Llama case: the challenger is faster in the median round, but its rounds alternate
    between +30% and -20%, so no number of rounds can tell whether it saves MIN_GAIN: the
    comparison goes on, doubling its rounds, until the deadline, then keeps the incumbent."""
    original, candidate = Blocks([0.1], pace=0.002), Blocks([0.1 / 1.3, 0.1 / 0.8], pace=0.002)
    start = time.perf_counter()
    comparison, result = sequential(original, candidate, {}, start + 1.5, min_rounds=10,
                                    block=5, pause=0.0)
    assert result.decision == Decision.UNDECIDED
    assert result.rounds > 10 and result.looks >= 2 and len(comparison.ratios) == result.rounds
    assert result.low == pytest.approx(0.8) and result.high == pytest.approx(1.3)
    assert result.confidence == pytest.approx(confidence(result.looks, True))
    one_round = 4 * 0.002
    assert time.perf_counter() - start >= 1.5 - 2 * one_round - 0.05  # the time was spent


def test_a_comparison_too_short_for_its_first_block_is_final_at_once(quiet):
    _, result = sequential(Blocks([0.1], pace=0.01), Blocks([0.05], pace=0.01), {},
                           time.perf_counter() + 0.05, min_rounds=10, block=5, pause=0.0)
    assert result.looks == 1 and result.rounds < 10
    assert result.confidence == pytest.approx(1 - ALPHA)
