"""Cost models: one protocol (`CostModel`), memoized by operator signature.

- `MeasuredCostModel` (default): operators timed on the execution target, cached per device.
- `AnalyticCostModel`: a roofline for a named device profile (cpu, a100, v100, h100).
- `MultiObjectiveCostModel`: MetaFlow's weighted time/FLOPs/memory/launches, memory cap.

Costs are predictions; graphsub measures the final candidates end to end before choosing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from graphsub.cost.analytic import PROFILES, AnalyticCostModel, DeviceProfile
from graphsub.cost.base import CostModel, OpSignature, node_signature
from graphsub.cost.measured import MeasuredCostModel
from graphsub.cost.multi import MultiObjectiveCostModel, Weights
from graphsub.errors import GraphsubError

if TYPE_CHECKING:
    from graphsub.backends.base import Target


def make_cost_model(name: str, target: Target | None = None,
                    device: str | None = None) -> CostModel:
    """A cost model by name: `measured` (timed on the target) or `analytic` (a roofline for
    the profile named by `device`, by default the one that approximates the target, with the
    views the target runs without a kernel free)."""
    if name == "measured":
        if target is None:
            raise GraphsubError("the measured cost model times operators on a target: give one "
                                "(graphsub.backends.get_target('ort-cpu'))")
        return MeasuredCostModel(target)
    if name == "analytic":
        if target is None:
            return AnalyticCostModel(device or "cpu")
        return AnalyticCostModel(device or target.analytic_profile, target.free_views)
    raise GraphsubError(f"unknown cost model {name!r}; use measured or analytic")


__all__ = ["PROFILES", "AnalyticCostModel", "CostModel", "DeviceProfile", "MeasuredCostModel",
           "MultiObjectiveCostModel", "OpSignature", "Weights", "make_cost_model",
           "node_signature"]
