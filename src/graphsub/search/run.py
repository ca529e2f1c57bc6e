"""The skeleton every search runs in (egg's Runner, without the rewriting): the clock, the
statistics, the best few graphs, progress reports and Ctrl-C, so that an algorithm is its
loop and nothing else.

A search makes one `SearchRun` from its `Limits` and asks `check_limits` wherever it may
stop: the answer is the `StopReason` (recorded in the statistics, the first one sticks) or
None. A step that is long on its own (a multi-pattern join, a rule's matching on an e-graph)
looks at the clock itself and raises `DeadlineReached`; `stoppable()` turns that into
StopReason.TIME and Ctrl-C into StopReason.INTERRUPT, and the search returns the best graphs
found so far either way.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from graphsub.ir.graph import Graph
from graphsub.rules.expr import undecided_conditions
from graphsub.search.registry import Limits
from graphsub.search.result import (Candidate, OptimizeResult, SearchProgress, SearchStats,
                                    Step, StopReason)


class DeadlineReached(Exception):
    """A step ran past its search's deadline in the middle of its work and gave up, leaving
    what it worked on as it was (the search's time limit is a promise)."""


class BestGraphs:
    """The best `keep` graphs seen, cheapest first (ties: the first seen), one per
    fingerprint."""

    def __init__(self, keep: int) -> None:
        self.keep = max(keep, 1)  # the best graph is the search's result
        self.candidates: list[Candidate] = []

    def __len__(self) -> int:
        return len(self.candidates)

    @property
    def top(self) -> Candidate:
        return self.candidates[0]

    def admits(self, cost: float) -> bool:
        """Whether a graph of this cost would be kept (if it is new): a search can skip
        building a trace for one that would not."""
        return len(self.candidates) < self.keep or cost < self.candidates[-1].cost

    def offer(self, graph: Graph, cost: float, trace: tuple[Step, ...]) -> bool:
        """Keep the graph if it is among the best and not kept already; whether it was."""
        if not self.admits(cost):
            return False
        fingerprint = graph.fingerprint()
        if any(c.graph.fingerprint() == fingerprint for c in self.candidates):
            return False
        self.candidates.append(Candidate(graph, cost, trace))
        self.candidates.sort(key=lambda c: c.cost)
        del self.candidates[self.keep:]
        return True


class SearchRun:
    """One search's clock, statistics, best graphs, progress and stop reason.

    `budget` is the most work the search may do, counted in `stats.explored` (graphs
    expanded, e-graph iterations; None: unbounded), and `budget_reason` what running out of it
    is called. `share` is the part of the time limit the search's own loop may use
    (`deadline`); the e-graph searches keep the rest for extraction (`remaining()`).
    `unit` names what `stats.explored` counts in progress reports."""

    def __init__(self, limits: Limits, budget: int | None, unit: str = "expanded",
                 budget_reason: StopReason = StopReason.BUDGET, share: float = 1.0) -> None:
        self.limits = limits
        self.budget = budget
        self.unit = unit
        self.budget_reason = budget_reason
        self.start = time.perf_counter()
        self.deadline = self.start + share * limits.time
        self.stats = SearchStats()
        self.best = BestGraphs(limits.keep)
        self.stopped: StopReason | None = None
        self._undecided_before = undecided_conditions()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def remaining(self) -> float:
        """Seconds left of the whole time limit (not only the loop's share)."""
        return max(self.limits.time - self.elapsed(), 0.0)

    def stop(self, reason: StopReason) -> StopReason:
        """Record why the search stops (the first reason recorded is the one reported)."""
        if self.stopped is None:
            self.stopped = reason
        return self.stopped

    def check_limits(self, budgeted: bool = False) -> StopReason | None:
        """Why the search must stop now, recorded; None to go on. The budget counts only
        where the caller is `budgeted` (between units of work, not inside one: the unit
        being done was already counted); the clock counts everywhere."""
        if self.stopped is not None:
            return self.stopped
        if budgeted and self.budget is not None and self.stats.explored >= self.budget:
            return self.stop(self.budget_reason)
        if time.perf_counter() > self.deadline:
            return self.stop(StopReason.TIME)
        return None

    @contextmanager
    def stoppable(self) -> Iterator[None]:
        """Ctrl-C (StopReason.INTERRUPT) or a step's DeadlineReached (StopReason.TIME) in the
        block ends the search's loop, not the search: the caller goes on to its result."""
        try:
            yield
        except KeyboardInterrupt:
            self.stop(StopReason.INTERRUPT)
        except DeadlineReached:
            self.stop(StopReason.TIME)

    def report(self, best_cost: float | None) -> None:
        """Tell the limits' progress callback how far the search has got."""
        progress = self.limits.progress
        if progress is not None:
            self.stats.seconds = self.elapsed()
            progress(SearchProgress.of(self.stats, best_cost, self.unit))

    def result(self, initial_cost: float, default: StopReason = StopReason.EXHAUSTED
               ) -> OptimizeResult:
        """The search's result: the best graph, the best few, the statistics with the time
        taken and the stop reason (`default`: nothing stopped the search early)."""
        self.stats.seconds = self.elapsed()
        self.stats.stopped_by = self.stopped or default
        self.stats.undecided = undecided_conditions() - self._undecided_before
        top = self.best.top
        return OptimizeResult(top.graph, top.trace, self.stats, initial_cost, top.cost,
                              tuple(self.best.candidates))
