"""Whether one model runs faster than another, and how sure that is: one statistic, its
interval, the machine's contention, and one decision, which every caller uses (the
optimizer's confirmation, `graphsub bench`, the torch.compile race).

**The statistic.** Two models are timed in the same rounds (`timing.Interleaved`); a round's
ratio is the first model's time over the second's (above 1: the second is faster). Drift on
a shared machine moves both models of a round alike, so the rounds' ratios are steadier than
whole-run medians. The speedup is the median of the rounds' ratios.

**Its interval** is the distribution-free confidence interval of a median: from the k-th
smallest to the k-th largest ratio, with k from the binomial distribution (a round's ratio
falls on either side of the true median with probability 1/2). Why not a bootstrap: this
interval has its stated coverage at any number of rounds (a bootstrap of a median is ragged
and too narrow with few), needs no random draws (the same rounds always give the same
interval), and stays valid when the rounds are not alike (the machine's load changing while
they were taken), as long as each round's ratio is as likely above the true median as below.
With too few rounds there is no interval at the confidence asked (all of 5 rounds on one
side happens 1 time in 16): its ends are then None, and nothing can be decided.

**The decision** (`decide`) has one gain convention: MIN_GAIN is the share of the incumbent's
latency the challenger must save, so the challenger must run at least `required_speedup()`
= 1 / (1 - MIN_GAIN) times as fast (2% less latency: 1.0204x).
- faster: the interval's lower end clears the required speedup;
- not faster: its upper end is below it (the challenger cannot be MIN_GAIN faster);
- undecided: it straddles it; a caller with time left takes more rounds and looks again;
- contended: it still straddles it when time is up and the machine was busy: a busy machine's
  rounds are too noisy to tell, and graphsub refuses to claim either way.
An undecided or contended comparison keeps the incumbent.

**Looking more than once.** A sequential comparison (`sequential`) looks after a first block of
rounds and, undecided, doubles the rounds and looks again, until decided or out of time. Each
look could err on its own, so each spends part of an error allowance ALPHA: the k-th look is
at confidence 1 - ALPHA / 2**k and the last (at the deadline) spends what is left, so all the
looks together err at most ALPHA. A single look (`graphsub bench`) is at 1 - ALPHA.

**Contention.** The load average (processes running or waiting for a core) against the cores
this process may use: above them, some runnable process waits, and which one differs from
round to round. The load average is the whole machine's over the last minute, so it lags a
load that just started and overstates one on cores this process cannot use: it decides only
how an undecided result is worded (contended, not undecided), never a claim. The rounds' own
spread (half their ratios' interquartile range, relative to the median) is reported beside it:
it is what widens the interval, and so what makes a busy machine's comparison undecided.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction
from typing import Any

import numpy as np

from graphsub.runtime.timing import Interleaved, PairedComparison, Timer

#: The least share of the incumbent's latency a challenger must save to be called faster.
MIN_GAIN = 0.02
#: The error allowance of a decision: at most this probability of a wrong claim, all looks
#: together (each end of the interval errs at most half of it).
ALPHA = 0.05
#: The rounds a comparison takes before it first looks: at 97.5%, the interval of 10 rounds
#: leaves out their smallest and largest ratios (that of 7 would span them all).
MIN_ROUNDS = 10
#: A sequential comparison's rounds at most (with the deadline, what ends an undecided one).
MAX_ROUNDS = 2000


def required_speedup(min_gain: float = MIN_GAIN) -> float:
    """The speedup that saves `min_gain` of the incumbent's latency."""
    return 1 / (1 - min_gain)


def confidence(look: int, final: bool) -> float:
    """The confidence of the interval at the `look`-th look (from 1): see the module's
    docstring; the final look spends the rest of the error allowance."""
    return 1 - ALPHA / 2.0 ** (look - 1 if final else look)


def fewest_rounds(level: float) -> int:
    """The fewest rounds that have an interval at confidence `level`."""
    return math.ceil(math.log2(2 / (1 - level)) - 1e-12)


def median_interval(values: Sequence[float], level: float
                    ) -> tuple[float | None, float | None]:
    """The distribution-free interval that holds the median of what `values` sample with
    probability at least `level`: (k-th smallest, k-th largest), k the largest with
    P(Binomial(n, 1/2) < k) <= (1 - level) / 2; (None, None) when no k fits."""
    n = len(values)
    tail = Fraction(1 - level) / 2 * 2 ** n  # in counts of the 2**n equally likely signs
    k, below = 0, 0
    while k < n and below + math.comb(n, k) <= tail:
        below += math.comb(n, k)
        k += 1
    if k == 0:
        return None, None
    ordered = sorted(values)
    return ordered[k - 1], ordered[n - k]


def read_load() -> float | None:
    """The machine's load average over the last minute; None where the system has none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def highest_load(*readings: float | None) -> float | None:
    """The highest of the load averages read during a measurement (None: none was read)."""
    known = [x for x in readings if x is not None]
    return max(known) if known else None


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, where the system has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def spread(ratios: Sequence[float]) -> float:
    """Half the interquartile range of the rounds' ratios, relative to their median: how far
    a typical round strays (0.05: about ±5%)."""
    q1, q2, q3 = np.percentile(ratios, [25, 50, 75])
    return float((q3 - q1) / 2 / q2)


@dataclass(frozen=True)
class Contention:
    """How busy the machine was while the rounds were taken."""

    load: float | None  # the highest load average read during the rounds
    cores: int          # the cores this process may run on
    spread: float       # the rounds' own spread (see `spread`)

    @property
    def busy(self) -> bool:
        """More processes wanted a core than this process has: some of them waited."""
        return self.load is not None and self.load > self.cores

    def describe(self) -> str:
        load = "load unknown" if self.load is None else f"load {self.load:.1f}"
        return f"{load} on {self.cores} core(s), rounds ±{self.spread:.1%}"


class Decision(StrEnum):
    """What a head-to-head comparison lets one say about the challenger (see the module's
    docstring). A str, so reports and JSON carry the word."""

    FASTER = "faster"
    NOT_FASTER = "not faster"
    UNDECIDED = "undecided"
    CONTENDED = "contended"


@dataclass(frozen=True)
class HeadToHead:
    """What a comparison of a challenger against an incumbent found: the median round's
    speedup, its interval at `confidence` (ends None: too few rounds for one), and the
    decision they make against the `required` speedup."""

    speedup: float
    low: float | None
    high: float | None
    confidence: float
    rounds: int
    wins: float  # the share of the rounds the challenger was faster in
    required: float
    decision: Decision
    looks: int
    contention: Contention

    def as_dict(self) -> dict[str, Any]:
        """Plain data for reports and JSON (what `describe` and the report read back)."""
        return {"speedup": self.speedup, "low": self.low, "high": self.high,
                "confidence": self.confidence, "rounds": self.rounds, "wins": self.wins,
                "required": self.required, "decision": str(self.decision), "looks": self.looks,
                "load": self.contention.load, "cores": self.contention.cores,
                "spread": self.contention.spread, "busy": self.contention.busy}


def describe(result: Mapping[str, Any]) -> str:
    """'1.215x (95% interval 1.102-1.300, 20 rounds)': a speedup with its interval, from a
    HeadToHead's as_dict() (or a report's copy of it), the one way every output prints one.
    An interval of a sequential comparison's later look is at a higher confidence than 95%
    (each look spends part of the error allowance): it says so, and what all looks hold to."""
    rounds = f"{result['rounds']} round{'s' if result['rounds'] != 1 else ''}"
    level = _percent(result["confidence"])
    looks = result.get("looks", 1)
    if result["confidence"] > 1 - ALPHA + 1e-9:
        rounds += (f"; look {looks} of a sequential comparison, whose looks together err at "
                   f"most {_percent(ALPHA)}")
    if result["low"] is None:
        return f"{result['speedup']:.3f}x ({rounds}: too few for a {level} interval)"
    return (f"{result['speedup']:.3f}x ({level} interval {result['low']:.3f}-"
            f"{result['high']:.3f}, {rounds})")


def describe_contention(result: Mapping[str, Any]) -> str:
    """'load 7.6 on 2 core(s), rounds ±24.0%', from a HeadToHead's as_dict()."""
    return Contention(result["load"], result["cores"], result["spread"]).describe()


def _percent(level: float) -> str:
    """95%, 97.5%, 98.75%, 99.92%: a confidence as few digits as it has, two at most."""
    return f"{level * 100:.2f}".rstrip("0").rstrip(".") + "%"


def decide(comparison: PairedComparison, load: float | None, look: int = 1,
           final: bool = True, min_gain: float = MIN_GAIN) -> HeadToHead:
    """The decision on a comparison's rounds so far (`comparison.after` is the challenger),
    at its `look`-th look; `final` when no more rounds will come. `load` is the highest
    load average read while the rounds were taken."""
    ratios = comparison.ratios
    level = confidence(look, final)
    low, high = median_interval(ratios, level)
    required = required_speedup(min_gain)
    contention = Contention(load, usable_cores(), spread(ratios))
    if low is not None and low >= required:
        decision = Decision.FASTER
    elif high is not None and high < required:
        decision = Decision.NOT_FASTER
    elif final and contention.busy:
        decision = Decision.CONTENDED
    else:
        decision = Decision.UNDECIDED
    return HeadToHead(statistics.median(ratios), low, high, level, len(ratios),
                      comparison.wins, required, decision, look, contention)


def sequential(before: Timer, after: Timer, feeds: Mapping[str, Any], deadline: float,
               min_rounds: int = MIN_ROUNDS, min_gain: float = MIN_GAIN,
               max_rounds: int = MAX_ROUNDS, warmup: int = 3, block: int = 5,
               pause: float = 0.02) -> tuple[PairedComparison, HeadToHead]:
    """`after` (the challenger) against `before`, head to head, until decided or `deadline`
    (time.perf_counter() seconds): a first block of `min_rounds` rounds (cut short by the
    deadline), then, while undecided, as many rounds again as there are, while another round
    fits before the deadline: a clear result is decided in the first block's time, an unclear
    one gets all the time there is. The rounds: `timing.Interleaved` with `warmup`, `block`
    and `pause`."""
    books = Interleaved([before, after], feeds, warmup, block, pause)
    loads = [read_load()]
    books.run(rounds=min_rounds, deadline=deadline)
    look = 0
    while True:
        look += 1
        loads.append(read_load())
        one_round = books.seconds / books.rounds
        final = books.rounds >= max_rounds or time.perf_counter() + one_round > deadline
        comparison = PairedComparison(*books.timings())
        result = decide(comparison, highest_load(*loads), look, final, min_gain)
        if final or result.decision is not Decision.UNDECIDED:
            return comparison, result
        books.run(rounds=min(books.rounds, max_rounds - books.rounds), deadline=deadline)
