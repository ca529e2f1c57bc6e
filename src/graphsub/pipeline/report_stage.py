"""The last stage of `optimize_model`: everything the run found out, as an OptimizeReport."""

from __future__ import annotations

import math
import warnings
from collections import Counter
from dataclasses import asdict
from typing import Any

from graphsub.budget import StageClock
from graphsub.ir.graph import Graph
from graphsub.pipeline.run import Run, Stage
from graphsub.report.evidence import op_times, rewrite_evidence
from graphsub.report.optimize import OptimizeReport, verdict, versions
from graphsub.report.summary import operator_count
from graphsub.runtime.bindings import default_profile
from graphsub.search.result import StepKind
from graphsub.selection import Selection


def report(run: Run, clock: StageClock) -> None:
    """The report (run.product): the outcome and its figures, the search's statistics and
    progress, the candidates, the verification, and (with `settings.evidence`) what the HTML
    page draws. The seconds per stage are filled in by whoever ends the run."""
    result, selection, chosen = run.result, run.selection, run.chosen
    assert result is not None and selection is not None

    def latency(graph: Graph) -> float:
        """Predicted latency (NaN when Ctrl-C came before the input graph was priced)."""
        return math.nan if math.isnan(result.initial_cost) else run.time_model.graph_cost(graph)

    rep = OptimizeReport(
        model=run.label, settings={**run.settings.as_dict(), "threads": run.threads,
                                   "rules": len(run.rules)},
        target=run.target.name, device=run.target.device().as_dict(),
        predicted_ms_before=ms(latency(run.graph)),
        predicted_ms_after=ms(latency(chosen.graph if chosen is not None else run.graph)),
        latency_before_ms=selection.before_ms, latency_after_ms=selection.after_ms,
        speedup=(selection.confirm.speedup if chosen is not None and selection.confirm
                 else (1.0 if selection.before_ms else None)),
        confirmation=selection.confirmation(),
        kept_original=chosen is None,
        trace=[] if chosen is None else [asdict(s) for s in chosen.trace],
        rules_used=dict(Counter(s.rule for s in chosen.trace).most_common()) if chosen else {},
        search=result.stats.as_dict(), candidates=selection.candidates,
        verification=run.comparison.as_dict() if run.comparison is not None
        and run.verification_failure is None else
        {"equivalent": True, "note": "the original model is written unchanged",
         **({"failed_candidate": {**run.comparison.as_dict(),
                                  "rules": getattr(run.verification_failure, "trace", [])}}
            if run.comparison else {})},
        nodes_before=operator_count(run.graph),
        nodes_after=operator_count(chosen.graph if chosen is not None else run.graph),
        outcome=selection.outcome, notes=run.cost_model.notes() + run.notes,
        fission=_fission_report(run), timings=selection.timings, versions=versions())
    rep.search["progress"] = [(s, ms(cost)) for s, cost in run.progress_points]
    rep.bodies = [b.as_dict() for b in run.bodies]
    if run.profile:
        source = ("given" if run.settings.shape_profile else
                  "default" if run.profile == default_profile(run.graph.meta["symbols"])
                  else "where the original runs")
        rep.shapes = {"symbols": {n: str(r) for n, r in run.graph.meta["symbols"].items()},
                      "profile": [str(p) for p in run.profile],
                      "default_profile": source == "default", "profile_source": source,
                      "verified_at": run.verified_at}
    peer_steps = [s.rule for s in chosen.trace if s.kind is StepKind.PEER] if chosen else []
    if peer_steps and len(chosen.trace) == 1:
        rep.notes.append(f"the model kept is what {peer_steps[0]} made of the original: it "
                         "measured fastest of graphsub's candidates and the other optimizers' "
                         "outputs")
    elif peer_steps:
        rep.notes.append(f"the model kept is built on what {peer_steps[0]} made of the "
                         f"original, rewritten further by graphsub ({len(chosen.trace) - 1} "
                         "steps): it measured fastest of graphsub's candidates and the other "
                         "optimizers' outputs")
    if not run.settings.objective.latency_only:
        rep.notes.append(f"the search minimized {run.settings.objective.describe()} (each term "
                         "relative to the original model); predicted figures are latencies, "
                         "and a candidate is kept only where it also measures faster")
    if run.settings.evidence:
        _evidence(rep, run)
    rep.verdict = verdict(rep, selection, run.interrupted)
    run.product = rep


def _fission_report(run: Run) -> dict[str, Any]:
    if run.fission is None:
        return {}
    kept = run.chosen is not None and any(s.kind == StepKind.FISSION for s in run.chosen.trace)
    return {**run.fission.as_dict(), "kept": kept}


def ms(seconds: float | None) -> float | None:
    """A predicted cost (seconds, the cost models' unit) in the report's unit."""
    return None if seconds is None else seconds * 1e3


def _featured(run: Run, selection: Selection) -> int | None:
    """The candidate a report shows in detail: the one kept, else the one confirmed head to
    head, else the fastest timed, else the best predicted."""
    if selection.chosen is not None:
        return selection.chosen
    if selection.confirmed is not None:
        return selection.confirmed
    timed = [(c.measured_ms, i) for i, c in enumerate(selection.candidates)
             if c.measured_ms is not None]
    return min(timed)[1] if timed else (0 if run.exported else None)


def _evidence(rep: OptimizeReport, run: Run) -> None:
    """What the HTML report draws: time per operator type, the featured candidate's
    rewrites. A failure here loses a figure, with a note, never the run."""
    assert run.selection is not None
    index = _featured(run, run.selection)
    unit = "measured" if run.time_model.name == "measured" else "analytic"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            rep.op_times = {"unit": unit, "candidate": None, "candidate_index": index,
                            "original": _in_ms(op_times(run.graph, run.time_model))}
            if index is not None:
                candidate = run.exported[index][0]
                rep.op_times["candidate"] = _in_ms(op_times(candidate.graph, run.time_model))
                rep.rewrites = rewrite_evidence(run.graph, candidate, run.rules, index)
    except Exception as exc:  # noqa: BLE001 (the report's figures never end a run)
        rep.notes.append(f"the report's rewrite and operator-time figures could not be "
                         f"made ({type(exc).__name__}: {exc})")


def _in_ms(times: dict[str, float]) -> dict[str, float]:
    return {op: seconds * 1e3 for op, seconds in times.items()}


REPORT = Stage("report", report)

__all__ = ["REPORT"]
