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
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

from graphsub.backends import Target, get_target
from graphsub.cost import CostModel, MeasuredCostModel, make_cost_model
from graphsub.errors import GraphsubError
from graphsub.ir.graph import Graph
from graphsub.onnx_io.exporter import to_onnx_bytes
from graphsub.report.optimize import OptimizeReport, verdict
from graphsub.rules import Rule, builtin_rules
from graphsub.runtime.equivalence import (SAME_FUNCTION, Comparison, compare_models,
                                          compare_runners)
from graphsub.runtime.inputs import graph_input_specs, random_feeds
import graphsub.egraph  # noqa: F401  (registers the e-graph searches by name)
from graphsub.search import ALGORITHMS, Candidate, OptimizeResult, SearchStats
from graphsub.search.result import ProgressFn, StopReason
from graphsub.search.split import split_search
from graphsub.selection import measure_and_choose

#: The share of the time limit kept for timing and verifying candidates (measure_reserve).
MEASURE_SHARE = 0.25


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


def check_settings(algorithm: str = "backtracking", alpha: float = 1.05,
                   budget: int | None = None, time_limit: float = 60.0,
                   cost: str | CostModel = "measured", k: int = 10, split: int | None = None,
                   executor: str = "process", node_limit: int | None = None, k_multi: int = 1,
                   measure_limit: float | None = None, candidates: int = 3,
                   threads: int | None = None) -> None:
    """Raise a GraphsubError naming the first setting out of range: checked before any work,
    so that a typo does not cost a search."""
    if algorithm not in ALGORITHMS:
        raise GraphsubError(f"unknown algorithm {algorithm!r}; use one of {', '.join(ALGORITHMS)}")
    if isinstance(cost, str) and cost not in COST_MODELS:
        raise GraphsubError(f"unknown cost model {cost!r}; use {' or '.join(COST_MODELS)}")
    if executor not in EXECUTORS:
        raise GraphsubError(f"unknown executor {executor!r}; use one of {', '.join(EXECUTORS)}")
    if not (math.isfinite(time_limit) and time_limit > 0):
        raise GraphsubError(f"--time-limit must be a positive number of seconds (got {time_limit:g})")
    if measure_limit is not None and not (math.isfinite(measure_limit) and measure_limit > 0):
        raise GraphsubError("--measure-limit must be a positive number of seconds "
                            f"(got {measure_limit:g})")
    if not alpha >= 1.0:
        raise GraphsubError(f"alpha must be at least 1 (got {alpha})")
    for name, value, least in (("--k", k, 1), ("--budget", budget, 1),
                               ("--node-limit", node_limit, 1), ("--k-multi", k_multi, 0),
                               ("--candidates", candidates, 0), ("--threads", threads, 1)):
        if value is not None and value < least:
            raise GraphsubError(f"{name} must be at least {least} (got {value})")
    if split is not None and split < 2:
        raise GraphsubError(f"--split needs a part size of at least 2 operators (got {split})")


def optimize(graph: Graph, rules: Sequence[Rule] | None = None, algorithm: str = "backtracking",
             alpha: float = 1.05, budget: int | None = None, time_limit: float = 60.0,
             cost: str | CostModel = "measured", threads: int | None = None,
             progress: ProgressFn | None = None, keep: int = 5,
             target: str | Target | None = None, k: int = 10, split: int | None = None,
             executor: str = "process", node_limit: int | None = None,
             k_multi: int = 1) -> OptimizeResult:
    """Search for a cheaper equivalent graph under a cost model (the search step alone). A
    cost model given by name is built for the target (measured there, or the analytic
    profile that approximates it). `k` bounds the sequence length of the OCGGS algorithms
    (pruning, dpp, sampling, enumeration). `split` cuts graphs of more operators than that
    into parts searched separately (MetaFlow's graph split; `executor` runs the parts:
    process, dask or serial); the budget and k then apply per part. `budget` is the most
    graphs to expand for backtracking and greedy (default 1000), MCTS iterations per decision
    for mcts (default 128), and iterations for eqsat (default: until saturated); `node_limit`
    and `k_multi` bound the e-graph of eqsat and mcts (default node limits: 20,000 for eqsat,
    room to saturate most zoo models; 2,000 for mcts, as in the MCTS paper)."""
    check_settings(algorithm, alpha, budget, time_limit, cost, k, split, executor, node_limit,
                   k_multi, threads=threads)
    if isinstance(cost, str):
        model = make_cost_model(cost, target=resolve_target(target, threads))
        if isinstance(model, MeasuredCostModel):  # timing operators counts against the limit
            model.deadline = time.perf_counter() + time_limit
    else:
        model = cost
    rules = builtin_rules() if rules is None else list(rules)
    search = ALGORITHMS[algorithm]
    settings = {"alpha": alpha, "budget": budget, "k": k, "node_limit": node_limit,
                "k_multi": k_multi}
    kwargs: dict[str, Any] = dict(time_limit=time_limit, progress=progress, keep=keep)
    kwargs.update((name, value) for name, value in settings.items()
                  if name in search.settings and value is not None)
    if split is not None:
        return split_search(graph, rules, model, search.function, threshold=split,
                            executor=executor, **kwargs)
    return search.function(graph, rules, model, **kwargs)


def measure_reserve(time_limit: float) -> float:
    """The part of a time limit kept for timing and verifying candidates when no
    --measure-limit is given: a quarter, at least 2 s, at most half of the limit and 60 s."""
    return min(max(MEASURE_SHARE * time_limit, 2.0), 0.5 * time_limit, 60.0)


def _distinct(candidates: list[Candidate], original_hash: str, limit: int) -> list[Candidate]:
    out, seen = [], {original_hash}
    for c in candidates:
        h = c.graph.structural_hash()
        if h not in seen:
            seen.add(h)
            out.append(c)
        if len(out) >= limit:
            break
    return out


def _op_counts(model: bytes) -> Counter[str]:
    import onnx

    proto = onnx.load_from_string(model)
    return Counter(n.op_type for n in proto.graph.node)


def _exported(candidates: list[Candidate], notes: list[str]) -> list[tuple[Candidate, bytes]]:
    """The candidates as ONNX bytes; one that cannot be exported is dropped with a note."""
    out = []
    for i, c in enumerate(candidates):
        try:
            out.append((c, to_onnx_bytes(c.graph)))
        except GraphsubError as exc:
            notes.append(f"candidate {i} could not be written as ONNX and was dropped ({exc})")
    return out


def optimize_model(graph: Graph, original_onnx: bytes | None = None, label: str = "model",
                   rules: Sequence[Rule] | None = None, algorithm: str = "backtracking",
                   alpha: float = 1.05, budget: int | None = None, time_limit: float = 60.0,
                   cost: str = "measured", threads: int | None = None,
                   measure_candidates: int = 3, measure_seconds: float = 3.0,
                   progress: ProgressFn | None = None,
                   target: str | Target | None = None,
                   stage: Callable[[str], None] | None = None,
                   k: int = 10, split: int | None = None,
                   executor: str = "process", node_limit: int | None = None,
                   k_multi: int = 1, measure_limit: float | None = None,
                   started: float | None = None) -> tuple[bytes, OptimizeReport]:
    """Optimize for a target, choose by measurement there, verify. Returns the ONNX bytes to
    write (the original model's when nothing beats it) and the report. Raises
    VerificationError on a mismatch. `stage` is told what is happening (the search starting,
    then timing, confirming, verifying), for progress displays.

    The time limit covers the whole run from `started` (a time.perf_counter() value; default:
    now): the search gets it less measure_reserve(time_limit), and timing, confirming and
    verifying the candidates fit in what is left. With `measure_limit`, the search gets the
    whole time limit and measuring gets `measure_limit` seconds after it. A run may overshoot
    by the verification of a chosen candidate, which is never skipped."""
    check_settings(algorithm, alpha, budget, time_limit, cost, k, split, executor, node_limit,
                   k_multi, measure_limit, measure_candidates, threads)
    started = time.perf_counter() if started is None else started
    threads = threads or os.cpu_count() or 1
    say = stage or (lambda message: None)
    device = resolve_target(target, threads)
    original = original_onnx if original_onnx is not None else to_onnx_bytes(graph)
    cost_model = make_cost_model(cost, target=device)
    search_seconds = time_limit - (0.0 if measure_limit is not None else measure_reserve(time_limit))
    search_seconds = max(search_seconds - (time.perf_counter() - started), 0.05)
    say(f"searching with {algorithm} for up to {search_seconds:.1f} s")
    search_start = time.perf_counter()
    if isinstance(cost_model, MeasuredCostModel):
        cost_model.deadline = search_start + search_seconds
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # untimed operators: in the notes
            result = optimize(graph, rules, algorithm, alpha, budget, search_seconds,
                              cost_model, threads, progress, target=device, k=k, split=split,
                              executor=executor, node_limit=node_limit, k_multi=k_multi)
    except KeyboardInterrupt:
        # Interrupted before the search loop took over (while pricing the input graph, or
        # between a split search's parts): nothing found, so the original stays.
        stats = SearchStats(stopped_by=StopReason.INTERRUPT, seconds=time.perf_counter() - search_start)
        result = OptimizeResult(graph, (), stats, math.nan, math.nan, [])
    search_end = time.perf_counter()
    notes = list(cost_model.notes()) if isinstance(cost_model, MeasuredCostModel) else []
    interrupted = result.stats.stopped_by == StopReason.INTERRUPT
    if interrupted:
        say("interrupted: the search stopped; measuring and verifying what it found "
            "(Ctrl-C again to stop at once, writing nothing)")
    deadline = (search_end + measure_limit if measure_limit is not None
                else started + time_limit)
    specs = graph_input_specs(graph)
    exported = _exported(_distinct(result.candidates, graph.structural_hash(),
                                   measure_candidates), notes)
    if original_onnx is not None and device.name.startswith("ort-"):
        # graphsub's own export of the unchanged graph (shape computations folded, dead and
        # no-op nodes gone) is a candidate of its own where onnxruntime runs the file.
        reexport = to_onnx_bytes(graph)
        if _op_counts(reexport) != _op_counts(original):
            exported.insert(0, (Candidate(graph, result.initial_cost, ()), reexport))
    selection = measure_and_choose(device, graph, original, exported, random_feeds(specs),
                                   deadline, measure_seconds, say=say)
    notes += selection.notes
    measure_end = time.perf_counter()

    chosen = exported[selection.chosen][0] if selection.chosen is not None else None
    chosen_bytes = exported[selection.chosen][1] if selection.chosen is not None else original
    comparison = None
    if selection.mismatch is not None:
        index, comparison = selection.mismatch
        chosen = exported[index][0]
    elif chosen is not None:
        say("verifying the optimized model against the original")
        try:
            comparison = check_equivalence(original, chosen_bytes, specs, threads)
            if comparison.equivalent and not device.name.startswith("ort-"):
                comparison = check_equivalence_on_target(original, selection.runnable, specs, threads)
        finally:
            selection.runnable.close()
    trace = [] if chosen is None else [asdict(s) for s in chosen.trace]
    if comparison is not None and not comparison.equivalent:
        raise VerificationError.of(comparison, [s["rule"] for s in trace])
    end = time.perf_counter()

    report = OptimizeReport(
        model=label,
        settings=dict(algorithm=algorithm, alpha=alpha, budget=budget, k=k, split=split,
                      **({"node_limit": node_limit, "k_multi": k_multi}
                         if ALGORITHMS[algorithm].egraph else {}),
                      time_limit=time_limit, measure_limit=measure_limit, cost=cost,
                      threads=threads, rules=len(rules) if rules is not None else "builtin"),
        target=device.name, device=device.device().as_dict(),
        predicted_cost_before=result.initial_cost,
        predicted_cost_after=chosen.cost if chosen is not None else result.initial_cost,
        latency_before_ms=selection.before_ms, latency_after_ms=selection.after_ms,
        speedup=(selection.confirm.speedup if chosen is not None and selection.confirm
                 else (1.0 if selection.before_ms else None)),
        confirmation=selection.confirmation(),
        kept_original=chosen is None, trace=trace,
        rules_used=dict(Counter(s.rule for s in chosen.trace).most_common()) if chosen else {},
        search=result.stats.as_dict(), candidates=selection.candidates,
        verification=comparison.as_dict() if comparison is not None else
        {"equivalent": True, "note": "the original model is written unchanged"},
        nodes_before=len(graph), nodes_after=len(chosen.graph) if chosen is not None else len(graph),
        outcome=selection.outcome, notes=notes,
        seconds={"search": round(search_end - started, 3),
                 "measure": round(measure_end - search_end, 3),
                 "verify": round(end - measure_end, 3), "total": round(end - started, 3),
                 "time_limit": time_limit, "measure_limit": measure_limit})
    report.verdict = verdict(report, selection, interrupted)
    return chosen_bytes, report


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
