"""How a report's figures read in a sentence, the same in the verdict, the command line's
table and the HTML page."""

from __future__ import annotations

import math

from graphsub.search.result import StopReason

#: How each of a search's stop reasons reads in a sentence.
STOPPED: dict[str, str] = {StopReason.EXHAUSTED: "stopped when nothing was left to explore",
                             StopReason.SATURATED: "stopped when the e-graph stopped growing",
                             StopReason.BUDGET: "stopped when its budget was spent",
                             StopReason.NODE_LIMIT: "stopped at the e-graph's node limit",
                             StopReason.ITERATIONS: "stopped after its iterations",
                             StopReason.TIME: "stopped at the time limit",
                             StopReason.INTERRUPT: "stopped when interrupted"}


def stopped(reason: str) -> str:
    """A stop reason (its word, as reports carry it) as the end of a sentence."""
    return STOPPED.get(reason, f"stopped ({reason})")


def predicted(cost: float, before: float) -> str:
    """A candidate's predicted cost against the original's, in words: 'predicted 10.0%
    cheaper', 'predicted 3.4% dearer' (a candidate need not be predicted cheaper: graphsub's
    re-export of the original, onnxruntime's fusions), 'predicted to cost the same'."""
    if not before or not (math.isfinite(cost) and math.isfinite(before)):
        return "not priced"
    gain = 1 - cost / before
    if f"{abs(gain):.1%}" == "0.0%":
        return "predicted to cost the same"
    return f"predicted {abs(gain):.1%} {'cheaper' if gain > 0 else 'dearer'}"
