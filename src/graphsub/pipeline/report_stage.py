"""The last stage of `optimize_model`: everything the run found out, as an OptimizeReport."""

from __future__ import annotations

import math
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, replace
from typing import Any, overload

from graphsub.budget import StageClock
from graphsub.ir.graph import Graph
from graphsub.pipeline.verify_stage import Verified
from graphsub.pipeline.run import RunContext, Stage
from graphsub.pipeline.values import Exported, Found
from graphsub.report.evidence import op_times, rewrite_evidence
from graphsub.report.optimize import OptimizeReport, verdict, versions
from graphsub.report.summary import operator_count
from graphsub.runtime.check_sizes import default_profile
from graphsub.search.result import Candidate, StepKind
from graphsub.selection import Selection


def report(context: RunContext, clock: StageClock, found: Found, exported: Sequence[Exported],
           verified: Verified) -> OptimizeReport:
    """The report: the outcome and its figures, the search's statistics and progress, the
    candidates, the verification, and (with `settings.evidence`) what the HTML page draws.
    The seconds per stage are filled in by whoever ends the run. Its prices time nothing
    more (run_stage: only pricing stages time operators)."""
    result, selection, chosen = found.result, verified.selection, verified.chosen
    graph, settings = context.graph, context.settings

    def latency(of: Graph) -> float:
        """Predicted latency (NaN when Ctrl-C came before the input graph was priced)."""
        return math.nan if math.isnan(result.initial_cost) else \
            context.time_model.graph_cost(of)

    comparison, failure = verified.comparison, verified.failure
    shapes: dict[str, Any] = {}
    if context.profile:
        source = ("given" if settings.shape_profile else
                  "default" if context.profile == default_profile(graph.facts.symbols)
                  else "where the original runs")
        shapes = {"symbols": {n: str(r) for n, r in graph.facts.symbols.items()},
                  "profile": [str(p) for p in context.profile],
                  "default_profile": source == "default", "profile_source": source,
                  "verified_at": list(verified.verified_at)}
    notes = found.cost_model.notes() + list(context.log.notes)
    trace = chosen.trace if chosen else ()
    peer_steps = [s.rule for s in trace if s.kind is StepKind.PEER]
    if peer_steps and len(trace) == 1:
        notes.append(f"the model kept is what {peer_steps[0]} made of the original: it "
                     "measured fastest of graphsub's candidates and the other optimizers' "
                     "outputs")
    elif peer_steps:
        notes.append(f"the model kept is built on what {peer_steps[0]} made of the "
                     f"original, rewritten further by graphsub ({len(trace) - 1} "
                     "steps): it measured fastest of graphsub's candidates and the other "
                     "optimizers' outputs")
    if not settings.objective.latency_only:
        notes.append(f"the search minimized {settings.objective.describe()} (each term "
                     "relative to the original model); predicted figures are latencies, "
                     "and a candidate is kept only where it also measures faster")
    op_times, rewrites = _evidence(context, exported, selection, notes) if settings.evidence \
        else ({}, {})
    rep = OptimizeReport(
        model=context.label, settings={**settings.as_dict(), "threads": context.threads,
                                       "rules": len(context.rules)},
        target=context.target.name, device=context.target.device().as_dict(),
        predicted_ms_before=ms(latency(graph)),
        predicted_ms_after=ms(latency(chosen.graph if chosen is not None else graph)),
        latency_before_ms=selection.before_ms, latency_after_ms=selection.after_ms,
        speedup=(selection.confirm.speedup if chosen is not None and selection.confirm
                 else (1.0 if selection.before_ms else None)),
        confirmation=selection.confirmation(),
        kept_original=chosen is None,
        trace=[] if chosen is None else [asdict(s) for s in chosen.trace],
        rules_used=dict(Counter(s.rule for s in chosen.trace).most_common()) if chosen else {},
        search={**result.stats.as_dict(),
                "progress": [(s, ms(cost)) for s, cost in found.progress_points]},
        candidates=list(selection.candidates),
        verification=comparison.as_dict() if comparison is not None and failure is None else
        {"equivalent": True, "note": "the original model is written unchanged",
         **({"failed_candidate": {**comparison.as_dict(),
                                  "rules": getattr(failure, "trace", [])}}
            if comparison else {})},
        nodes_before=operator_count(graph),
        nodes_after=operator_count(chosen.graph if chosen is not None else graph),
        outcome=selection.outcome, notes=notes,
        fission=_fission_report(found, chosen), timings=dict(selection.timings),
        op_times=op_times, rewrites=rewrites, shapes=shapes,
        bodies=[b.as_dict() for b in found.bodies], versions=versions())
    # the verdict reads the figures above, in the report's own terms
    return replace(rep, verdict=verdict(rep, selection, found.interrupted))


def _fission_report(found: Found, chosen: Candidate | None) -> dict[str, Any]:
    if found.fission is None:
        return {}
    kept = chosen is not None and any(s.kind == StepKind.FISSION for s in chosen.trace)
    return {**found.fission.as_dict(), "kept": kept}


@overload
def ms(seconds: float) -> float: ...
@overload
def ms(seconds: float | None) -> float | None: ...
def ms(seconds: float | None) -> float | None:
    """A predicted cost (seconds, the cost models' unit) in the report's unit."""
    return None if seconds is None else seconds * 1e3


def _featured(selection: Selection, exported: Sequence[Exported]) -> int | None:
    """The candidate a report shows in detail: the one kept, else the one confirmed head to
    head, else the fastest timed, else the best predicted."""
    if selection.chosen is not None:
        return selection.chosen
    if selection.confirmed is not None:
        return selection.confirmed
    timed = [(c.measured_ms, i) for i, c in enumerate(selection.candidates)
             if c.measured_ms is not None]
    return min(timed)[1] if timed else (0 if exported else None)


def _evidence(context: RunContext, exported: Sequence[Exported], selection: Selection,
              notes: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """What the HTML report draws: time per operator type, the featured candidate's
    rewrites. A failure here loses a figure, with a note, never the run."""
    index = _featured(selection, exported)
    time_model = context.time_model
    unit = "measured" if time_model.name == "measured" else "analytic"
    times: dict[str, Any] = {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            times = {"unit": unit, "candidate": None, "candidate_index": index,
                     "original": _in_ms(op_times(context.graph, time_model))}
            if index is None:
                return times, {}
            candidate = exported[index].candidate
            times["candidate"] = _in_ms(op_times(candidate.graph, time_model))
            return times, rewrite_evidence(context.graph, candidate, context.rules, index)
    except Exception as exc:  # noqa: BLE001 (the report's figures never end a run)
        notes.append(f"the report's rewrite and operator-time figures could not be "
                     f"made ({type(exc).__name__}: {exc})")
        return times, {}


def _in_ms(times: dict[str, float]) -> dict[str, float]:
    return {op: seconds * 1e3 for op, seconds in times.items()}


REPORT = Stage("report", report)

__all__ = ["REPORT"]
