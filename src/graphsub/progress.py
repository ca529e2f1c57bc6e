"""Progress of the long steps of a run, in each step's own unit.

Loading a 32-layer decoder, verifying it at six bindings of its sizes, writing 6 GB of
weights: each takes long enough that a person wants to see it move. The code doing the work
counts what it does (`step("load", total, "nodes")`, then `advance()`), without knowing who
shows it; whoever runs graphsub installs a `Reporter` for a block of work (`reporting`: the
CLI draws it, a report keeps what each step did). Without one, counting costs nothing.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass
class StepCount:
    """How far one step has got: `done` of `total` (None: not known ahead) in `unit`."""

    name: str
    unit: str
    total: float | None = None
    done: float = 0.0
    seconds: float = 0.0

    def text(self) -> str:
        """`1,203 of 1,203 nodes`, `3 bindings`, as reports and progress lines say it."""
        done = f"{self.done:,.0f}" if self.done == int(self.done) else f"{self.done:,.1f}"
        if self.total is None:
            return f"{done} {self.unit}"
        total = f"{self.total:,.0f}" if self.total == int(self.total) else f"{self.total:,.1f}"
        return f"{done} of {total} {self.unit}"

    def as_dict(self) -> dict[str, float | str | None]:
        return {"done": self.done, "total": self.total, "unit": self.unit,
                "seconds": round(self.seconds, 3)}


#: Called with a step's count each time it moves.
Reporter = Callable[[StepCount], None]

_reporter: contextvars.ContextVar[Reporter | None] = contextvars.ContextVar(
    "graphsub_progress", default=None)


class Tracker:
    """The count of one running step; `advance` moves it and tells the reporter (at most
    every REFRESH seconds, and at the end)."""

    REFRESH = 0.1

    def __init__(self, count: StepCount, reporter: Reporter | None) -> None:
        self.count = count
        self._reporter = reporter
        self._start = time.perf_counter()
        self._shown = 0.0

    def advance(self, amount: float = 1.0) -> None:
        self.count.done += amount
        now = time.perf_counter()
        if self._reporter is not None and now - self._shown >= self.REFRESH:
            self._shown = now
            self.count.seconds = now - self._start
            self._reporter(self.count)

    def finish(self) -> None:
        self.count.seconds = time.perf_counter() - self._start
        if self._reporter is not None:
            self._reporter(self.count)


@contextmanager
def step(name: str, total: float | None, unit: str) -> Iterator[Tracker]:
    """Count one step of work for whoever is reporting (see the module's docstring)."""
    tracker = Tracker(StepCount(name, unit, total), _reporter.get())
    try:
        yield tracker
    finally:
        tracker.finish()


def current_reporter() -> Reporter | None:
    """The reporter steps are told about now (None: nobody is listening)."""
    return _reporter.get()


@contextmanager
def reporting(reporter: Reporter) -> Iterator[None]:
    """Tell `reporter` how every step in this block goes."""
    token = _reporter.set(reporter)
    try:
        yield
    finally:
        _reporter.reset(token)


class StepLog:
    """A reporter that keeps each step's last count (what a report says each step did) and
    passes every count on."""

    def __init__(self, forward: Reporter | None = None) -> None:
        self.forward = forward
        self.steps: dict[str, StepCount] = {}

    def __call__(self, count: StepCount) -> None:
        self.steps[count.name] = count
        if self.forward is not None:
            self.forward(count)


__all__ = ["Reporter", "StepCount", "StepLog", "Tracker", "current_reporter", "reporting",
           "step"]
