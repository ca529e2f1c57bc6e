"""onnxruntime targets: its CPU provider (`ort-cpu`) and its CUDA provider (`ort-cuda`).

Models run as users run them: the ONNX bytes graphsub writes, in a session with all of
onnxruntime's graph optimizations and its default settings. One operator is priced as a
one-node model in the same kind of session (constant inputs as initializers, so onnxruntime
may pre-pack them as it will in the real model), minus the time of an empty run, plus the
calibrated cost of scheduling one more operator inside a model.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping
from typing import Any

import numpy as np

from graphsub.targets import declared_capabilities
from graphsub.targets.base import DeviceInfo, Target, cold_replicas, signature_graph
from graphsub.targets.capabilities import TargetUnavailableError
from graphsub.cost.base import OpSignature
from graphsub.ir.builder import GraphBuilder
from graphsub.ir.graph import Graph
from graphsub.verdicts.equivalence import Tolerance, compare_outputs
from graphsub.runtime.ort_sessions import ORT_ERRORS, ModelData, OrtRunnable, make_session, quiet_run, run
from graphsub.runtime.timing import median_call_time, timed_calls

#: Shape of the tensor used to calibrate the per-operator overhead: large enough that
#: onnxruntime runs the operator on its thread pool, as it does the model's real operators.
CALIBRATION_SHAPE = (1, 64, 56, 56)
CUDA_PROVIDER = "CUDAExecutionProvider"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def time_session(sess: Any, feeds: Mapping[str, np.ndarray], min_runs: int = 5,
                 min_seconds: float = 0.02, max_runs: int = 200, device: str = "cpu",
                 run_options: Any = None) -> float:
    """Median seconds of one run, after warm-up. Inputs are bound once and outputs stay in
    onnxruntime (IOBinding, on the provider's device), so the time is the operators' and not
    copies'."""
    import onnxruntime as ort

    binding = sess.io_binding()
    for name, arr in feeds.items():
        binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(arr, device, 0))
    for out in sess.get_outputs():
        binding.bind_output(out.name, device)
    return median_call_time(lambda: sess.run_with_iobinding(binding, run_options), 2, min_runs,
                            min_seconds, max_runs)


class OrtTarget(Target):
    """Shared by both providers; subclasses name the provider."""

    providers: tuple[str, ...] = ("CPUExecutionProvider",)
    io_device = "cpu"
    runnable: type[OrtRunnable] = OrtRunnable

    def __init__(self, threads: int | None = None) -> None:
        reason = self.unavailable_reason()
        if reason is not None:
            raise TargetUnavailableError(f"target {self.name} is not available: {reason}")
        self.threads = threads or os.cpu_count() or 1
        self._baseline: float | None = None
        self._dispatch: float | None = None

    def runs_as_one_kernel(self, graph: Graph, opset: int | None = None) -> bool:
        """Whether the graph is written as one ONNX operator at the model's opset (what
        onnxruntime then runs as one kernel): a fused operator the opset lacks (Gelu before
        20, LayerNormalization before 17) is written as its primitives."""
        from graphsub.onnx_io.exporter import to_onnx

        model = to_onnx(graph, opset, check=False)
        kernels: int = sum(n.op_type != "Constant" for n in model.graph.node)
        return kernels == 1

    def runtime_fault(self, original: ModelData, candidate: ModelData,
                      feeds: Mapping[str, np.ndarray], tolerance: Tolerance) -> str | None:
        """onnxruntime's graph optimizations have broken valid models: when the candidate
        computes what the original computes with them off (on the CPU provider, one thread),
        its difference with them on is onnxruntime's."""
        try:
            expected = run(original, feeds, threads=1, optimize=False)
            actual = run(candidate, feeds, threads=1, optimize=False)
        except ORT_ERRORS:  # it does not run without them either: not onnxruntime's doing
            return None
        diffs, problems = compare_outputs(expected, actual, tolerance)
        if problems or not all(d.ok for d in diffs):
            return None
        return ("onnxruntime computes it wrongly with its graph optimizations on and rightly "
                "with them off (an onnxruntime optimizer bug)")

    def _session(self, model: Any, quiet: bool = False) -> Any:
        return make_session(model, self.threads, providers=self.providers, quiet=quiet,
                            timed=True)

    def prepare(self, graph: Graph | None, onnx: ModelData | str | None = None,
                label: str = "", session: Any = None) -> OrtRunnable:
        if onnx is None:
            from graphsub.onnx_io.exporter import to_model_data

            assert graph is not None
            onnx = to_model_data(graph)
        return self.runnable(onnx, self.threads, self.providers, label, session=session)

    def baseline(self) -> float:
        """The time of running a model that does nothing (one Identity on a scalar)."""
        if self._baseline is None:
            from onnx import TensorProto, helper

            g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "empty",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
            m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
            m.ir_version = 8
            sess = self._session(m.SerializeToString())
            self._baseline = time_session(sess, {"x": np.zeros(1, np.float32)}, min_runs=20,
                                          min_seconds=0.05, device=self.io_device)
        return self._baseline

    def dispatch_overhead(self) -> float:
        """What one more operator costs inside a model beyond its one-node time: scheduling and
        waking the thread pool. Measured as the marginal time of a relu in a chain of relus,
        minus that relu's one-node time."""
        if self._dispatch is None:
            self._dispatch = self.cached("__dispatch__", self._calibrate_dispatch)
        return self._dispatch

    def _calibrate_dispatch(self) -> float:
        from graphsub.onnx_io.exporter import to_onnx_bytes

        def chain(n: int) -> float:
            b = GraphBuilder()
            x = b.input("x", CALIBRATION_SHAPE)
            y = x
            for _ in range(n):
                y = b.relu(y)
            b.output(y, "y")
            sess = self._session(to_onnx_bytes(b.build()))
            feeds = {"x": np.random.default_rng(0).standard_normal(CALIBRATION_SHAPE)
                     .astype(np.float32)}
            return time_session(sess, feeds, min_runs=20, min_seconds=0.2,
                                device=self.io_device)

        marginal = (chain(24) - chain(8)) / 16
        single = max(chain(1) - self.baseline(), 0.0)
        return max(marginal - single, 0.0)

    def _time_replicas(self, sig: OpSignature, replicas: int) -> float:
        from graphsub.onnx_io.exporter import to_onnx

        graph, feeds = signature_graph(sig, replicas)
        # quiet: an operator that cannot run on made-up inputs (an Expand to a shape its
        # data input does not fit) is priced otherwise, with a warning of graphsub's own
        sess = self._session(to_onnx(graph, check=False).SerializeToString(), quiet=True)
        return time_session(sess, feeds, device=self.io_device, run_options=quiet_run())

    def time_op(self, sig: OpSignature, cold_weights: bool = False) -> float:
        if cold_weights:
            # The marginal time of one more replica, each with weights of its own: once the
            # replicas' weights exceed the caches, each replica reads its weights from memory.
            r = cold_replicas(sig, self.cache_bytes())
            return max((self._time_replicas(sig, r) - self._time_replicas(sig, 1)) / (r - 1), 0.0)
        seconds = self._time_replicas(sig, 1) - self.baseline()
        return max(seconds, 0.0) + self.dispatch_overhead()

    def calibration(self) -> dict[str, float]:
        return {"empty_run_s": self.baseline(), "per_op_overhead_s": self.dispatch_overhead()}


class OrtCudaRunnable(OrtRunnable):
    """Inputs and outputs stay on the GPU while timing (IOBinding), so a timed run is the
    model's kernels and not host copies; `run` still takes and returns numpy arrays."""

    def bind(self, feeds: Mapping[str, np.ndarray]) -> None:
        import onnxruntime as ort

        self._binding = self.session.io_binding()
        for name, arr in feeds.items():
            self._binding.bind_ortvalue_input(
                name, ort.OrtValue.ortvalue_from_numpy(np.asarray(arr), "cuda", 0))
        for out in self.session.get_outputs():
            self._binding.bind_output(out.name, "cuda")

    def timed(self, n: int) -> list[float]:  # run_with_iobinding synchronizes the provider
        return timed_calls(lambda: self.session.run_with_iobinding(self._binding), n)

    def close(self) -> None:
        self._binding = None
        super().close()


class OrtCpuTarget(OrtTarget):
    name = "ort-cpu"
    description = "onnxruntime, CPU provider, all graph optimizations (the ONNX file as written)"
    capabilities = declared_capabilities("ort-cpu")

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return None  # onnxruntime is a dependency of graphsub

    def device(self) -> DeviceInfo:
        import onnxruntime as ort

        return DeviceInfo(self.name, cpu_model(),
                          {"onnxruntime": ort.__version__, "threads": str(self.threads),
                           "optimization": "all"})


class OrtCudaTarget(OrtTarget):
    name = "ort-cuda"
    capabilities = declared_capabilities("ort-cuda")
    description = "onnxruntime, CUDA provider (needs onnxruntime-gpu and an NVIDIA GPU)"
    providers = (CUDA_PROVIDER, "CPUExecutionProvider")
    io_device = "cuda"
    runnable = OrtCudaRunnable
    analytic_profile = "h100"

    @classmethod
    def unavailable_reason(cls) -> str | None:
        import onnxruntime as ort

        have = ort.get_available_providers()
        if CUDA_PROVIDER not in have:
            return (f"onnxruntime {ort.__version__} has no CUDA provider (it has "
                    f"{', '.join(have)}); install onnxruntime-gpu instead of onnxruntime "
                    "(pip uninstall onnxruntime && pip install onnxruntime-gpu) on a machine "
                    "with an NVIDIA GPU")
        return _cuda_session_problem()

    def device(self) -> DeviceInfo:
        import onnxruntime as ort

        details = {"onnxruntime": ort.__version__}
        details.update(nvidia_versions())
        return DeviceInfo(self.name, details.pop("gpu", "NVIDIA GPU"), details)


def _cuda_session_problem() -> str | None:
    """Start a one-node session on the CUDA provider; say why it fell back, if it did."""
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "probe",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    try:
        sess = make_session(m.SerializeToString(), 1, providers=(CUDA_PROVIDER,))
    except Exception as exc:  # onnxruntime raises its own exception types
        return f"the CUDA provider could not start: {exc}"
    if sess.get_providers()[0] != CUDA_PROVIDER:
        return "the CUDA provider is installed but found no usable GPU"
    return None


def nvidia_versions() -> dict[str, str]:
    """GPU name and driver from nvidia-smi (empty when it is not there)."""
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=10, check=True).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError):
        return {}
    if not out:
        return {}
    name, _, driver = out[0].partition(",")
    return {"gpu": name.strip(), "driver": driver.strip()}


__all__ = ["OrtCpuTarget", "OrtCudaTarget", "OrtTarget", "cpu_model", "time_session"]
