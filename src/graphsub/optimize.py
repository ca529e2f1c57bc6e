"""The optimizer end to end: search, measure, choose, verify.

Search costs are predictions. So after the search, the original model and the few best
candidates are timed end to end in onnxruntime (all its optimizations on, interleaved,
medians) and the fastest wins; when no candidate beats the original, the original is kept
and the report says so. Whatever is chosen is checked against the original on random inputs
before anything is written: a mismatch is an error, never a warning.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from graphsub.cost import CostModel, make_cost_model
from graphsub.errors import GraphsubError
from graphsub.ir.graph import Graph
from graphsub.onnx_io.exporter import to_onnx_bytes
from graphsub.rules import Rule, builtin_rules
from graphsub.runtime.compare import Comparison, compare_models
from graphsub.runtime.inputs import graph_input_specs, random_feeds
from graphsub.runtime.ort import time_models
from graphsub.search import ALGORITHMS, Candidate, OptimizeResult
from graphsub.search.backtracking import ProgressFn

#: Tolerances for "computes the same function": rewrites reassociate float32 sums, so the
#: absolute tolerance scales with each output's magnitude.
RTOL, ATOL_SCALE = 1e-3, 1e-4
#: A candidate replaces the original only when its median latency is this much lower: smaller
#: differences are within the noise of interleaved medians on a shared machine.
MIN_GAIN = 0.02


class VerificationError(GraphsubError):
    """The optimized model does not compute what the original computes."""

    def __init__(self, message: str, trace: Sequence[str], comparison: Comparison) -> None:
        super().__init__(message)
        self.trace = list(trace)
        self.comparison = comparison


def optimize(graph: Graph, rules: Sequence[Rule] | None = None, algorithm: str = "backtracking",
             alpha: float = 1.05, budget: int = 1000, time_limit: float = 60.0,
             cost: str | CostModel = "measured", threads: int | None = None,
             progress: ProgressFn | None = None, keep: int = 5) -> OptimizeResult:
    """Search for a cheaper equivalent graph under a cost model (the search step alone)."""
    if algorithm not in ALGORITHMS:
        raise GraphsubError(f"unknown algorithm {algorithm!r}; use {' or '.join(ALGORITHMS)}")
    if alpha < 1.0:
        raise GraphsubError(f"alpha must be at least 1 (got {alpha})")
    model = make_cost_model(cost, threads) if isinstance(cost, str) else cost
    rules = builtin_rules() if rules is None else list(rules)
    search = ALGORITHMS[algorithm]
    kwargs: dict[str, Any] = dict(budget=budget, time_limit=time_limit, progress=progress,
                                  keep=keep)
    if algorithm == "backtracking":
        kwargs["alpha"] = alpha
    return search(graph, rules, model, **kwargs)


@dataclass
class CandidateReport:
    predicted_cost: float
    measured_ms: float
    rules: list[str]


@dataclass
class OptimizeReport:
    """Everything `graphsub optimize` found out, as written to --report."""

    model: str
    settings: dict[str, Any]
    predicted_cost_before: float
    predicted_cost_after: float
    latency_before_ms: float | None
    latency_after_ms: float | None
    speedup: float | None
    kept_original: bool
    trace: list[dict[str, Any]]
    rules_used: dict[str, int]
    search: dict[str, Any]
    candidates: list[CandidateReport] = field(default_factory=list)
    verification: dict[str, Any] = field(default_factory=dict)
    nodes_before: int = 0
    nodes_after: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


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


def optimize_model(graph: Graph, original_onnx: bytes | None = None, label: str = "model",
                   rules: Sequence[Rule] | None = None, algorithm: str = "backtracking",
                   alpha: float = 1.05, budget: int = 1000, time_limit: float = 60.0,
                   cost: str = "measured", threads: int | None = None,
                   measure_candidates: int = 3, measure_seconds: float = 3.0,
                   progress: ProgressFn | None = None) -> tuple[bytes, OptimizeReport]:
    """Optimize, choose by measurement, verify. Returns the ONNX bytes to write (the original
    model's when nothing beats it) and the report. Raises VerificationError on a mismatch."""
    threads = threads or os.cpu_count() or 1
    original = original_onnx if original_onnx is not None else to_onnx_bytes(graph)
    result = optimize(graph, rules, algorithm, alpha, budget, time_limit, cost, threads, progress)
    specs = graph_input_specs(graph)
    candidates = _distinct(result.candidates, graph.structural_hash(), measure_candidates)
    exported = [to_onnx_bytes(c.graph) for c in candidates]

    chosen_bytes, chosen = original, None
    before_ms = after_ms = None
    cand_reports: list[CandidateReport] = []
    if candidates:
        timings = time_models([original, *exported], random_feeds(specs), threads=threads,
                              min_seconds=measure_seconds)
        before_ms = timings[0].median * 1e3
        after_ms = before_ms
        for c, t in zip(candidates, timings[1:]):
            cand_reports.append(CandidateReport(c.cost, t.median * 1e3, [s.rule for s in c.trace]))
        best = min(range(len(candidates)), key=lambda i: timings[i + 1].median)
        if timings[best + 1].median < (1 - MIN_GAIN) * timings[0].median:
            chosen, chosen_bytes = candidates[best], exported[best]
            after_ms = timings[best + 1].median * 1e3

    comparison = verify(original, chosen_bytes, specs, threads) if chosen is not None else None
    trace = [] if chosen is None else [asdict(s) for s in chosen.trace]
    if comparison is not None and not comparison.equivalent:
        worst = comparison.worst
        raise VerificationError(
            "the optimized model does not match the original "
            f"({worst.describe() if worst else '; '.join(comparison.problems)}); nothing was "
            f"written. Rules applied, in order: {', '.join(s['rule'] for s in trace)}",
            [s["rule"] for s in trace], comparison)

    report = OptimizeReport(
        model=label,
        settings=dict(algorithm=algorithm, alpha=alpha, budget=budget, time_limit=time_limit,
                      cost=cost, threads=threads, rules=len(rules) if rules is not None else "builtin"),
        predicted_cost_before=result.initial_cost,
        predicted_cost_after=chosen.cost if chosen is not None else result.initial_cost,
        latency_before_ms=before_ms, latency_after_ms=after_ms,
        speedup=(before_ms / after_ms) if before_ms and after_ms else None,
        kept_original=chosen is None, trace=trace,
        rules_used=dict(Counter(s.rule for s in chosen.trace).most_common()) if chosen else {},
        search=result.stats.as_dict(), candidates=cand_reports,
        verification=comparison.as_dict() if comparison is not None else
        {"equivalent": True, "note": "the original model is written unchanged"},
        nodes_before=len(graph), nodes_after=len(chosen.graph) if chosen is not None else len(graph))
    return chosen_bytes, report


def verify(a: bytes, b: bytes, specs, threads: int) -> Comparison:
    """Compare two models on random inputs, with relative tolerance RTOL and an absolute
    tolerance of ATOL_SCALE x the largest output magnitude: elements near zero of a large
    output may differ by rounding once sums are reassociated."""
    from graphsub.runtime.ort import run

    feeds = random_feeds(specs, seed=0)
    ref = run(a, feeds, threads)
    scale = max((float(abs(v).max()) for v in ref.values() if v.size), default=1.0)
    return compare_models(a, b, specs, rtol=RTOL, atol=ATOL_SCALE * scale, trials=2,
                          threads=threads)
