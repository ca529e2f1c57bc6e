"""Interleaved, side-by-side timing of several models, whatever runs them.

Timing follows one rule on every target: models being compared are measured in the same
process, interleaved round by round, and summarized by medians, so that drift on a shared
machine (or a GPU's clock changes) hits all of them alike. A target supplies `Runnable`s
(and times them with `timed_calls` on a CPU, `event_timed_calls` on a device); this module
decides the order and keeps the books. Whether one of two models is faster, and how sure
that is, is `verdicts.speedup`'s.
"""

from __future__ import annotations

import statistics
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, Self

import numpy as np

from graphsub.progress import Tracker, step


def timed_calls(call: Callable[[], object], n: int,
                setup: Callable[[], object] | None = None) -> list[float]:
    """Seconds of each of n calls: what a CPU runnable's `timed` measures. `setup` runs
    before each call, outside its time (state a call writes, put back)."""
    out = []
    for _ in range(n):
        if setup is not None:
            setup()
        t0 = time.perf_counter()
        call()
        out.append(time.perf_counter() - t0)
    return out


class DeviceEvent(Protocol):
    """A marker a device records in its stream of work (a CUDA event), and the time between
    two of them: what a device runnable's `timed` measures instead of the host's clock."""

    def record(self) -> None: ...

    def synchronize(self) -> None: ...

    def elapsed_time(self, end: Self) -> float: ...  # milliseconds


def event_timed_calls(call: Callable[[], object], n: int,
                      new_event: Callable[[], DeviceEvent]) -> list[float]:
    """Seconds of each of n calls as the device saw them: an event recorded before and after
    each call, and each call waited for before the next, so that a sample is one call's
    latency and no call queues behind another. The one timing loop of every device target
    (whole models and single operators alike); `new_event` makes the device's events."""
    out = []
    for _ in range(n):
        start, end = new_event(), new_event()
        start.record()
        call()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) / 1e3)
    return out


def median_call_time(call: Callable[[], object], warmup: int = 2, min_runs: int = 5,
                     min_seconds: float = 0.02, max_runs: int = 200) -> float:
    """Median seconds of one call, after `warmup` untimed ones: at least `min_runs` calls and
    `min_seconds` of them, at most `max_runs`. How every target times one operator on the
    CPU (a CUDA target times with events instead)."""
    for _ in range(warmup):
        call()
    samples: list[float] = []
    start = time.perf_counter()
    while len(samples) < min_runs or (time.perf_counter() - start < min_seconds
                                      and len(samples) < max_runs):
        samples += timed_calls(call, 1)
    return statistics.median(samples)


class Timer(ABC):
    """What interleaved timing needs of a model: its inputs bound once, then timed runs.

    `bind` places a set of inputs where the model reads them (once, before timing), `timed`
    runs the model `n` times on the bound inputs and returns each run's seconds, measured the
    way the target measures (wall clock around a call on a CPU; CUDA events around a replay
    on a GPU)."""

    label: str = ""

    @abstractmethod
    def bind(self, feeds: Mapping[str, np.ndarray]) -> None:
        """Make these inputs the ones `timed` runs on."""

    @abstractmethod
    def timed(self, n: int) -> list[float]:
        """Run n times on the bound inputs; seconds per run."""


class Runnable(Timer):
    """One model prepared on one target, ready to be run and timed. `run` is the plain
    numpy-in, numpy-out call used for checking results."""

    @abstractmethod
    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Outputs by name, as numpy arrays on the host."""

    def close(self) -> None:
        """Release what the runnable holds (sessions, device memory)."""


class CallTimer(Timer):
    """A call whose inputs are already in it (a compiled function and its example tensors),
    timed by the host's clock; `sync` waits for the device's queued work before each call
    and after it (a GPU runs asynchronously: without it, a call's time is its launch's);
    `setup` runs before each call, untimed (a program that writes into its inputs gets them
    back as they were, so that every call does the same work)."""

    def __init__(self, call: Callable[[], object], sync: Callable[[], object] | None = None,
                 label: str = "", setup: Callable[[], object] | None = None) -> None:
        self.call, self.sync, self.label, self.setup = call, sync, label, setup

    def bind(self, feeds: Mapping[str, np.ndarray]) -> None:
        """Nothing to bind: the inputs are the call's own."""

    def timed(self, n: int) -> list[float]:
        if self.sync is None:
            return timed_calls(self.call, n, self.setup)
        sync, call, setup = self.sync, self.call, self.setup
        sync()
        return timed_calls(lambda: (call(), sync()), n,
                           None if setup is None else lambda: (setup(), sync()))


@dataclass(frozen=True)
class Timing:
    """Latency samples of one model, in seconds, in the order taken (`block` per round)."""

    samples: tuple[float, ...]
    block: int = 1

    def round_medians(self) -> list[float]:
        return [statistics.median(self.samples[i:i + self.block])
                for i in range(0, len(self.samples), self.block)]

    @property
    def median_round(self) -> float:
        """The median of the rounds' medians: the latency a report that keeps the rounds
        (and not every run) can recompute, so the one it prints."""
        return statistics.median(self.round_medians())

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def q1(self) -> float:
        return float(np.percentile(self.samples, 25))

    @property
    def q3(self) -> float:
        return float(np.percentile(self.samples, 75))

    @property
    def minimum(self) -> float:
        return min(self.samples)

    def as_dict(self) -> dict[str, float]:
        return {"median_ms": self.median * 1e3, "q1_ms": self.q1 * 1e3, "q3_ms": self.q3 * 1e3,
                "min_ms": self.minimum * 1e3, "runs": len(self.samples)}


class Interleaved:
    """Rounds of several timers on the same inputs, side by side, kept in one set of books:
    a comparison that cannot decide yet asks for more rounds of the same models (no second
    binding or warm-up), so that every round of a decision was taken the same way.

    Each round times a block of `block` runs of every timer, in an order that rotates so
    none is always first. Before each block the process sleeps `pause` seconds and runs the
    model once untimed: onnxruntime's idle worker threads spin for a while after a run, and
    without the pause the previous model's spinning threads would steal the cores from the
    next (on 2 cores, tripling its latency); the untimed run wakes the model's own threads
    (or caches) up again; `pause=0` skips both, for models whose runs are long enough that
    neither matters."""

    def __init__(self, timers: Sequence[Timer], feeds: Mapping[str, np.ndarray],
                 warmup: int = 3, block: int = 5, pause: float = 0.02) -> None:
        self.timers, self.block, self.pause = list(timers), block, pause
        for t in self.timers:
            t.bind(feeds)
            t.timed(warmup)
        self.samples: list[list[float]] = [[] for _ in self.timers]
        self.rounds = 0
        self.seconds = 0.0  # wall-clock seconds the rounds took, pauses included

    def run(self, rounds: int | None = None, min_seconds: float = 0.0, min_rounds: int = 1,
            max_rounds: int = 200, deadline: float | None = None) -> None:
        """Take `rounds` more rounds; without it, rounds until `min_seconds` of timed runs (at
        least `min_rounds`, at most `max_rounds`). A `deadline` (time.perf_counter() seconds)
        ends the rounds once passed, after at least one: the caller's time limit wins over
        `min_rounds`."""
        started = time.perf_counter()
        with step("timing", None, "rounds") as tracker:
            tracker.count.done = self.rounds
            self._rounds(rounds, min_seconds, min_rounds, max_rounds, deadline, tracker)
        self.seconds += time.perf_counter() - started

    def _rounds(self, rounds: int | None, min_seconds: float, min_rounds: int, max_rounds: int,
                deadline: float | None, tracker: Tracker) -> None:
        timed = 0.0
        done = 0
        while True:
            if rounds is not None and done >= rounds:
                break
            if rounds is None and done >= min_rounds and (timed >= min_seconds
                                                          or done >= max_rounds):
                break
            if deadline is not None and done >= 1 and time.perf_counter() >= deadline:
                break
            order = list(range(len(self.timers)))
            shift = self.rounds % len(order)
            for i in order[shift:] + order[:shift]:
                if self.pause:
                    time.sleep(self.pause)
                    self.timers[i].timed(1)
                block_times = self.timers[i].timed(self.block)
                self.samples[i].extend(block_times)
                timed += sum(block_times)
            done += 1
            self.rounds += 1
            tracker.advance()

    def timings(self) -> list[Timing]:
        return [Timing(tuple(s), self.block) for s in self.samples]


def time_runnables(runnables: Sequence[Timer], feeds: Mapping[str, np.ndarray],
                   warmup: int = 3, rounds: int | None = None, min_seconds: float = 2.0,
                   max_rounds: int = 200, block: int = 5, pause: float = 0.02,
                   min_rounds: int = 3, deadline: float | None = None) -> list[Timing]:
    """Time several runnables on the same inputs, side by side: `warmup` untimed runs of
    each, then rounds as `Interleaved.run` takes them."""
    books = Interleaved(runnables, feeds, warmup, block, pause)
    books.run(rounds, min_seconds, min_rounds, max_rounds, deadline)
    return books.timings()


@dataclass(frozen=True)
class PairedComparison:
    """A head-to-head timing of two models, round by round: drift on a shared machine moves
    both models of a round alike, so per-round ratios are steadier than whole-run medians."""

    before: Timing
    after: Timing

    @property
    def ratios(self) -> list[float]:
        return [b / a for b, a in zip(self.before.round_medians(), self.after.round_medians())]

    @property
    def speedup(self) -> float:
        """Median over rounds of (time before / time after)."""
        return statistics.median(self.ratios)

    @property
    def wins(self) -> float:
        """The fraction of rounds in which the second model was faster."""
        return sum(r > 1 for r in self.ratios) / len(self.ratios)


def compare_runnables(before: Runnable, after: Runnable, feeds: Mapping[str, np.ndarray],
                      min_seconds: float = 4.0, min_rounds: int = 10,
                      deadline: float | None = None, warmup: int = 3, block: int = 5,
                      pause: float = 0.02) -> PairedComparison:
    """Time two runnables head to head (at least `min_rounds` rounds unless the deadline
    comes first; `warmup`, `block` and `pause` as time_runnables takes them)."""
    t_before, t_after = time_runnables([before, after], feeds, min_seconds=min_seconds,
                                       rounds=None, max_rounds=max(min_rounds, 200),
                                       min_rounds=min_rounds, deadline=deadline,
                                       warmup=warmup, block=block, pause=pause)
    return PairedComparison(t_before, t_after)
