"""The optimizer end to end: search, measure, choose, verify, on the user's target.

The target (`graphsub.backends`) names where the model will run: onnxruntime on the CPU or a
GPU, or graphsub's torch backend on the CPU or a GPU. Search costs are predictions (measured
per operator on the target, or analytic). After the search, the original model and the few
best candidates are timed end to end on the target, side by side; the fastest is then timed
head to head against the original, round by round, and replaces it only if it is faster by
MIN_GAIN in the median round and in most rounds (graphsub.selection). Otherwise the original
is kept and the report says why. Whatever is chosen is checked against the original on random
inputs before anything is written (in onnxruntime, on the ONNX bytes to be written, and on the
target itself): a mismatch is an error, never a warning.

The time limit is the whole run's: the search gets most of it and timing, confirming and
verifying the rest (measure_reserve), unless a separate measuring limit is given.
"""

from __future__ import annotations

import math
import os
import time
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from graphsub.backends import Target, default_target_name, get_target
from graphsub.backends import ort_fusions as ort_fusions_module
from graphsub.cost import CostModel, MeasuredCostModel, make_cost_model
from graphsub.errors import GraphsubError
from graphsub.fission.stage import FissionOutcome, fission_and_orchestrate
from graphsub.ir.graph import Graph
from graphsub.onnx_io.exporter import to_onnx_bytes
from graphsub.report.evidence import op_times, rewrite_evidence
from graphsub.report.optimize import OptimizeReport, verdict, versions
from graphsub.rules import Rule, builtin_rules
from graphsub.runtime.equivalence import (SAME_FUNCTION, Comparison, compare_models,
                                          compare_runners)
from graphsub.runtime.inputs import graph_input_specs, random_feeds
import graphsub.egraph  # noqa: F401  (registers the e-graph searches by name)
from graphsub.search import ALGORITHMS, Candidate, OptimizeResult, SearchStats
from graphsub.search.result import ProgressFn, SearchProgress, Step, StepKind, StopReason
from graphsub.search.registry import Limits
from graphsub.search.split import splitting
from graphsub.selection import measure_and_choose

#: The share of the time limit kept for timing and verifying candidates (measure_reserve).
MEASURE_SHARE = 0.25
#: The share of the search's time given to fission and orchestration, and its cap in seconds.
FISSION_SHARE, FISSION_MAX_SECONDS = 0.2, 20.0


class VerificationError(GraphsubError):
    """The optimized model does not compute what the original computes."""

    def __init__(self, message: str, trace: Sequence[str], comparison: Comparison) -> None:
        super().__init__(message)
        self.trace = list(trace)
        self.comparison = comparison

    @classmethod
    def of(cls, comparison: Comparison, rules: Sequence[str]) -> VerificationError:
        """The error for a failed comparison: what failed (a missing output or a shape, then
        the outputs whose values differ; never one that passed), and the rules applied."""
        failing = list(comparison.problems) + [d.describe() for d in comparison.outputs
                                               if not d.ok]
        return cls(f"the optimized model does not match the original ({'; '.join(failing)}); "
                   f"nothing was written. Rules applied, in order: {', '.join(rules)}",
                   rules, comparison)


def resolve_target(target: str | Target | None, threads: int | None = None) -> Target:
    """A Target from a name (None: this machine's default, torch-cuda with a GPU)."""
    return target if isinstance(target, Target) else get_target(target, threads=threads)


#: Cost models by name, and where --split runs parts.
COST_MODELS = ("measured", "analytic")
EXECUTORS = ("process", "dask", "serial")


def search_options(algorithm: str, alpha: float | None = None, k: int | None = None,
                   node_limit: int | None = None, k_multi: int | None = None,
                   options: Mapping[str, Any] | None = None) -> Any:
    """The algorithm's options with the settings given (None: the algorithm's default). A
    setting the algorithm does not have is a GraphsubError naming the ones it has."""
    if algorithm not in ALGORITHMS:
        raise GraphsubError(f"unknown algorithm {algorithm!r}; use one of {', '.join(ALGORITHMS)}")
    given = {name: value for name, value in (("alpha", alpha), ("k", k),
                                             ("node_limit", node_limit), ("k_multi", k_multi))
             if value is not None}
    return ALGORITHMS[algorithm].make_options(**given, **(options or {}))


def check_settings(algorithm: str = "backtracking", alpha: float | None = None,
                   budget: int | None = None, time_limit: float = 60.0,
                   cost: str | CostModel = "measured", k: int | None = None,
                   split: int | None = None, executor: str = "process",
                   node_limit: int | None = None, k_multi: int | None = None,
                   measure_limit: float | None = None, candidates: int = 3,
                   threads: int | None = None, options: Mapping[str, Any] | None = None,
                   ort_fusions: bool = False, target: str | Target | None = None) -> None:
    """Raise a GraphsubError naming the first setting out of range, or one the algorithm does
    not have: checked before any work, so that a typo does not cost a search."""
    search_options(algorithm, alpha, k, node_limit, k_multi, options)
    if ort_fusions:
        name = target if isinstance(target, str) else \
            default_target_name() if target is None else target.name
        if not name.startswith("ort-"):
            raise GraphsubError(f"--ort-fusions writes onnxruntime's own operators: it needs an "
                                f"onnxruntime target (ort-cpu, ort-cuda), not {name}")
        ort_fusions_module.check_available()
    if isinstance(cost, str) and cost not in COST_MODELS:
        raise GraphsubError(f"unknown cost model {cost!r}; use {' or '.join(COST_MODELS)}")
    if executor not in EXECUTORS:
        raise GraphsubError(f"unknown executor {executor!r}; use one of {', '.join(EXECUTORS)}")
    if not (math.isfinite(time_limit) and time_limit > 0):
        raise GraphsubError(f"--time-limit must be a positive number of seconds (got {time_limit:g})")
    if measure_limit is not None and not (math.isfinite(measure_limit) and measure_limit > 0):
        raise GraphsubError("--measure-limit must be a positive number of seconds "
                            f"(got {measure_limit:g})")
    if alpha is not None and not alpha >= 1.0:
        raise GraphsubError(f"alpha must be at least 1 (got {alpha})")
    for name, value, least in (("--k", k, 1), ("--budget", budget, 1),
                               ("--node-limit", node_limit, 1), ("--k-multi", k_multi, 0),
                               ("--candidates", candidates, 0), ("--threads", threads, 1)):
        if value is not None and value < least:
            raise GraphsubError(f"{name} must be at least {least} (got {value})")
    if split is not None and split < 2:
        raise GraphsubError(f"--split needs a part size of at least 2 operators (got {split})")


def optimize(graph: Graph, rules: Sequence[Rule] | None = None, algorithm: str = "backtracking",
             alpha: float | None = None, budget: int | None = None, time_limit: float = 60.0,
             cost: str | CostModel = "measured", threads: int | None = None,
             progress: ProgressFn | None = None, keep: int = 5,
             target: str | Target | None = None, k: int | None = None,
             split: int | None = None, executor: str = "process",
             node_limit: int | None = None, k_multi: int | None = None,
             options: Mapping[str, Any] | None = None) -> OptimizeResult:
    """Search for a cheaper equivalent graph under a cost model (the search step alone). A
    cost model given by name is built for the target (measured there, or the analytic
    profile that approximates it).

    `budget` counts the algorithm's own unit of work (ALGORITHMS[algorithm].budget_unit:
    graphs expanded for backtracking and greedy, default 1000; MCTS iterations per decision
    for mcts, default 128; e-graph iterations for eqsat, default until saturated; graphs
    expanded for the OCGGS searches, which k bounds instead by default). `alpha`
    (backtracking), `k` (pruning, dpp, sampling, enumeration), `node_limit` (eqsat, mcts) and
    `k_multi` (eqsat) are the algorithms' options, as is anything in `options`; None keeps the
    algorithm's default, and one the algorithm does not have is an error. `split` cuts graphs
    of more operators than that into parts searched separately (MetaFlow's graph split;
    `executor` runs the parts: process, dask or serial); the budget then applies per part."""
    check_settings(algorithm, alpha, budget, time_limit, cost, k, split, executor, node_limit,
                   k_multi, threads=threads, options=options)
    if isinstance(cost, str):
        model = make_cost_model(cost, target=resolve_target(target, threads))
        if isinstance(model, MeasuredCostModel):  # timing operators counts against the limit
            model.deadline = time.perf_counter() + time_limit
    else:
        model = cost
    rules = builtin_rules() if rules is None else list(rules)
    algorithm_options = search_options(algorithm, alpha, k, node_limit, k_multi, options)
    limits = Limits(time=time_limit, budget=budget, keep=keep, progress=progress)
    search = ALGORITHMS[algorithm]
    run = search.function if split is None else splitting(search, split, executor)
    return run(graph, rules, model, limits, algorithm_options)


def measure_reserve(time_limit: float) -> float:
    """The part of a time limit kept for timing and verifying candidates when no
    --measure-limit is given: a quarter, at least 2 s, at most half of the limit and 60 s."""
    return min(max(MEASURE_SHARE * time_limit, 2.0), 0.5 * time_limit, 60.0)


def optimize_model(graph: Graph, original_onnx: bytes | None = None, label: str = "model",
                   rules: Sequence[Rule] | None = None, algorithm: str = "backtracking",
                   alpha: float | None = None, budget: int | None = None,
                   time_limit: float = 60.0,
                   cost: str = "measured", threads: int | None = None,
                   measure_candidates: int = 3, measure_seconds: float = 3.0,
                   progress: ProgressFn | None = None,
                   target: str | Target | None = None,
                   stage: Callable[[str], None] | None = None,
                   k: int | None = None, split: int | None = None,
                   executor: str = "process", node_limit: int | None = None,
                   k_multi: int | None = None, measure_limit: float | None = None,
                   started: float | None = None,
                   options: Mapping[str, Any] | None = None,
                   fission: bool = True, ort_fusions: bool = False,
                   evidence: bool = True) -> tuple[bytes, OptimizeReport]:
    """Optimize for a target, choose by measurement there, verify. Returns the ONNX bytes to
    write (the original model's when nothing beats it) and the report. Raises
    VerificationError on a mismatch. `stage` is told what is happening (the search starting,
    then timing, confirming, verifying), for progress displays.

    The time limit covers the whole run from `started` (a time.perf_counter() value; default:
    now): the search gets it less measure_reserve(time_limit), and timing, confirming and
    verifying the candidates fit in what is left. With `measure_limit`, the search gets the
    whole time limit and measuring gets `measure_limit` seconds after it. A run may overshoot
    by the verification of a chosen candidate, which is never skipped.

    With `fission`, the search's best graph is also split into primitives and its kernels
    orchestrated on the target (graphsub.fission.stage): one more candidate, measured like
    the others and kept only if it runs faster.

    With `ort_fusions` (an onnxruntime target), the original and the best candidate are also
    written with onnxruntime's fused com.microsoft operators (graphsub.backends.ort_fusions),
    two more candidates; the output may then run only on onnxruntime.

    With `evidence`, the report also gets what its HTML page draws (report.evidence: time
    per operator type, the featured candidate's rewrites replayed and whether Z3 proves
    their rules); callers that never show a report (the fuzzer) leave it out.

    The stages, each a function below: search, fission, export, screen and confirm
    (selection.measure_and_choose), check equivalence, report."""
    check_settings(algorithm, alpha, budget, time_limit, cost, k, split, executor, node_limit,
                   k_multi, measure_limit, measure_candidates, threads, options, ort_fusions,
                   target)
    rules = builtin_rules() if rules is None else list(rules)
    run = _Run(started=time.perf_counter() if started is None else started,
               threads=threads or os.cpu_count() or 1, say=stage or (lambda message: None),
               device=resolve_target(target, threads),
               original=original_onnx if original_onnx is not None else to_onnx_bytes(graph))
    search = dict(rules=rules, algorithm=algorithm, alpha=alpha, budget=budget, k=k,
                  split=split, executor=executor, node_limit=node_limit, k_multi=k_multi,
                  options=options)
    cost_model = make_cost_model(cost, target=run.device)
    result = _search_stage(run, graph, cost_model, search, time_limit, measure_limit, progress,
                           fission)
    orchestrated = (_fission_stage(run, graph, result, cost_model, measure_candidates)
                    if fission and result.stats.stopped_by != StopReason.INTERRUPT else None)
    notes = list(cost_model.notes()) if isinstance(cost_model, MeasuredCostModel) else []
    interrupted = result.stats.stopped_by == StopReason.INTERRUPT
    if interrupted:
        run.say("interrupted: the search stopped; measuring and verifying what it found "
                "(Ctrl-C again to stop at once, writing nothing)")
    exported = _export_stage(graph, result, original_onnx is not None and
                             run.device.name.startswith("ort-"), run.original,
                             measure_candidates, notes)
    if ort_fusions:
        run.say("writing candidates with onnxruntime's fused operators")
        exported += _ort_fusion_stage(graph, result, exported, run.original, notes)
    deadline = (run.search_end + measure_limit if measure_limit is not None
                else run.started + time_limit)
    specs = graph_input_specs(graph)
    selection = measure_and_choose(run.device, graph, run.original, exported,
                                   random_feeds(specs), deadline, measure_seconds, say=run.say)
    notes += selection.notes
    run.measure_end = time.perf_counter()
    chosen, chosen_bytes, comparison = _check_stage(run, exported, selection, specs)
    report = OptimizeReport(
        model=label,
        settings=dict(algorithm=algorithm,
                      **asdict(search_options(algorithm, alpha, k, node_limit, k_multi, options)),
                      budget=budget, budget_unit=ALGORITHMS[algorithm].budget_unit,
                      split=split, time_limit=time_limit, measure_limit=measure_limit,
                      cost=cost, threads=run.threads, fission=fission,
                      ort_fusions=ort_fusions,
                      rules=len(rules)),
        target=run.device.name, device=run.device.device().as_dict(),
        predicted_cost_before=result.initial_cost,
        predicted_cost_after=chosen.cost if chosen is not None else result.initial_cost,
        latency_before_ms=selection.before_ms, latency_after_ms=selection.after_ms,
        speedup=(selection.confirm.speedup if chosen is not None and selection.confirm
                 else (1.0 if selection.before_ms else None)),
        confirmation=selection.confirmation(),
        kept_original=chosen is None, trace=[] if chosen is None else [asdict(s) for s in chosen.trace],
        rules_used=dict(Counter(s.rule for s in chosen.trace).most_common()) if chosen else {},
        search=result.stats.as_dict(), candidates=selection.candidates,
        verification=comparison.as_dict() if comparison is not None else
        {"equivalent": True, "note": "the original model is written unchanged"},
        nodes_before=len(graph), nodes_after=len(chosen.graph) if chosen is not None else len(graph),
        outcome=selection.outcome, notes=notes, seconds=run.seconds(time_limit, measure_limit),
        fission=_fission_report(orchestrated, chosen), timings=selection.timings,
        versions=versions())
    report.search["progress"] = run.progress
    if evidence:
        _evidence_stage(report, graph, exported, selection, cost_model, rules)
    report.verdict = verdict(report, selection, interrupted)
    return chosen_bytes, report


def _featured(selection: Any, exported: Sequence[tuple[Candidate, bytes]]) -> int | None:
    """The candidate a report shows in detail: the one kept, else the one confirmed head to
    head, else the fastest timed, else the best predicted."""
    if selection.chosen is not None:
        return selection.chosen
    if selection.confirmed is not None:
        return selection.confirmed
    timed = [(c.measured_ms, i) for i, c in enumerate(selection.candidates)
             if c.measured_ms is not None]
    return min(timed)[1] if timed else (0 if exported else None)


def _evidence_stage(report: OptimizeReport, graph: Graph,
                    exported: Sequence[tuple[Candidate, bytes]], selection: Any,
                    cost_model: CostModel, rules: Sequence[Rule]) -> None:
    """What the HTML report draws: time per operator type, the featured candidate's
    rewrites. A failure here loses a figure, with a note, never the run."""
    index = _featured(selection, exported)
    unit = "measured" if isinstance(cost_model, MeasuredCostModel) else "analytic"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            report.op_times = {"unit": unit, "original": op_times(graph, cost_model),
                               "candidate": None, "candidate_index": index}
            if index is not None:
                candidate = exported[index][0]
                report.op_times["candidate"] = op_times(candidate.graph, cost_model)
                report.rewrites = rewrite_evidence(graph, candidate, rules, index)
    except Exception as exc:  # noqa: BLE001 (the report's figures never end a run)
        report.notes.append(f"the report's rewrite and operator-time figures could not be "
                            f"made ({type(exc).__name__}: {exc})")


@dataclass
class _Run:
    """What the stages of one optimize_model run share: when it started, where it runs, the
    original model's bytes, who hears about progress, and when each stage ended."""

    started: float
    threads: int
    say: Callable[[str], None]
    device: Target
    original: bytes
    search_end: float = 0.0
    measure_end: float = 0.0
    #: (seconds, best predicted cost) as the search went, for the report's figure.
    progress: list[tuple[float, float | None]] = field(default_factory=list)

    def seconds(self, time_limit: float, measure_limit: float | None) -> dict[str, Any]:
        end = time.perf_counter()
        return {"search": round(self.search_end - self.started, 3),
                "measure": round(self.measure_end - self.search_end, 3),
                "verify": round(end - self.measure_end, 3), "total": round(end - self.started, 3),
                "time_limit": time_limit, "measure_limit": measure_limit}


def _search_stage(run: _Run, graph: Graph, cost_model: CostModel, search: dict[str, Any],
                  time_limit: float, measure_limit: float | None,
                  progress: ProgressFn | None, fission: bool = False) -> OptimizeResult:
    """The search, in what the time limit leaves for it (less the fission stage's share).
    Ctrl-C before the search loop took over (while pricing the input graph, or between a
    split search's parts) finds nothing, so the original stays."""
    seconds = time_limit - (0.0 if measure_limit is not None else measure_reserve(time_limit))
    seconds = max(seconds - (time.perf_counter() - run.started), 0.05)
    if fission:
        seconds -= fission_seconds(seconds)
    run.say(f"searching with {search['algorithm']} for up to {seconds:.1f} s")
    recorder = ProgressRecorder(progress)
    start = time.perf_counter()
    if isinstance(cost_model, MeasuredCostModel):
        cost_model.deadline = start + seconds
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # untimed operators: in the notes
            result = optimize(graph, time_limit=seconds, cost=cost_model, threads=run.threads,
                              progress=recorder, target=run.device, **search)
    except KeyboardInterrupt:
        stats = SearchStats(stopped_by=StopReason.INTERRUPT, seconds=time.perf_counter() - start)
        result = OptimizeResult(graph, (), stats, math.nan, math.nan, [])
    run.search_end = time.perf_counter()
    run.progress = recorder.points(result)
    return result


class ProgressRecorder:
    """A progress callback that also keeps (seconds, best cost) each time the best cost
    changes, for the report's figure of the search, and passes every call on."""

    def __init__(self, forward: ProgressFn | None = None) -> None:
        self.forward = forward
        self._points: list[tuple[float, float | None]] = []

    def __call__(self, progress: SearchProgress) -> None:
        if progress.best_cost is not None and (
                not self._points or progress.best_cost != self._points[-1][1]):
            self._points.append((round(progress.seconds, 4), progress.best_cost))
        if self.forward is not None:
            self.forward(progress)

    def points(self, result: OptimizeResult) -> list[tuple[float, float | None]]:
        """The points, from the input graph's cost to the search's final cost when it ended."""
        start = [(0.0, result.initial_cost)] if math.isfinite(result.initial_cost) else []
        end = ([(round(result.stats.seconds, 4), result.final_cost)]
               if math.isfinite(result.final_cost) else [])
        return start + self._points + end


def fission_seconds(search_seconds: float) -> float:
    """The time fission and orchestration get out of what the search would have had."""
    return min(FISSION_SHARE * search_seconds, FISSION_MAX_SECONDS)


def _fission_stage(run: _Run, graph: Graph, result: OptimizeResult, cost_model: CostModel,
                   measured: int) -> FissionOutcome | None:
    """The search's best graph split into primitives and its kernels orchestrated on the
    target: a candidate of its own, placed among the first `measured` so that it is timed.
    A failure inside is a note in the report's fission section, never the end of the run."""
    base = result.candidates[0] if result.candidates else Candidate(graph, result.initial_cost, ())
    seconds = fission_seconds(run.search_end - run.started)
    run.say(f"splitting operators and orchestrating kernels for up to {max(seconds, 0.5):.1f} s")
    start = time.perf_counter()
    if isinstance(cost_model, MeasuredCostModel):
        cost_model.deadline = start + max(seconds, 0.5)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # untimed operators: in the notes
            outcome = fission_and_orchestrate(
                base.graph, cost_model, lambda g: run.device.runs_as_one_kernel(g),
                time_limit=max(seconds, 0.5), generate=run.device.generates_kernels)
    except (GraphsubError, ValueError, RuntimeError) as exc:
        warnings.warn(f"fission and orchestration failed and were skipped: {exc}",
                      RuntimeWarning, stacklevel=2)
        return None
    except KeyboardInterrupt:
        run.say("interrupted: fission skipped; measuring what the search found")
        return None
    finally:
        run.search_end = time.perf_counter()
    known = {c.graph.structural_hash() for c in result.candidates} | {graph.structural_hash()}
    if outcome.graph.structural_hash() not in known:
        candidate = Candidate(outcome.graph, outcome.cost,
                              base.trace + (Step.of_kind(StepKind.FISSION, outcome.cost),))
        at = 0 if outcome.cost < base.cost else min(1, len(result.candidates))
        result.candidates.insert(min(at, max(measured - 1, 0)), candidate)
    return outcome


def _fission_report(outcome: FissionOutcome | None, chosen: Candidate | None) -> dict[str, Any]:
    if outcome is None:
        return {}
    kept = chosen is not None and any(s.kind == StepKind.FISSION for s in chosen.trace)
    return {**outcome.as_dict(), "kept": kept}


def _export_stage(graph: Graph, result: OptimizeResult, reexport: bool, original: bytes,
                  limit: int, notes: list[str]) -> list[tuple[Candidate, bytes]]:
    """The distinct candidates as ONNX bytes; one that cannot be written is dropped with a
    note. With `reexport` (an onnxruntime target, given the user's file), graphsub's own
    export of the unchanged graph (shape computations folded, dead and no-op nodes gone) is a
    candidate of its own where it differs from the file."""
    out = []
    seen = {graph.structural_hash()}
    for c in result.candidates:
        if len(out) >= limit:
            break
        h = c.graph.structural_hash()
        if h in seen:
            continue
        seen.add(h)
        try:
            out.append((c, to_onnx_bytes(c.graph)))
        except GraphsubError as exc:
            notes.append(f"candidate {len(out)} could not be written as ONNX and was dropped "
                         f"({exc})")
    if reexport:
        data = to_onnx_bytes(graph)
        if _op_counts(data) != _op_counts(original):
            out.insert(0, (Candidate(graph, result.initial_cost, ()), data))
    return out


def _ort_fusion_stage(graph: Graph, result: OptimizeResult,
                      exported: list[tuple[Candidate, bytes]], original: bytes,
                      notes: list[str]) -> list[tuple[Candidate, bytes]]:
    """The original and the best exported candidate written with onnxruntime's fused
    operators, where onnxscript's patterns match them: the fusions apply to what graphsub's
    rewrites leave as well as to what the exporter wrote, and either can be the faster."""
    sources = [(Candidate(graph, result.initial_cost, ()), original), *exported[:1]]
    out = []
    for candidate, data in sources:
        try:
            fused = ort_fusions_module.fuse(data)
        except GraphsubError as exc:
            notes.append(f"a candidate could not be written with onnxruntime's fused operators: "
                         f"{exc}")
            continue
        if fused is not None:
            step = Step.of_kind(StepKind.ORT_FUSIONS, candidate.cost)
            out.append((Candidate(candidate.graph, candidate.cost, (*candidate.trace, step)),
                        fused))
    if not out:
        notes.append("onnxruntime fusions: onnxscript's patterns matched nothing in this model")
    return out


def _op_counts(model: bytes) -> Counter[str]:
    import onnx

    proto = onnx.load_from_string(model)
    return Counter(n.op_type for n in proto.graph.node)


def _check_stage(run: _Run, exported: list[tuple[Candidate, bytes]], selection: Any,
                 specs: Any) -> tuple[Candidate | None, bytes, Comparison | None]:
    """The chosen candidate checked against the original (in onnxruntime on the bytes to be
    written, then on the target itself); raises VerificationError on a mismatch. Returns the
    chosen candidate (None: the original stays), the bytes to write and the comparison."""
    if selection.chosen is None and selection.mismatch is None:
        return None, run.original, None
    if selection.mismatch is not None:  # the measurement already saw it compute otherwise
        index, comparison = selection.mismatch
        chosen = exported[index][0]
    else:
        chosen, data = exported[selection.chosen]
        run.say("verifying the optimized model against the original")
        try:
            comparison = check_equivalence(run.original, data, specs, run.threads)
            if comparison.equivalent and not run.device.name.startswith("ort-"):
                comparison = check_equivalence_on_target(run.original, selection.runnable,
                                                         specs, run.threads)
        finally:
            selection.runnable.close()
    if not comparison.equivalent:
        raise VerificationError.of(comparison, [s.rule for s in chosen.trace])
    data = exported[selection.chosen][1] if selection.chosen is not None else run.original
    return chosen, data, comparison


def check_equivalence(a: bytes, b: bytes, specs, threads: int) -> Comparison:
    """Whether model b computes what model a computes, in onnxruntime on two sets of random
    inputs (runtime.equivalence.SAME_FUNCTION)."""
    return compare_models(a, b, specs, SAME_FUNCTION, trials=2, threads=threads)


def check_equivalence_on_target(original: bytes, runnable, specs, threads: int) -> Comparison:
    """Whether the chosen graph, as the target runs it (torch), computes what the original
    model computes in onnxruntime (runtime.equivalence.SAME_FUNCTION)."""
    from graphsub.runtime.ort import make_session, run

    session = make_session(original, threads)
    return compare_runners(lambda feeds: run(session, feeds), runnable.run, specs,
                           SAME_FUNCTION, trials=2)
