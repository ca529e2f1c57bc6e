"""One run's time limit, shared out among its stages: the only place that decides how long
each stage may take.

A user gives one number (`--time-limit`, and optionally `--measure-limit` for timing the
candidates after the search). The search gets most of it; fission and kernel orchestration a
share of the search's window; timing and confirming the candidates the rest; verification of a
chosen candidate is never skipped, so the stage before it keeps back what verifying will take
once it knows how long one run of the model lasts (`StageClock.keep_back`). Every stage asks
its `StageClock` for its deadline instead of computing one, and the seconds each stage took are
recorded here, so that a report's figures add up to the run's.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

#: The share of the time limit kept for timing and verifying candidates (see measure_reserve).
MEASURE_SHARE = 0.25
#: The share of the search's window given to fission and orchestration, and its cap in seconds.
FISSION_SHARE, FISSION_MAX_SECONDS = 0.2, 20.0
#: The share of what is left of the search's window that the peers' optimizers may take
#: (they run before the search: the time they take is the search's).
PEERS_SHARE = 0.25
#: The share of a pricing stage's time in which operators not yet timed (nor cached) are
#: timed; past it they are priced by the analytic model scaled to those timed, so that the
#: stage's own work always has the rest, however slowly a cold cache fills (a float16
#: decoder's part on an H200 once spent its whole time limit timing and compiling operators,
#: and its search got none).
PRICING_SHARE = 0.7
#: The least time a stage that has one is given, however late it starts: a search that cannot
#: even price its input graph finds nothing, a fission that cannot solve its program neither.
MIN_SEARCH_SECONDS, MIN_FISSION_SECONDS = 0.05, 0.5


#: How fast a candidate is written as ONNX and checked, in bytes of weights a second (VGG-19's
#: 575 MB took 7.8 s on a 2-core VM), and the weights below which writing always fits.
WRITE_BYTES_PER_SECOND, WRITE_ALWAYS_BYTES = 70e6, 64 << 20
#: The weights below which the original is run once on the target even after the time limit
#: is spent (pipeline.measure_stage): such a run takes well under a second.
RUN_ALWAYS_BYTES = 64 << 20


def writing_seconds(weight_bytes: int) -> float:
    """About how long writing a candidate with this many bytes of weights takes (nothing for
    a model whose writing always fits)."""
    return 0.0 if weight_bytes <= WRITE_ALWAYS_BYTES else weight_bytes / WRITE_BYTES_PER_SECOND


def measure_reserve(time_limit: float) -> float:
    """The part of a time limit kept for timing and verifying candidates when no measuring
    limit is given: a quarter, at least 2 s, at most half of the limit and 60 s."""
    return min(max(MEASURE_SHARE * time_limit, 2.0), 0.5 * time_limit, 60.0)


def fission_seconds(window: float) -> float:
    """The time fission and orchestration get out of a search window of `window` seconds."""
    return min(FISSION_SHARE * window, FISSION_MAX_SECONDS)


@dataclass
class StageClock:
    """The time one stage has: its deadline (time.perf_counter() seconds), less whatever the
    stage keeps back for the stages after it. None: the stage runs to completion (verifying,
    writing)."""

    name: str
    start: float
    end: float | None
    kept_back: float = 0.0

    @classmethod
    def lasting(cls, seconds: float, name: str = "measure") -> StageClock:
        """A clock of `seconds` from now (for a stage run on its own, outside a Budget)."""
        now = time.perf_counter()
        return cls(name, now, now + seconds)

    @property
    def deadline(self) -> float | None:
        return None if self.end is None else self.end - self.kept_back

    def pricing_deadline(self) -> float | None:
        """Until when a cost model pricing for this stage may time operators (PRICING_SHARE
        of the stage's time)."""
        deadline = self.deadline
        return None if deadline is None else \
            self.start + PRICING_SHARE * max(deadline - self.start, 0.0)

    def remaining(self) -> float:
        """Seconds left before the deadline (infinite without one; never negative)."""
        deadline = self.deadline
        return float("inf") if deadline is None else max(deadline - time.perf_counter(), 0.0)

    def expired(self) -> bool:
        return self.remaining() <= 0.0

    def keep_back(self, seconds: float) -> None:
        """Leave `seconds` of this stage's time to the stages after it (verification, whose
        cost the measuring stage learns once it has run the model)."""
        self.kept_back = max(seconds, 0.0)


@dataclass
class Budget:
    """The time limit of one run, from `started` (a time.perf_counter() value: loading the
    model counts), and the seconds each stage took.

    Without `measure_limit`, the search window is the limit less measure_reserve(limit) and
    the measuring stages fit in the rest; with it, the search window is the whole limit and
    measuring gets `measure_limit` seconds after the search. A run that measures nothing
    (`measuring=False`: the search alone, a torch.compile part) gives the window the whole
    limit. With `fission`, the search leaves fission_seconds(what it had) of the window to
    the fission stage, which gets that share (no more: timing candidate kernels would take
    what measuring needs) within the window; a fission stage run without a search gets the
    window, up to FISSION_MAX_SECONDS."""

    time_limit: float
    measure_limit: float | None = None
    fission: bool = False
    measuring: bool = True
    started: float = field(default_factory=time.perf_counter)
    #: Seconds kept before measuring for writing the candidates as ONNX (a large model's
    #: weights take seconds to write and check: pipeline.export_stages.writing_seconds).
    writing: float = 0.0
    #: Seconds per stage, in the order the stages ran (a stage run twice adds up).
    seconds: dict[str, float] = field(default_factory=dict)
    _window_end: float | None = field(default=None, repr=False)
    #: What the search left to the fission stage (None: no search has run).
    _fission_share: float | None = field(default=None, repr=False)
    _interrupted: bool = field(default=False, repr=False)

    def search_window_end(self) -> float:
        """When the search and fission must be done."""
        if self._window_end is None:
            reserve = (measure_reserve(self.time_limit) + min(self.writing,
                                                              0.5 * self.time_limit)
                       if self.measuring and self.measure_limit is None else 0.0)
            self._window_end = self.started + self.time_limit - reserve
        return self._window_end

    def clock(self, stage: str) -> StageClock:
        """The clock of a stage starting now."""
        now = time.perf_counter()
        window = self.search_window_end() - now
        if stage == "search":
            seconds = max(window, MIN_SEARCH_SECONDS)
            if self.fission:
                self._fission_share = fission_seconds(seconds)
                seconds -= self._fission_share
            return StageClock(stage, now, now + max(seconds, MIN_SEARCH_SECONDS))
        if stage == "peers":
            return StageClock(stage, now, now + max(PEERS_SHARE * window, 0.0))
        if stage == "fission":
            share = self._fission_share if self._fission_share is not None else \
                min(window, FISSION_MAX_SECONDS)
            return StageClock(stage, now, now + max(min(share, window), MIN_FISSION_SECONDS))
        if stage == "measure":
            end = (now + self.measure_limit if self.measure_limit is not None
                   else min(self.started + self.time_limit,
                            self.search_window_end() + measure_reserve(self.time_limit)
                            + min(self.writing, 0.5 * self.time_limit)))
            return StageClock(stage, now, end)
        return StageClock(stage, now, None)

    @contextmanager
    def stage(self, name: str) -> Iterator[StageClock]:
        """Run a stage: its clock, and its seconds recorded when it ends (however it ends)."""
        clock = self.clock(name)
        try:
            yield clock
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - clock.start

    def interrupted(self) -> None:
        """Ctrl-C ended the search: its window ends now, so that measuring gets its reserve
        from here, not all the time the limit had left (a user who stops a search wants
        its result soon)."""
        self._window_end = min(self.search_window_end(), time.perf_counter())
        self._interrupted = True

    @property
    def was_interrupted(self) -> bool:
        """Whether Ctrl-C ended the search (the stages that make no sense after it are
        skipped)."""
        return self._interrupted

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def spent(self, stage: str) -> bool:
        """Whether the time limit is spent for `stage` to start: the run has taken it all (a
        large model's loading can), or, for the stages of the search, its window is over
        by more than what it has left to measure (fission and the candidates' export are
        measuring's when a measuring limit is given: the user asked for that time)."""
        if self.measure_limit is not None and stage not in ("peers", "search"):
            return False
        return self.elapsed() >= self.time_limit

    def as_dict(self) -> dict[str, float | None]:
        """Seconds per stage, loading (what came before the first stage), the total and the
        limits: what a report shows, adding up to the total."""
        total = self.elapsed()
        loading = total - sum(self.seconds.values())
        return {"load": round(max(loading, 0.0), 3),
                **{name: round(s, 3) for name, s in self.seconds.items()},
                "total": round(total, 3), "time_limit": self.time_limit,
                "measure_limit": self.measure_limit}
