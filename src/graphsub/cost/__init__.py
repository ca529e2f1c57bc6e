"""Cost models: one protocol (`CostModel`), memoized by operator signature.

- `MeasuredCostModel` (default): operators timed on the execution target, cached per device.
- `AnalyticCostModel`: a roofline for a named device profile (cpu, a100, v100, h100).
- `CompiledCostModel`: a graph priced as a fusing compiler (inductor) runs it: library kernels
  as they are, the rest as the fused kernels the compiler builds, each compiled and timed.
- `MultiObjectiveCostModel`: MetaFlow's weighted time/FLOPs/memory/launches, memory cap.

Costs are predictions; graphsub measures the final candidates end to end before choosing.
"""

from __future__ import annotations

from graphsub.cost.analytic import PROFILES, AnalyticCostModel, DeviceProfile
from graphsub.cost.base import CostModel, OpSignature, TimingTarget, node_signature
from graphsub.cost.compiled import CompiledCostModel
from graphsub.cost.measured import MeasuredCostModel
from graphsub.cost.multi import MultiObjectiveCostModel, Weights
from graphsub.errors import GraphsubError


def make_cost_model(name: str, target: TimingTarget | None = None,
                    device: str | None = None) -> CostModel:
    """A cost model by name: `measured` (timed on the target), `analytic` (a roofline for
    the profile named by `device`, by default the one that approximates the target, with the
    views the target runs without a kernel free), or `compiled` (the graph as inductor
    compiles it, its kernels timed on a torch target)."""
    if name == "measured":
        if target is None:
            raise GraphsubError("the measured cost model times operators on a target: give one "
                                "(graphsub.targets.get_target('ort-cpu'))")
        return MeasuredCostModel(target)
    if name == "analytic":
        if target is None:
            return AnalyticCostModel(device or "cpu")
        return AnalyticCostModel(device or target.analytic_profile, target.free_views)
    if name == "compiled":
        if target is None or "strided" not in target.free_views:
            raise GraphsubError("the compiled cost model times the kernels inductor builds: give "
                                "a torch target (torch-cpu or torch-cuda), or use --cost measured")
        return CompiledCostModel(MeasuredCostModel(target), target.free_views,
                                 AnalyticCostModel(target.analytic_profile, target.free_views),
                                 strides=target.strides_of)
    raise GraphsubError(f"unknown cost model {name!r}; use measured, analytic or compiled")


__all__ = ["PROFILES", "AnalyticCostModel", "CompiledCostModel", "CostModel", "DeviceProfile",
           "MeasuredCostModel", "MultiObjectiveCostModel", "OpSignature", "Weights",
           "make_cost_model", "node_signature"]
