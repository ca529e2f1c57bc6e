"""Analytic cost: a roofline per operator plus a fixed launch overhead, for named devices.

time = max(FLOPs / peak FLOP/s, bytes moved / memory bandwidth) + launch overhead. It needs no
measurement and is what to use when optimizing for a device other than this machine. It prices
kernels: a view the target runs without one costs nothing (`costs_nothing` with the target's
`free_views`), and an alias it runs as a kernel moves no data, so it costs the launch alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphsub.cost.base import CostModel, OpSignature, costs_nothing
from graphsub.errors import GraphsubError
from graphsub.ops import get_op
from graphsub.ops.base import VIEW_KINDS


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    peak_flops: float       # FLOP/s, float32
    bandwidth: float        # bytes/s
    launch_overhead: float  # seconds per operator
    description: str = ""


PROFILES = {
    # Two AVX2 cores at about 2.5 GHz: 2 x 8-wide FMA x 2 units = 32 FLOP/cycle per core.
    "cpu": DeviceProfile("cpu", 2 * 32 * 2.5e9, 15e9, 4e-6, "a 2-core AVX2 server CPU"),
    "a100": DeviceProfile("a100", 19.5e12, 1.555e12, 5e-6, "NVIDIA A100 40 GB, FP32, HBM2"),
    "v100": DeviceProfile("v100", 15.7e12, 0.9e12, 5e-6, "NVIDIA V100 SXM2, FP32, HBM2"),
    "h100": DeviceProfile("h100", 67e12, 3.35e12, 3e-6, "NVIDIA H100 SXM5 80 GB, FP32, HBM3"),
}


class AnalyticCostModel(CostModel):
    name = "analytic"
    parallel_safe = True

    def __init__(self, profile: str | DeviceProfile = "cpu",
                 free_views: frozenset[str] = frozenset()) -> None:
        """`free_views` are the kinds of view the target runs without a kernel
        (`Target.free_views`: "alias" and "strided" on torch), which cost nothing here."""
        super().__init__()
        unknown = sorted(set(free_views) - set(VIEW_KINDS))
        if unknown:
            raise GraphsubError(f"free_views takes kinds of view ({', '.join(VIEW_KINDS)}), not "
                                f"{', '.join(unknown)}: name the kinds the target runs without "
                                "a kernel")
        self.free_views = frozenset(free_views)
        if isinstance(profile, str):
            if profile not in PROFILES:
                raise GraphsubError(f"unknown device profile {profile!r}; known: {', '.join(PROFILES)}")
            profile = PROFILES[profile]
        self.profile = profile

    def known_cost(self, sig: OpSignature) -> float | None:
        return self.signature_cost(sig)  # computed, never measured

    def op_cost(self, sig: OpSignature) -> float:
        p = self.profile
        if costs_nothing(sig.op, False, self.free_views):
            return 0.0
        opdef = get_op(sig.op)
        if opdef.view == "alias":
            return p.launch_overhead
        flops = opdef.flops(sig.attrs, sig.inputs, sig.outputs)
        moved = opdef.bytes(sig.attrs, sig.inputs, sig.outputs)
        return max(flops / p.peak_flops, moved / p.bandwidth) + p.launch_overhead
