"""The torch targets: graphsub's torch backend on the CPU (`torch-cpu`) and on a GPU
(`torch-cuda`, CUDA-graph replays by default).

Pricing one operator: a one-node program with the operator's inputs in the layouts they have
in the model (a transposed view stays a view), timed the way the target runs models. On the
CPU, the median of single calls minus the median of an empty call. On a GPU, the operator is
repeated k1 and k2 times inside a CUDA graph (or eagerly, without graphs), each replay timed
with CUDA events, and the cost is the marginal time per repetition: a replay's fixed overhead
cancels, and what remains is the operator's kernels plus the gap the GPU leaves between
kernels, the launch overhead that fewer, larger operators save. cuDNN's autotuner is on, and
TF32 is off unless asked for (it changes results).
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable, Mapping
from typing import Any

import torch

from graphsub.targets import declared_capabilities
from graphsub.targets.base import DeviceInfo, Target, cold_replicas, signature_graph
from graphsub.targets.capabilities import TargetUnavailableError
from graphsub.targets.torch import fusion
from graphsub.targets.torch.lowering import LowerContext, lower, torch_dtype
from graphsub.targets.torch.program import (SizedTorchProgram, TorchProgram, TorchRunnable,
                                             cuda_event, to_tensor)
from graphsub.targets.torch.symbolic_strides import is_static_value, symbolic_view_strides
from graphsub.cost.base import OpSignature, costs_nothing, runs_as_view
from graphsub.errors import GraphsubError, NoLoweringError
from graphsub.ir.binding import is_symbolic_graph
from graphsub.ir.builder import GraphBuilder
from graphsub.ir.graph import Graph, Node, Value
from graphsub.ops import get_op
from graphsub.runtime.ort_sessions import ModelData
from graphsub.runtime.timing import event_timed_calls, median_call_time

Strides = tuple[int, ...]
log = logging.getLogger("graphsub.torch")


class TorchTarget(Target):
    device_type = "cpu"
    #: Both kinds are lowered to torch views (a slice with a negative step and a reshape of
    #: strides no view can express copy: `_is_view` tells them apart where it matters).
    free_views = frozenset({"alias", "strided"})
    generates_kernels = True  # inductor
    capabilities = declared_capabilities("torch-cpu")
    #: cuDNN's fused convolution + bias + relu where the device has it (the GPU target
    #: probes for it), else None: programs then run two kernels.
    fused_conv_relu: Any = None

    def __init__(self, threads: int | None = None, cuda_graphs: bool = True,
                 allow_tf32: bool = False) -> None:
        reason = self.unavailable_reason()
        if reason is not None:
            raise TargetUnavailableError(f"target {self.name} is not available: {reason}")
        if threads:
            torch.set_num_threads(threads)
        self.threads = torch.get_num_threads()
        self.cuda_graphs = cuda_graphs and self.device_type == "cuda"
        self.allow_tf32 = allow_tf32
        self.torch_device = torch.device(self.device_type)
        self._strides: dict[tuple[Node, int, Strides | None], Strides | None] = {}
        self._meta = LowerContext(torch.device("meta"))
        self._empty: float | None = None
        self._configure()

    def _configure(self) -> None:
        """Settings the target's timings depend on (the GPU target's)."""

    # ---- running models ----------------------------------------------------------------
    def program(self, graph: Graph, reference: Mapping[str, int] | None = None
                ) -> TorchProgram | SizedTorchProgram:
        """graphsub's torch program of a graph, as this target runs it. Over size symbols,
        one program computes every size from its inputs' shapes (library kernels chosen at
        the `reference` sizes); where some operator's lowering cannot take a size
        expression, a SizedTorchProgram lowers the graph once per size instead."""
        if is_symbolic_graph(graph):
            try:
                return TorchProgram(graph, self.torch_device, self.fused_conv_relu,
                                    reference=reference)
            except GraphsubError:
                raise
            except Exception as exc:  # noqa: BLE001 - any lowering's failure: per-size programs
                log.info("a program over size symbols could not be built (%s: %s); "
                         "lowering per size", type(exc).__name__, exc)
                return SizedTorchProgram(graph, self.torch_device, self.fused_conv_relu)
        return TorchProgram(graph, self.torch_device, self.fused_conv_relu)

    def cannot_run(self, graph: Graph) -> str | None:
        """An operator with no torch lowering, or (off the CPU, where onnxruntime cannot
        run an op for the program) an ONNX op that graphsub does not model and torch does
        not compute natively: the first such, as the program would fail on it."""
        device = LowerContext(self.torch_device)
        folded = graph.weight_only()  # computed once, before the program runs
        for nid in graph.topo_order():
            node = graph[nid]
            opaque = next((t for t in node.outputs if t.is_opaque), None)
            if opaque is not None:
                what = node.attrs.get("name") or node.attrs.get("op_type") or node.op
                return (f"graphsub's torch backend has no tensor for {what}'s value of type "
                        f"{opaque} (a sequence, map, optional or strings)")
            if node.op == "input" or nid in folded:
                continue
            if node.op != "opaque" or self.device_type == "cpu":
                if get_op(node.op).torch is None:
                    return f"graphsub's torch backend cannot run operator {node.op!r}"
                continue
            try:
                lower(device, node.op, node.attrs, graph.input_types(nid), node.outputs)
            except NoLoweringError as exc:
                return str(exc).split(". Use --target", 1)[0]
        return None

    def prepare(self, graph: Graph | None, onnx: ModelData | str | None = None,
                label: str = "", session: Any = None) -> TorchRunnable:
        if graph is None:
            from graphsub.onnx_io import load

            assert onnx is not None
            graph = load(onnx)
        return TorchRunnable(self.program(graph), self.cuda_graphs, label)

    def runs_as_one_kernel(self, graph: Graph, opset: int | None = None) -> bool:
        """Every operator graphsub models is one call of graphsub's torch program."""
        return True

    # ---- layouts -------------------------------------------------------------------------
    def input_layouts(self, graph: Graph, nid: int) -> tuple[Strides | None, ...] | None:
        strides = tuple(self.strides_of(graph, v) for v in graph[nid].inputs)
        return strides if any(s is not None for s in strides) else None

    def strides_of(self, graph: Graph, value: Value) -> Strides | None:
        """The strides of a value as this backend produces it, None when contiguous. Only
        views make non-contiguous values; they are followed up to the tensor they view, and
        their strides computed by running the lowering on a meta tensor (no data)."""
        producer = graph[value.node]
        if not runs_as_view(producer.op, self.free_views) or value.node in graph.weight_only():
            return None
        source = producer.inputs[0]
        in_strides = self.strides_of(graph, source)
        key = (producer, value.index, in_strides)
        if key not in self._strides:
            t = graph.type_of(source)
            if t.is_static and is_static_value(producer.attrs):
                base = (torch.empty_strided(t.shape, in_strides, dtype=torch_dtype(t.dtype),
                                            device="meta") if in_strides is not None
                        else torch.empty(t.shape, dtype=torch_dtype(t.dtype), device="meta"))
                fn = lower(self._meta, producer.op, producer.attrs, (t,), producer.outputs)
                out = fn(base)[value.index]
                self._strides[key] = None if out.is_contiguous() else tuple(out.stride())
            else:
                self._strides[key] = symbolic_view_strides(self._meta, producer, value.index,
                                                           t, in_strides)
        return self._strides[key]

    # ---- pricing one operator ------------------------------------------------------------
    def _signature_program(self, sig: OpSignature, replicas: int = 1
                           ) -> tuple[TorchProgram | SizedTorchProgram, list[torch.Tensor]]:
        graph, feeds = signature_graph(sig, replicas)
        program = self.program(graph)
        layouts = sig.layouts or (None,) * len(sig.inputs)
        inputs = []
        for i, (const, strides) in enumerate(zip(sig.constant_inputs, layouts)):
            if const:
                continue
            t = to_tensor(feeds[f"in{i}"], self.torch_device)
            if strides is not None:
                t = _strided_like(t, strides)
            inputs.append(t)
        return program, inputs

    def time_op(self, sig: OpSignature, cold_weights: bool = False) -> float:
        if cold_weights:
            r = cold_replicas(sig, self.cache_bytes())
            many, one = self._signature_program(sig, r), self._signature_program(sig, 1)
            return max((self._time_call(many[0].module, many[1])
                        - self._time_call(one[0].module, one[1])) / (r - 1), 0.0)
        program, inputs = self._signature_program(sig)
        return max(self._time_call(program.module, inputs) - self.empty_call(), 0.0)

    def _time_call(self, fn: Callable[..., Any], inputs: list[torch.Tensor]) -> float:
        """Median seconds of one call on the CPU."""
        with torch.inference_mode():
            return median_call_time(lambda: fn(*inputs), 2, 10, 0.05, 200)

    def empty_call(self) -> float:
        """The time of calling a program that computes nothing (returns its input)."""
        if self._empty is None:
            b = GraphBuilder()
            b.output(b.input("x", (1,)), "y")
            program = self.program(b.build())
            x = torch.zeros(1, device=self.torch_device)
            self._empty = self.cached("__empty_call__",
                                      lambda: self._time_call(program.module, [x]))
        return self._empty

    def calibration(self) -> dict[str, float]:
        return {"empty_call_s": self.empty_call(), "per_op_overhead_s": self.launch_overhead()}

    def launch_overhead(self) -> float:
        """What an operator costs at the least: a relu on one element."""
        b = GraphBuilder()
        x = b.input("x", (1,))
        b.output(b.relu(x), "y")
        g = b.build()
        nid = g.outputs[0].node
        sig = OpSignature("relu", g[nid].attrs, g.input_types(nid), (False,), g[nid].outputs)
        return self.cached("__launch__", lambda: self.time_op(sig))

    def device(self) -> DeviceInfo:
        from graphsub.targets.ort import cpu_model

        details = {"torch": torch.__version__, "threads": str(self.threads)}
        if fusion.linear_available(self.torch_device):
            # products with constant matrices run on oneDNN (targets/torch/fusion.py), not
            # MKL: timings taken before are of another kernel
            details["linear"] = "onednn"
        return DeviceInfo(self.name, cpu_model(), details)


class TorchCpuTarget(TorchTarget):
    name = "torch-cpu"
    description = "graphsub's torch backend on the CPU (PyTorch's CPU kernels, op by op)"

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return None  # torch imported, so it is there


class TorchCudaTarget(TorchTarget):
    name = "torch-cuda"
    description = ("graphsub's torch backend on an NVIDIA GPU (cuDNN/cuBLAS kernels, CUDA-graph "
                   "replays)")
    capabilities = declared_capabilities("torch-cuda")
    device_type = "cuda"
    analytic_profile = "h100"
    #: Repetitions of one operator per timed replay: the cost is the marginal time of the
    #: extra ones.
    REPEATS = (2, 10)

    @classmethod
    def unavailable_reason(cls) -> str | None:
        if not torch.cuda.is_available():
            build = "a CPU-only build" if torch.version.cuda is None else \
                f"CUDA {torch.version.cuda}"
            return (f"torch {torch.__version__} ({build}) sees no CUDA device; run on a machine "
                    "with an NVIDIA GPU and a CUDA build of torch, or use --target torch-cpu")
        return None

    def _configure(self) -> None:
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = self.allow_tf32
        torch.backends.cudnn.allow_tf32 = self.allow_tf32
        self.fused_conv_relu = _probe_fused_conv_relu()

    def device(self) -> DeviceInfo:
        from graphsub.targets.ort import nvidia_versions

        props = torch.cuda.get_device_properties(0)
        # (cudnn.version is unannotated in torch; with torch absent, Any: the ignore is
        # unused there)
        cudnn = torch.backends.cudnn.version()  # type: ignore[no-untyped-call, unused-ignore]
        details = {"torch": torch.__version__, "cuda": str(torch.version.cuda),
                   "cudnn": str(cudnn),
                   "capability": f"{props.major}.{props.minor}",
                   "cuda_graphs": "on" if self.cuda_graphs else "off",
                   "tf32": "on" if self.allow_tf32 else "off"}
        nvidia = nvidia_versions()
        if "driver" in nvidia:
            details["driver"] = nvidia["driver"]
        return DeviceInfo(self.name, torch.cuda.get_device_name(0), details)

    def time_op(self, sig: OpSignature, cold_weights: bool = False) -> float:
        program, inputs = self._signature_program(sig)
        if (self.cuda_graphs and costs_nothing(sig.op, False, self.free_views)
                and _is_view(program, inputs)):
            return 0.0  # no kernel: nothing to replay
        if cold_weights:
            r = cold_replicas(sig, self.cache_bytes())
            many = self._signature_program(sig, r)
            t1 = self._time_repeated(program, inputs, 1)
            return max((self._time_repeated(*many, 1) - t1) / (r - 1), 0.0)
        k1, k2 = self.REPEATS
        t1, t2 = self._time_repeated(program, inputs, k1), self._time_repeated(program, inputs, k2)
        return max((t2 - t1) / (k2 - k1), 0.0)

    def cache_bytes(self) -> int:
        return int(torch.cuda.get_device_properties(0).L2_cache_size)

    def _time_repeated(self, program: TorchProgram | SizedTorchProgram,
                       inputs: list[torch.Tensor], k: int) -> float:
        """Median seconds of k back-to-back calls, by CUDA events around each replay (or each
        eager batch of calls)."""
        from graphsub.targets.torch.program import CudaGraphReplay

        def repeated(*xs: torch.Tensor) -> Any:
            out = None
            for _ in range(k):
                out = program.module(*xs)
            return out

        if self.cuda_graphs:
            go: Callable[[], Any] = CudaGraphReplay(repeated, inputs).replay
        else:
            def go() -> Any:
                return repeated(*inputs)
        with torch.inference_mode():
            for _ in range(3):
                go()
            torch.cuda.synchronize()
            return statistics.median(event_timed_calls(go, 15, cuda_event))

    def empty_call(self) -> float:
        return 0.0  # the marginal timing above has no fixed part to subtract


def _strided_like(t: torch.Tensor, strides: Strides) -> torch.Tensor:
    """`t`'s values (as many as fit) in a tensor of its shape with these strides, over a
    storage of the size they span: strides of 0 (an expanded view, whose elements share
    memory) or with gaps (a slice) as well as permutations."""
    span = 1 + sum((n - 1) * s for n, s in zip(t.shape, strides)) if t.numel() else 0
    flat = t.reshape(-1)
    base = flat.new_zeros(span)
    count = min(span, flat.numel())
    base[:count] = flat[:count]
    return base.as_strided(t.shape, strides)


def _is_view(program: TorchProgram | SizedTorchProgram, inputs: list[torch.Tensor]) -> bool:
    """Whether every output of the one-node program shares memory with an input."""
    with torch.inference_mode():
        outs = program(*inputs)
    ptrs = {t.untyped_storage().data_ptr() for t in inputs}
    return all(o.untyped_storage().data_ptr() in ptrs for o in outs)


def _probe_fused_conv_relu() -> Any:
    """cuDNN's fused convolution + relu, when this torch build has it and it agrees with the
    unfused pair on a small case; None otherwise (the backend then runs two kernels)."""
    op = getattr(torch.ops.aten, "cudnn_convolution_relu", None)
    if op is None:
        return None
    try:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(1, 4, 6, 6, generator=gen).cuda()
        w = torch.randn(8, 4, 3, 3, generator=gen).cuda()
        b = torch.randn(8, generator=gen).cuda()
        fused = op(x, w, b, (1, 1), (1, 1), (1, 1), 1)
        ref = torch.relu(torch.nn.functional.conv2d(x, w, b, 1, 1))
        ok = torch.allclose(fused, ref, rtol=1e-3, atol=1e-3)
    except (RuntimeError, NotImplementedError):
        return None

    def fused_conv_relu(x_: Any, w_: Any, b_: Any, stride: Any, padding: Any, dilation: Any,
                        groups: int) -> Any:
        return op(x_, w_, b_, list(stride), list(padding), list(dilation), groups)

    return fused_conv_relu if ok else None


__all__ = ["TorchCpuTarget", "TorchCudaTarget", "TorchTarget"]
