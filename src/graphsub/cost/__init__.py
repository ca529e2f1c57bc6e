"""Cost models: one protocol (`CostModel`), memoized by operator signature.

- `MeasuredCostModel` (default): operators timed in onnxruntime on this machine, cached.
- `AnalyticCostModel`: a roofline for a named device profile (cpu, a100, v100).
- `MultiObjectiveCostModel`: MetaFlow's weighted time/FLOPs/memory/launches, memory cap.

Costs are predictions; graphsub measures the final candidates end to end before choosing.
"""

from graphsub.cost.analytic import PROFILES, AnalyticCostModel, DeviceProfile
from graphsub.cost.base import CostModel, OpSignature, node_signature
from graphsub.cost.measured import MeasuredCostModel
from graphsub.cost.multi import MultiObjectiveCostModel, Weights
from graphsub.errors import GraphsubError


def make_cost_model(name: str, threads: int | None = None, device: str = "cpu") -> CostModel:
    """A cost model by name: measured or analytic."""
    if name == "measured":
        return MeasuredCostModel(threads)
    if name == "analytic":
        return AnalyticCostModel(device)
    raise GraphsubError(f"unknown cost model {name!r}; use measured or analytic")


__all__ = ["PROFILES", "AnalyticCostModel", "CostModel", "DeviceProfile", "MeasuredCostModel",
           "MultiObjectiveCostModel", "OpSignature", "Weights", "make_cost_model",
           "node_signature"]
