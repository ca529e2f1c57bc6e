"""The optimizer end to end: search, measure, choose, verify, on the user's target.

The target (`graphsub.backends`) names where the model will run: onnxruntime on the CPU or a
GPU, or graphsub's torch backend on the CPU or a GPU. Search costs are predictions (measured
per operator on the target, or analytic). After the search, the original model and the few
best candidates are timed end to end on the target, side by side; the fastest is then timed
head to head against the original, round by round, and replaces it only if it is faster by
MIN_GAIN in the median round and in most rounds. Otherwise the original is kept and the report
says so. Whatever is chosen is checked against the original on random inputs before anything
is written (in onnxruntime, on the ONNX bytes to be written, and on the target itself): a
mismatch is an error, never a warning.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from graphsub.backends import Target, get_target
from graphsub.cost import CostModel, make_cost_model
from graphsub.errors import GraphsubError
from graphsub.ir.graph import Graph
from graphsub.onnx_io.exporter import to_onnx_bytes
from graphsub.rules import Rule, builtin_rules
from graphsub.runtime.compare import Comparison, compare_models, compare_runners
from graphsub.runtime.inputs import graph_input_specs, random_feeds
from graphsub.runtime.timing import PairedComparison, compare_runnables, time_runnables
from graphsub.search import ALGORITHMS, EGRAPH_BASED, LENGTH_BOUNDED, Candidate, OptimizeResult
from graphsub.search.backtracking import ProgressFn
from graphsub.search.split import split_search

#: Tolerances for "computes the same function": rewrites reassociate float32 sums, so the
#: absolute tolerance scales with each output's magnitude.
RTOL, ATOL_SCALE = 1e-3, 1e-4
#: A candidate replaces the original only when its median latency is this much lower: smaller
#: differences are within the noise of interleaved medians on a shared machine.
MIN_GAIN = 0.02
#: ... and when it was faster in at least this fraction of the head-to-head rounds.
MIN_WINS = 0.7


class VerificationError(GraphsubError):
    """The optimized model does not compute what the original computes."""

    def __init__(self, message: str, trace: Sequence[str], comparison: Comparison) -> None:
        super().__init__(message)
        self.trace = list(trace)
        self.comparison = comparison


def resolve_target(target: str | Target | None, threads: int | None = None) -> Target:
    """A Target from a name (None: this machine's default, torch-cuda with a GPU)."""
    return target if isinstance(target, Target) else get_target(target, threads=threads)


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
    if algorithm not in ALGORITHMS:
        raise GraphsubError(f"unknown algorithm {algorithm!r}; use one of {', '.join(ALGORITHMS)}")
    if k < 1:
        raise GraphsubError(f"the sequence length bound k must be at least 1 (got {k})")
    if alpha < 1.0:
        raise GraphsubError(f"alpha must be at least 1 (got {alpha})")
    if split is not None and split < 2:
        raise GraphsubError(f"--split needs a part size of at least 2 operators (got {split})")
    if isinstance(cost, str):
        model = make_cost_model(cost, threads, target=resolve_target(target, threads))
    else:
        model = cost
    rules = builtin_rules() if rules is None else list(rules)
    search = ALGORITHMS[algorithm]
    kwargs: dict[str, Any] = dict(time_limit=time_limit, progress=progress, keep=keep)
    if algorithm in LENGTH_BOUNDED:
        kwargs["k"] = k  # bounded by length and time: expansions are not comparable units
    elif algorithm in EGRAPH_BASED:
        kwargs["budget"] = budget
        if node_limit is not None:
            kwargs["node_limit"] = node_limit
        if algorithm == "eqsat":
            kwargs["k_multi"] = k_multi
    else:
        kwargs["budget"] = 1000 if budget is None else budget
    if algorithm == "backtracking":
        kwargs["alpha"] = alpha
    if split is not None:
        return split_search(graph, rules, model, search, threshold=split, executor=executor,
                            **kwargs)
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
    target: str
    device: dict[str, Any]
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
    confirmation: dict[str, Any] = field(default_factory=dict)
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


def _op_counts(model: bytes) -> Counter[str]:
    import onnx

    proto = onnx.load_from_string(model)
    return Counter(n.op_type for n in proto.graph.node)


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
                   k_multi: int = 1) -> tuple[bytes, OptimizeReport]:
    """Optimize for a target, choose by measurement there, verify. Returns the ONNX bytes to
    write (the original model's when nothing beats it) and the report. Raises
    VerificationError on a mismatch. `stage` is told what is happening after the search
    (timing, confirming, verifying), for progress displays."""
    threads = threads or os.cpu_count() or 1
    say = stage or (lambda message: None)
    device = resolve_target(target, threads)
    original = original_onnx if original_onnx is not None else to_onnx_bytes(graph)
    result = optimize(graph, rules, algorithm, alpha, budget, time_limit, cost, threads, progress,
                      target=device, k=k, split=split, executor=executor,
                      node_limit=node_limit, k_multi=k_multi)
    specs = graph_input_specs(graph)
    candidates = _distinct(result.candidates, graph.structural_hash(), measure_candidates)
    exported = [to_onnx_bytes(c.graph) for c in candidates]
    if original_onnx is not None and device.name.startswith("ort-"):
        # graphsub's own export of the unchanged graph (shape computations folded, dead and
        # no-op nodes gone) is a candidate of its own where onnxruntime runs the file.
        reexport = to_onnx_bytes(graph)
        if _op_counts(reexport) != _op_counts(original):
            candidates.insert(0, Candidate(graph, result.initial_cost, ()))
            exported.insert(0, reexport)

    chosen_bytes, chosen = original, None
    before_ms = after_ms = None
    confirm: PairedComparison | None = None
    cand_reports: list[CandidateReport] = []
    feeds = random_feeds(specs)
    chosen_runnable = None
    if candidates:
        say(f"timing the original and {len(candidates)} candidate(s) on {device.name}")
        runnables = [device.prepare(graph, original, "original")]
        runnables += [device.prepare(c.graph, data, f"candidate {i}")
                      for i, (c, data) in enumerate(zip(candidates, exported))]
        # Screen: the original and the candidates side by side; the fastest goes on.
        timings = time_runnables(runnables, feeds, min_seconds=measure_seconds)
        before_ms = after_ms = timings[0].median * 1e3
        for c, t in zip(candidates, timings[1:]):
            cand_reports.append(CandidateReport(c.cost, t.median * 1e3, [s.rule for s in c.trace]))
        best = min(range(len(candidates)), key=lambda i: timings[i + 1].median)
        if timings[best + 1].median < timings[0].median:
            # Confirm head to head, round by round: one lucky screening is not enough.
            say(f"confirming the fastest candidate head to head on {device.name}")
            confirm = compare_runnables(runnables[0], runnables[best + 1], feeds,
                                        min_seconds=max(measure_seconds, 4.0))
            before_ms = confirm.before.median * 1e3
            after_ms = confirm.after.median * 1e3
            if confirm.speedup >= 1 / (1 - MIN_GAIN) and confirm.wins >= MIN_WINS:
                chosen, chosen_bytes = candidates[best], exported[best]
            else:
                after_ms = before_ms
        chosen_runnable = runnables[best + 1] if chosen is not None else None
        for r in runnables:
            if r is not chosen_runnable:
                r.close()

    comparison = None
    if chosen is not None:
        say("verifying the optimized model against the original")
        comparison = verify(original, chosen_bytes, specs, threads)
        if comparison.equivalent and not device.name.startswith("ort-"):
            comparison = verify_on_target(original, chosen_runnable, specs, threads)
        chosen_runnable.close()
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
        settings=dict(algorithm=algorithm, alpha=alpha, budget=budget, k=k, split=split,
                      **({"node_limit": node_limit, "k_multi": k_multi}
                         if algorithm in EGRAPH_BASED else {}),
                      time_limit=time_limit, cost=cost, threads=threads,
                      rules=len(rules) if rules is not None else "builtin"),
        target=device.name, device=device.device().as_dict(),
        predicted_cost_before=result.initial_cost,
        predicted_cost_after=chosen.cost if chosen is not None else result.initial_cost,
        latency_before_ms=before_ms, latency_after_ms=after_ms,
        speedup=(confirm.speedup if chosen is not None and confirm is not None
                 else (1.0 if before_ms else None)),
        confirmation=({"speedup": confirm.speedup, "wins": confirm.wins,
                       "rounds": len(confirm.ratios)} if confirm is not None else {}),
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



def verify_on_target(original: bytes, runnable, specs, threads: int) -> Comparison:
    """Compare the chosen graph as the target runs it (torch) with the original model in
    onnxruntime, with the tolerances of `verify`."""
    from graphsub.runtime.ort import make_session, run

    session = make_session(original, threads)
    ref = run(session, random_feeds(specs, seed=0))
    scale = max((float(abs(v).max()) for v in ref.values() if v.size), default=1.0)
    return compare_runners(lambda feeds: run(session, feeds), runnable.run, specs, rtol=RTOL,
                           atol=ATOL_SCALE * scale, trials=2)
