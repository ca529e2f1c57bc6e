"""What `graphsub optimize` reports: the report written to --report, one entry per candidate,
and the verdict, the outcome in words a user can act on."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

from graphsub.report.files import json_ready, save_report, upgrade
from graphsub.report.words import predicted, stopped
from graphsub.verdicts.speedup import MIN_GAIN, describe, describe_contention


class MeasuringOutcome(Protocol):
    """What the verdict reads of how measuring ended (graphsub.selection's `Selection` is
    one): the outcome's name, the best screening ratio, one run of the original."""

    @property
    def outcome(self) -> str: ...

    @property
    def screen_ratio(self) -> float | None: ...

    @property
    def original_run_s(self) -> float: ...


@dataclass(frozen=True)
class CandidateReport:
    #: Its predicted cost, ms.
    predicted_ms: float
    measured_ms: float | None
    rules: list[str]
    note: str = ""
    #: Its outputs against the original's on its first timed run: name, max_abs, max_rel,
    #: used (the worst element's share of the tolerance), ok.
    check: list[dict[str, Any]] = field(default_factory=list)
    #: Its speedup over the original in the screening, decided like a confirmation (one
    #: look): verdicts.speedup.HeadToHead.as_dict(), the median round's speedup, its interval.
    screening: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class OptimizeReport:
    """Everything `graphsub optimize` found out, as written to --report. Every duration is
    in milliseconds (its key ends in _ms, or its field says so), but `seconds`, the wall time
    each stage of the run took."""

    model: str
    settings: dict[str, Any]
    target: str
    device: dict[str, Any]
    #: Predicted costs (ms) of the original and of what is written.
    predicted_ms_before: float
    predicted_ms_after: float
    latency_before_ms: float | None
    latency_after_ms: float | None
    speedup: float | None
    kept_original: bool
    trace: list[dict[str, Any]]
    rules_used: dict[str, int]
    search: dict[str, Any]
    candidates: list[CandidateReport] = field(default_factory=list)
    verification: dict[str, Any] = field(default_factory=dict)
    #: The head-to-head that explains the outcome: HeadToHead.as_dict(), candidate, min_gain.
    confirmation: dict[str, Any] = field(default_factory=dict)
    #: Operators run at inference (report.summary.operator_count), before and after.
    nodes_before: int = 0
    nodes_after: int = 0
    #: What measuring decided (verdicts.speedup's decisions, graphsub.selection):
    #: faster: a candidate's head-to-head interval cleared MIN_GAIN, and it is written;
    #: no-cheaper-graph: the search found nothing predicted cheaper;
    #: not-faster: no candidate's screening interval reached MIN_GAIN;
    #: not-confirmed: the head-to-head decided the fastest (and the runner-up) not MIN_GAIN faster;
    #: undecided: its interval still straddled MIN_GAIN when the measuring time ran out;
    #: contended: the same on a busy machine (load above its cores), too noisy to claim;
    #: no-time: too little time to measure; not-run: no candidate could run on the target;
    #: slower-at-shape: faster at the profile's main shape, decided slower at another;
    #: verification-failed: it computed something else (a bug); not-written: it could not be
    #: written as ONNX. All but faster keep the original.
    outcome: str = ""
    #: The outcome in one or two sentences, with its figures.
    verdict: str = ""
    #: Whatever degraded the result without ending the run (operators priced analytically,
    #: candidates dropped), one line each.
    notes: list[str] = field(default_factory=list)
    #: Seconds spent: search, measure (timing and confirming), verify, total; and the limits.
    seconds: dict[str, float | None] = field(default_factory=dict)
    #: What each long step did, in its own unit (graphsub.progress): load (nodes), fission
    #: (candidate kernels priced), timing (rounds), verify (bindings), write (MB): {step:
    #: {done, total, unit, seconds}}; the search's own count is in `search`.
    steps: dict[str, Any] = field(default_factory=dict)
    #: Operator fission and kernel orchestration (graphsub.fission.stage): what was split,
    #: the candidate kernels, the kernels chosen and what each replaced, and whether the
    #: orchestrated graph was the one kept; empty with --no-fission.
    fission: dict[str, Any] = field(default_factory=dict)
    #: Round medians in ms: "screen" (the original and each timed candidate, by label) and
    #: "confirms" (each head-to-head attempt: candidate, before_ms, after_ms, and its
    #: HeadToHead.as_dict(): speedup, interval, decision, contention).
    timings: dict[str, Any] = field(default_factory=dict)
    #: Predicted time per operator type, ms, of the original and of the candidate the report
    #: features (the one kept, else the one confirmed or timed fastest, else the best
    #: predicted): unit, original, candidate, candidate_index.
    op_times: dict[str, Any] = field(default_factory=dict)
    #: The featured candidate's rewrites as drawable subgraphs (graphsub.report.evidence).
    rewrites: dict[str, Any] = field(default_factory=dict)
    #: A model with symbolic sizes: its size symbols and their ranges, the profile its costs
    #: were measured at (and whether it is the default one), the bindings the written model
    #: was verified at.
    shapes: dict[str, Any] = field(default_factory=dict)
    #: Each control-flow body searched on its own: where, operators, predicted costs before
    #: and after, whether its rewrite was kept and why not (graphsub.pipeline.bodies).
    bodies: list[dict[str, Any]] = field(default_factory=list)
    #: The command line that made the report, and the versions of what ran it.
    command: list[str] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OptimizeReport:
        """A report read back from its JSON (keys this version does not know are ignored)."""
        data = upgrade(data)
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        cand_fields = {f.name for f in fields(CandidateReport)}
        values["candidates"] = [CandidateReport(**{k: v for k, v in c.items() if k in cand_fields})
                                for c in data.get("candidates", [])]
        return cls(**values)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the report atomically as `graphsub optimize --report` does: a .json file
        (the data, read back by `from_dict` and `graphsub report`) or a .html page with its
        plots, by the suffix."""
        save_report(self.as_dict(), Path(path))
        return Path(path)

    def to_html(self) -> str:
        """The report as one self-contained HTML page (plots inline as SVG)."""
        from graphsub.report.html import optimize_html

        return optimize_html(json_ready(self.as_dict()))

    def _repr_html_(self) -> str:  # Jupyter shows the page inline
        return self.to_html()


def versions() -> dict[str, str]:
    """The versions of what ran graphsub, for reports."""
    import platform
    import sys
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("graphsub", "python", "onnx", "onnxruntime", "numpy", "torch"):
        if name == "torch" and "torch" not in sys.modules:
            continue  # torch is optional: named when this run used it
        try:
            out[name] = platform.python_version() if name == "python" else version(name)
        except PackageNotFoundError:  # graphsub run from a source tree, not installed
            pass
    return out


def verdict(report: OptimizeReport, selection: MeasuringOutcome, interrupted: bool = False
            ) -> str:
    """What happened, in words a user can act on, with the figures behind it: every ratio
    with its interval."""
    search = report.search
    before = report.predicted_ms_before
    cands = [c for c in report.candidates if c.measured_ms is not None] or report.candidates
    cheapest = predicted(min((c.predicted_ms for c in cands), default=before), before)
    target = report.target
    prefix = f"The search was interrupted after {search['seconds']:.1f} s. " if interrupted else ""
    outcome = selection.outcome
    c = report.confirmation
    if outcome in ("faster", "not-confirmed", "undecided", "contended"):
        return prefix + _confirmed(outcome, c, report, target)
    if outcome == "no-cheaper-graph":
        return (prefix + "The search found no graph predicted cheaper than the original "
                f"({search['explored']} expanded, {stopped(search['stopped_by'])}); the "
                "original model is kept.")
    if outcome == "not-faster":
        screened = [cand.screening for cand in report.candidates if cand.screening]
        fastest = (describe(max(screened, key=lambda s: s["speedup"])) if screened
                   else f"{selection.screen_ratio:.3f}x" if selection.screen_ratio is not None
                   else "none was timed")
        return (prefix + f"The search found {len(report.candidates)} candidate(s), the "
                f"cheapest {cheapest}, but none ran {MIN_GAIN:.0%} faster than the original "
                f"on {target} (the fastest: {fastest}); the original model is kept.")
    if outcome == "slower-at-shape":
        slower = [t for t in report.timings.get("profile", []) if t.get("slower")]
        where = f" at {slower[0]['shape']} ({describe(slower[0])})" if slower else ""
        return (prefix + f"The fastest candidate ran faster than the original on {target} at "
                f"the profile's main shape but slower{where}; the original model is kept.")
    if outcome == "verification-failed":
        return (prefix + "The candidate chosen did not compute what the original computes, a "
                "bug of graphsub's (see the notes: please report it); the original model is "
                "kept.")
    if outcome == "not-written":
        return (prefix + "The fastest candidate could not be written as ONNX (see the notes); "
                "the original model is kept.")
    if outcome == "no-time":
        run_ms = selection.original_run_s * 1e3
        return (prefix + f"The candidates (the cheapest {cheapest}) could not be measured and "
                f"confirmed on {target} within the time limit (one run of the model takes "
                f"{run_ms:.0f} ms); the original model is kept. Give --measure-limit SECONDS "
                "for more measuring time.")
    return (prefix + f"No candidate could run on {target} (see the notes); the original model "
            "is kept.")


def _confirmed(outcome: str, c: Mapping[str, Any], report: OptimizeReport, target: str) -> str:
    """The verdict of a head-to-head confirmation (`c`: the report's confirmation)."""
    measured = describe(c)
    if outcome == "faster":
        busy = (f" The machine was busy ({describe_contention(c)}); the interval allows for "
                "its noise." if c["busy"] else "")
        return (f"The optimized model runs {measured} as fast as the original on {target} in "
                f"the median head-to-head round, faster in {c['wins']:.0%} of the rounds, and "
                f"matches it on random inputs.{busy}")
    index = c.get("candidate")
    cost = (report.candidates[index].predicted_ms if index is not None
            else report.predicted_ms_after)
    who = f"The fastest candidate ({predicted(cost, report.predicted_ms_before)})"
    gain = f"the {c['required']:.3f}x that {c['min_gain']:.0%} less latency needs"
    if outcome == "not-confirmed":
        return (f"{who} measured {measured} against the original on {target} head to head: "
                f"the whole interval lies below {gain}, so the original model is kept.")
    if outcome == "undecided":
        return (f"{who} measured {measured} against the original on {target} head to head: "
                f"the interval straddles {gain}, and the measuring time ran out before more "
                "rounds could decide, so the original model is kept. Give --measure-limit "
                "SECONDS for more rounds.")
    return (f"The machine was busy ({describe_contention(c)}), too busy to tell whether the "
            f"fastest candidate is faster: it measured {measured} against the original on "
            f"{target}, an interval that straddles {gain}; the original model is kept. Run "
            "graphsub again on a quiet machine.")
