"""Choosing by measurement, within a deadline: the original and the best candidates timed on
the target side by side, the fastest confirmed against the original head to head.

Predicted costs are sums of one-operator timings; what a user gets is the latency of the whole
model, so a candidate replaces the original only when a head-to-head comparison decides it is
faster: the interval of its median round's speedup clears MIN_GAIN (`verdicts.speedup`, the
one statistic and decision of every comparison graphsub makes). The comparison goes on,
block after block, until it decides or the time is up; undecided then, the original is kept
and the outcome says why. Every step fits the time the run has left: a model whose runs take
seconds gets fewer, longer rounds, and when not even that fits, the original is kept and the
outcome says why. A candidate the target cannot build or run is dropped with a note: one bad
candidate never ends the run. A candidate whose first outputs differ from the original's is a
wrong rewrite, which ends the measuring at once and is reported as a verification failure.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple, TypedDict

import numpy as np

from graphsub.targets import Target
from graphsub.budget import StageClock
from graphsub.errors import GraphsubError
from graphsub.ir.graph import Graph
from graphsub.report.optimize import CandidateReport
from graphsub.verdicts.equivalence import (SAME_FUNCTION, Comparison, OutputDiff, Tolerance,
                                          compare_outputs)
from graphsub.runtime.ort_sessions import ModelData
from graphsub.verdicts.speedup import (MIN_GAIN, Decision, HeadToHead, confidence, decide,
                                      describe, fewest_rounds, highest_load, read_load,
                                      sequential)
from graphsub.runtime.timing import PairedComparison, Runnable, Timing, time_runnables
from graphsub.search.result import Candidate

#: The share of the measuring time (after the verification reserve) spent screening; the rest
#: confirms the fastest candidate head to head.
SCREEN_SHARE = 0.4
#: Candidates confirmed head to head at most, fastest in the screening first: when the fastest
#: is decided not faster (a screening fluke, or a gain under MIN_GAIN), the runner-up gets its
#: own chance, so that more candidates never make the result worse.
MAX_CONFIRMS = 2

@dataclass(frozen=True)
class Selection:
    """What measuring found: which candidate (if any) replaces the original, and why. A
    value: measuring and the checks after it make a new one (dataclasses.replace)."""

    #: faster | no-cheaper-graph | not-faster | not-confirmed | undecided | contended |
    #: no-time | not-run | slower-at-shape | verification-failed | not-written
    #: (report/optimize.py's OptimizeReport.outcome says what each means)
    outcome: str
    chosen: int | None = None
    before_ms: float | None = None
    after_ms: float | None = None
    #: The fastest candidate's speedup over the original in the screening (median round).
    screen_ratio: float | None = None
    confirm: PairedComparison | None = None
    #: What `confirm`'s rounds decided: the speedup's interval, the decision, the contention.
    head_to_head: HeadToHead | None = None
    candidates: tuple[CandidateReport, ...] = ()
    notes: tuple[str, ...] = ()
    original_run_s: float = 0.0
    #: A candidate whose first outputs differ from the original's: (its index, the diff).
    mismatch: tuple[int, Comparison] | None = None
    #: The candidate `confirm` timed against the original.
    confirmed: int | None = None
    #: Round medians in ms, for reports: "screen" (by label) and "confirms" (each attempt).
    timings: Mapping[str, Any] = field(default_factory=dict)

    def noted(self, note: str) -> Selection:
        """This selection with one more note."""
        return replace(self, notes=self.notes + (note,))

    def confirmation(self) -> dict[str, Any]:
        """The head-to-head's figures for the report (HeadToHead.as_dict, and MIN_GAIN)."""
        if self.head_to_head is None:
            return {}
        return {**self.head_to_head.as_dict(), "candidate": self.confirmed,
                "min_gain": MIN_GAIN}


class Choice(NamedTuple):
    """What measuring hands on: the selection, and the chosen candidate prepared on the
    target and still open (None: none chosen), which the caller owns and closes."""

    selection: Selection
    runnable: Runnable | None


def _first_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return (text[:240] + "...") if len(text) > 240 else text or type(exc).__name__


def _timed_run(runnable: Runnable, feeds: Mapping[str, np.ndarray]
               ) -> tuple[dict[str, np.ndarray], float]:
    t0 = time.perf_counter()
    out = runnable.run(feeds)
    return out, time.perf_counter() - t0


def run_original(device: Target, graph: Graph, original: ModelData,
                 feeds: Mapping[str, np.ndarray], session: Any = None
                 ) -> tuple[Runnable, dict[str, np.ndarray], float]:
    """The original prepared on the target (on `session`, the run's session of it, where
    given: Target.prepare) and run once: the runnable, its outputs and the run's seconds. A
    model the target cannot run is refused here, in one line saying why and what to do
    (graphsub.pipeline.measure_stage runs this whether or not there is a candidate: one
    policy for every model the target cannot run)."""
    try:
        runnable = device.prepare(graph, original, "original", session=session)
        outputs, seconds = _timed_run(runnable, feeds)
    except GraphsubError:
        raise
    except Exception as exc:  # noqa: BLE001 (a target's libraries raise their own types)
        raise GraphsubError(f"{device.name} cannot run the original model: "
                            f"{_first_line(exc)}{_unknown_op_hint(exc, graph)}") from None
    return runnable, outputs, seconds


def time_once(runnable: Runnable, feeds: Mapping[str, np.ndarray]) -> float:
    """Seconds one run takes (the first, untimed by the rounds: what sizes them)."""
    return _timed_run(runnable, feeds)[1]


@dataclass(frozen=True)
class Dropped:
    """A candidate left out, with a short note for its row and a line for the report."""

    note: str
    message: str


def _try_candidate(device: Target, i: int, cand: Candidate, data: ModelData | None,
                   original: ModelData,
                   feeds: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray],
                   tolerance: Tolerance
                   ) -> tuple[Runnable, float, list[OutputDiff]] | Dropped | Comparison:
    """Build and run a candidate once on the target: its runnable and run time, or why it
    was dropped, or (when it computes something else) the comparison that shows it."""
    try:
        runnable = device.prepare(cand.graph, data, f"candidate {i}")
    except Exception as exc:  # noqa: BLE001 (a target's libraries raise their own types)
        return Dropped(f"dropped: {device.name} cannot build it",
                       f"candidate {i}: {device.name} cannot build it, dropped "
                       f"({_first_line(exc)})")
    try:
        outputs, run_s = _timed_run(runnable, feeds)
    except Exception as exc:  # noqa: BLE001
        runnable.close()
        return Dropped(f"dropped: {device.name} cannot run it",
                       f"candidate {i}: {device.name} cannot run it, dropped "
                       f"({_first_line(exc)})")
    diffs, problems = compare_outputs(reference, outputs, tolerance)
    if not problems and all(d.ok for d in diffs):
        return runnable, run_s, diffs
    runnable.close()
    # no ONNX (a target that runs graphsub's graph): no runtime of its own to blame
    fault = None if data is None else device.runtime_fault(original, data, feeds, tolerance)
    if fault is not None:
        return Dropped(f"dropped: {device.name}'s runtime breaks it",
                       f"candidate {i}: {fault}, so it was dropped")
    return Comparison(False, tuple(diffs), tolerance, 1, tuple(problems))


def _round_ms(timing: Timing) -> list[float]:
    return [m * 1e3 for m in timing.round_medians()]


class TimingOptions(TypedDict):
    """The rounds' shape, as time_runnables and speedup.sequential take it."""

    block: int
    warmup: int
    pause: float


def timing_options(run_seconds: float) -> TimingOptions:
    """Rounds for a model whose run takes `run_seconds`: blocks of five runs for fast models,
    fewer as runs get longer, each block after a pause and an untimed run (see
    time_runnables: onnxruntime's threads spin after a run and steal the cores from the next
    model's); single runs without either only once a run takes a second, where the pause and
    the spinning threads no longer matter. Between 0.1 and 1 s the pause still does: a 30 ms
    decoder measured at 150-290 ms on a loaded 2-core machine, timed without it, spread by
    +-24% from round to round and its speedup was pulled from 1.48x to 1.14x; with it, +-8%
    (bench/RESULTS.md, issue 26)."""
    if run_seconds < 0.01:
        return {"block": 5, "warmup": 3, "pause": 0.02}
    if run_seconds < 0.1:
        return {"block": 2, "warmup": 1, "pause": 0.02}
    if run_seconds < 1.0:
        return {"block": 1, "warmup": 1, "pause": 0.02}
    return {"block": 1, "warmup": 0, "pause": 0.0}


def verification_seconds(prepare_s: float, run_s: float) -> float:
    """What verifying a chosen candidate takes: two sessions built, and both models run on
    two sets of inputs in onnxruntime and on the target (a bound with room to spare; the
    measuring stage keeps it back from its own time)."""
    return 3 * prepare_s + 8 * run_s


#: What onnxruntime says of an operator it has no kernel for.
_NO_KERNEL = ("Could not find an implementation", "is not a registered function/op",
              "No Op registered", "No opset import for domain")


def _unknown_op_hint(exc: BaseException, graph: Graph | None = None) -> str:
    """What to do when the model has an operator onnxruntime cannot run."""
    if not any(s in str(exc) for s in _NO_KERNEL):
        return ""
    if graph is not None and "bfloat16" in {t.dtype for n in graph.nodes.values()
                                            for t in n.outputs}:
        return (". The model computes in bfloat16, for which onnxruntime's CPU provider has "
                "few kernels: optimize it for --target torch-cpu or --target torch-cuda, "
                "which run bfloat16")
    return (". The model has an operator onnxruntime has no kernel for: give the library that "
            "implements it with --custom-ops LIB.so (as SessionOptions."
            "register_custom_ops_library), or a --target that runs it")


def measure_and_choose(device: Target, graph: Graph, original: ModelData,
                       candidates: Sequence[tuple[Candidate, ModelData | None]],
                       feeds: Mapping[str, np.ndarray], clock: StageClock,
                       measure_seconds: float = 3.0, tolerance: Tolerance = SAME_FUNCTION,
                       say: Callable[[str], None] = lambda message: None,
                       original_session: tuple[Any, float] | None = None) -> Choice:
    """Time the original and `candidates` (best predicted first) on `device` within the
    clock's time, keeping back what verification will take (graphsub.budget), and choose.
    The screening times at least `measure_seconds` of runs when its share of the time
    allows; a head-to-head confirmation looks after its first block of rounds and goes on
    while undecided. `original_session`: the run's session of the original for the target's
    `prepare`, and the seconds it took to build (what verification is expected to spend
    again per session). The chosen candidate's runnable comes back open, for the caller to
    own (verification runs it) and close; every other is closed here."""
    reports = [CandidateReport(c.cost * 1e3, None, [s.rule for s in c.trace])
               for c, _ in candidates]
    if not candidates:
        return Choice(Selection("no-cheaper-graph"), None)
    say(f"timing the original and {len(candidates)} candidate(s) on {device.name}")
    t0 = time.perf_counter()
    original_run, reference, original_s = run_original(
        device, graph, original, feeds,
        None if original_session is None else original_session[0])
    prepare_s = (original_session[1] if original_session is not None
                 else time.perf_counter() - t0 - original_s)
    clock.keep_back(verification_seconds(prepare_s, original_s))
    ready: list[tuple[int, Runnable, float]] = []
    notes: list[str] = []
    for i, (cand, data) in enumerate(candidates):
        if clock.expired():
            reports[i] = replace(reports[i], note="not timed: no time left")
            notes.append(f"candidate {i}: not timed, the time limit was reached")
            continue
        tried = _try_candidate(device, i, cand, data, original, feeds, reference, tolerance)
        if isinstance(tried, Dropped):
            reports[i] = replace(reports[i], note=tried.note)
            notes.append(tried.message)
        elif isinstance(tried, Comparison):  # a wrong rewrite: an error, not a dropped one
            original_run.close()
            for _, other, _ in ready:
                other.close()
            return Choice(Selection("not-run", candidates=tuple(reports), notes=tuple(notes),
                                    original_run_s=original_s, mismatch=(i, tried)), None)
        else:
            runnable, run_s, diffs = tried
            reports[i] = replace(reports[i], check=[
                {"name": d.name, "max_abs": d.max_abs, "max_rel": d.max_rel, "used": d.used,
                 "ok": d.ok} for d in diffs])
            ready.append((i, runnable, run_s))
    selection = Selection("not-run", candidates=tuple(reports), notes=tuple(notes),
                          original_run_s=original_s)
    if not ready:
        original_run.close()
        if all(r.note.startswith("not timed") for r in reports):
            selection = replace(selection, outcome="no-time")
        return Choice(selection, None)
    slowest = max([original_s] + [s for _, _, s in ready])
    clock.keep_back(verification_seconds(prepare_s, slowest))
    return _screen_and_confirm(selection, original_run, ready, feeds, clock, measure_seconds,
                               device, say)


def _screen_and_confirm(selection: Selection, original_run: Runnable,
                        ready: list[tuple[int, Runnable, float]], feeds: Mapping[str, np.ndarray],
                        clock: StageClock, measure_seconds: float, device: Target,
                        say: Callable[[str], None]) -> Choice:
    slowest = max([selection.original_run_s] + [s for _, _, s in ready])
    options = timing_options(slowest)
    runnables = [original_run] + [r for _, r, _ in ready]
    chosen: Runnable | None = None
    try:
        available = clock.remaining()
        one_round = sum(s for s in [selection.original_run_s] + [s for _, _, s in ready])
        one_round *= options["block"] + (1 if options["pause"] else 0)
        if available < 2 * one_round:
            return Choice(replace(selection, outcome="no-time"), None)
        selection, contenders = _screen(selection, runnables, ready, feeds,
                                        available * SCREEN_SHARE, measure_seconds, options)
        if not contenders:
            return Choice(replace(selection, outcome="not-faster"), None)
        for attempt, k in enumerate(contenders):
            index, runnable, _ = ready[k]
            confirm_budget = clock.remaining()
            if attempt and confirm_budget < fewest_rounds(confidence(1, True)) * one_round:
                break  # no time for the runner-up: the first attempt's verdict stands
            say(f"confirming the {'fastest' if not attempt else 'runner-up'} candidate head "
                f"to head on {device.name}")
            confirm, result = sequential(original_run, runnable, feeds,
                                         time.perf_counter() + confirm_budget,
                                         **options)
            explains = not attempt or result.decision is Decision.FASTER
            selection = _with_confirmation(selection, index, confirm, result, explains)
            if result.decision is Decision.FASTER:
                chosen = runnable
                if attempt:
                    selection = selection.noted("the fastest candidate in the screening was "
                                                "not confirmed head to head; the runner-up was")
                return Choice(replace(selection, outcome="faster", chosen=index,
                                      after_ms=confirm.after.median_round * 1e3), chosen)
            if attempt:  # the fastest's verdict stands
                selection = selection.noted(f"the runner-up was not confirmed either: it "
                                            f"measured {describe(result.as_dict())}, "
                                            f"{result.decision}")
                break
            if result.low is None:  # too few rounds for an interval: nothing decided
                selection = replace(selection.noted(
                    f"only {result.rounds} head-to-head round(s) fitted in the time limit; at "
                    f"least {fewest_rounds(result.confidence)} are needed to decide"),
                    outcome="no-time")
                break
            if result.decision is not Decision.NOT_FASTER:
                # undecided when the time ran out
                selection = replace(selection, outcome=str(result.decision))
                break
            selection = replace(selection, outcome="not-confirmed")  # the runner-up's turn
        return Choice(selection, None)
    finally:
        for r in runnables:
            if r is not chosen:
                r.close()


def _screen(selection: Selection, runnables: list[Runnable],
            ready: list[tuple[int, Runnable, float]], feeds: Mapping[str, np.ndarray],
            budget: float, measure_seconds: float, options: TimingOptions
            ) -> tuple[Selection, list[int]]:
    """Time the original and every ready candidate side by side for `budget` seconds; each
    candidate's speedup over the original is decided like a confirmation (one look). The
    selection with the screening's figures, and the contenders (positions in `ready`),
    fastest first: those that may be MIN_GAIN faster."""
    load = read_load()
    timings = time_runnables(runnables, feeds, min_seconds=min(measure_seconds, budget),
                             deadline=time.perf_counter() + budget, **options)
    load = highest_load(load, read_load())
    screened = [decide(PairedComparison(timings[0], t), load) for t in timings[1:]]
    reports = list(selection.candidates)
    for (i, _, _), t, result in zip(ready, timings[1:], screened):
        reports[i] = replace(reports[i], measured_ms=t.median_round * 1e3,
                             screening=result.as_dict())
    order = sorted(range(len(ready)), key=lambda k: -screened[k].speedup)
    median_ms = timings[0].median_round * 1e3
    screen = {"original": _round_ms(timings[0]),
              **{f"candidate {i}": _round_ms(t) for (i, _, _), t in zip(ready, timings[1:])}}
    contenders = [k for k in order if screened[k].decision is not Decision.NOT_FASTER]
    return replace(selection, candidates=tuple(reports), before_ms=median_ms,
                   after_ms=median_ms, screen_ratio=screened[order[0]].speedup,
                   timings={**selection.timings, "screen": screen}), contenders[:MAX_CONFIRMS]


def _with_confirmation(selection: Selection, index: int, confirm: PairedComparison,
                       result: HeadToHead, explains: bool) -> Selection:
    """The selection with a head-to-head's rounds kept for the report; where it `explains`
    the outcome, as the confirmation the verdict gives."""
    rounds = {"candidate": index, "before_ms": _round_ms(confirm.before),
              "after_ms": _round_ms(confirm.after), **result.as_dict()}
    timed = replace(selection, timings={
        **selection.timings, "confirms": [*selection.timings.get("confirms", ()), rounds]})
    if not explains:
        return timed
    before_ms = confirm.before.median_round * 1e3
    return replace(timed, confirm=confirm, head_to_head=result, confirmed=index,
                   before_ms=before_ms, after_ms=before_ms)
