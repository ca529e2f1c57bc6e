"""What an execution target is: where a model will run, and so what graphsub measures.

A target supplies four things, and the optimizer's stages use only these: what it is
(`capabilities`: what it runs, whether vendor operators may be written for it, whether its
outputs must be verified on it), a way to run a Graph (`prepare` -> a `Runnable`), a way to
time one operator signature (`time_op`, which the measured cost model calls and caches), and a
description of its device (`device`), which keys the cost cache and names the device in
reports. Nothing outside a target reads its name to decide what to do.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from graphsub.targets.capabilities import Capabilities
from graphsub.cost.base import OpSignature, TimingTarget
from graphsub.ir.builder import GraphBuilder
from graphsub.ir.graph import Graph, Value
from graphsub.tensors.types import Constant, TensorType
from graphsub.verdicts.equivalence import Tolerance
from graphsub.runtime.ort_sessions import ModelData
from graphsub.runtime.timing import Runnable


@dataclass(frozen=True)
class DeviceInfo:
    """The device a target runs on, and every version that changes what a timing means."""

    target: str
    name: str
    details: dict[str, str] = field(default_factory=dict)

    def key(self) -> str:
        """A stable text that changes whenever cached operator timings stop applying."""
        extras = "|".join(f"{k}={v}" for k, v in sorted(self.details.items()))
        return f"{self.target}|{self.name}|{extras}"

    def describe(self) -> str:
        extras = ", ".join(f"{k} {v}" for k, v in self.details.items())
        return f"{self.name} ({extras})" if extras else self.name

    def as_dict(self) -> dict[str, Any]:
        return {"target": self.target, "name": self.name, **self.details}


class Target(TimingTarget, ABC):
    """An execution target. Subclasses are registered by name in `graphsub.targets`."""

    name: str = ""
    #: What the target runs, in a line (`graphsub info --targets`).
    description: str = ""
    capabilities: Capabilities
    #: The kinds of view (`OpDef.view`: "alias", "strided") this target runs without a
    #: kernel, handing the view itself to the operators that read it: what is free here
    #: (`cost.base.costs_nothing`). With "strided", operators read non-contiguous inputs, so an
    #: operator's price depends on its inputs' strides (`input_layouts`), which travel through
    #: views.
    free_views: frozenset[str] = frozenset()
    #: The analytic device profile that approximates this target.
    analytic_profile: str = "cpu"
    #: Whether a code generator compiles groups of primitives into one kernel here (the
    #: `fused` operator; inductor on the torch targets): kernel orchestration then has
    #: generated kernels among its candidates.
    generates_kernels: bool = False
    #: Where calibration figures persist (the measured cost model lends its cache).
    cache: Any = None

    def cached(self, key: str, compute: Callable[[], float]) -> float:
        """A calibration figure from the cache, measured (and stored) when absent."""
        value = self.cache.get(key) if self.cache is not None else None
        if value is None:
            value = compute()
            if self.cache is not None:
                self.cache.put(key, value)
        return value

    @classmethod
    @abstractmethod
    def unavailable_reason(cls) -> str | None:
        """None when the target can run here; otherwise why not and what to do."""

    def cannot_run(self, graph: Graph) -> str | None:
        """Why this target cannot run `graph` (None: it can). Asked where the user named no
        target, so that the machine's default is passed over for a model it cannot run
        (a GPU through torch, for an ONNX op graphsub does not model) rather than the run
        ending in an error."""
        return None

    @abstractmethod
    def device(self) -> DeviceInfo:
        """The device and the software versions its timings depend on."""

    @abstractmethod
    def prepare(self, graph: Graph | None, onnx: ModelData | str | None = None,
                label: str = "", session: Any = None) -> Runnable:
        """A runnable for a model given as a Graph, as ONNX, or both (a target uses the form
        it runs: onnxruntime the ONNX bytes, torch the Graph). `session`: an onnxruntime
        session of `onnx` built already (a run's session of its original, handed over only
        where the target runs the model exactly as it was built: pipeline.sessions), which
        a target that runs ONNX uses instead of building its own; the others ignore it."""

    @abstractmethod
    def time_op(self, sig: OpSignature, cold_weights: bool = False) -> float:
        """Seconds one application of the signature adds to a model run on this target; with
        `cold_weights`, its constant inputs come from memory rather than from the caches
        (a model whose weights exceed the caches reads each weight cold once per run)."""

    def cache_bytes(self) -> int:
        """The size of the device's last-level cache: the working set beyond which weights
        are read cold."""
        return last_level_cache_bytes()

    def input_layouts(self, graph: Graph, nid: int) -> tuple[tuple[int, ...] | None, ...] | None:
        """Strides of the node's inputs where they are not contiguous (views), or None when
        this target always hands operators contiguous tensors."""
        return None

    def strides_of(self, graph: Graph, value: Value) -> tuple[int, ...] | None:
        """The value's strides where it is not contiguous (a view), or None; contiguous on a
        target that runs no view without a kernel."""
        return None

    def calibration(self) -> dict[str, float]:
        """Calibrated per-operator overheads, in seconds, for reports."""
        return {}

    @abstractmethod
    def runs_as_one_kernel(self, graph: Graph, opset: int | None = None) -> bool:
        """Whether this target runs the operators of `graph` (a fused operator cut out with
        its inputs: a candidate library kernel) as one kernel call when a model of `opset` is
        written for it: what kernel orchestration may choose as a library kernel."""

    def runtime_fault(self, original: ModelData, candidate: ModelData,
                      feeds: Mapping[str, np.ndarray], tolerance: Tolerance) -> str | None:
        """Why a candidate that computed something else here is the runtime's fault rather
        than a wrong rewrite (then it is dropped, not reported as a verification failure), or
        None. A target whose runtime rewrites models itself (onnxruntime's graph
        optimizations) checks whether the difference goes away without them."""
        return None


def signature_graph(sig: OpSignature, replicas: int = 1,
                    seed: int = 0) -> tuple[Graph, dict[str, np.ndarray]]:
    """A graph applying the signature's operator `replicas` times to the same non-constant
    inputs, each replica with constant inputs of its own (weights with different data), and
    random inputs to feed it: what every target times to price one operator. Constant inputs
    whose values the signature holds (an opaque operator's shapes and indices) keep them; other
    constants are random. Replicas let a
    target price an operator whose weights come cold from memory, as a large model's weights
    do: the marginal time of one more replica, once the replicas' weights together exceed
    the caches."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder()

    def data(i: int, t: TensorType) -> np.ndarray:
        arr = (rng.standard_normal(t.shape).astype(t.dtype)
               if t.dtype.startswith(("float", "bfloat"))
               else np.zeros(t.shape, t.dtype))
        return np.abs(arr) + 1 if sig.op == "batch_norm" and i == 4 else arr  # a variance

    feeds: dict[str, np.ndarray] = {}
    shared: dict[int, Value] = {}
    for i, (t, const) in enumerate(zip(sig.inputs, sig.constant_inputs)):
        if not const:
            shared[i] = b.input(f"in{i}", t.shape, t.dtype)
            feeds[f"in{i}"] = data(i, t)
    # Targets time bound signatures, whose sizes values are constants.
    known = cast("tuple[Constant | None, ...]", sig.values or (None,) * len(sig.inputs))
    for r in range(replicas):
        args = [shared[i] if i in shared else
                b.weight(value.array if value is not None else data(i, t))
                for i, (t, value) in enumerate(zip(sig.inputs, known))]
        outs = b.op(sig.op, *args, **dict(sig.attrs))
        for k, v in enumerate((outs,) if isinstance(outs, Value) else outs):
            b.output(v, f"out{r}_{k}")
    return b.build(), feeds


def cold_replicas(sig: OpSignature, cache_bytes: int) -> int:
    """How many replicas of an operator make its weights together twice the cache size (at
    least 3, so that a marginal time exists; at most 64)."""
    weight_bytes = sum(t.nbytes for t, c in zip(sig.inputs, sig.constant_inputs) if c)
    if weight_bytes == 0:
        return 3
    return max(3, min(64, -(-2 * cache_bytes // weight_bytes)))


def last_level_cache_bytes() -> int:
    """The CPU's largest cache (sysfs), or 32 MiB when it cannot be read."""
    from pathlib import Path

    best = 0
    for size_file in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = size_file.read_text().strip().upper()
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        try:
            best = max(best, int(text.rstrip("KMG")) * scale)
        except ValueError:
            continue
    return best or 32 << 20
