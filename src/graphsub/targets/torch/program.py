"""A graphsub Graph as a torch program: an FX GraphModule with its weights on the device.

Building the program lowers every computing node (see `lowering`) into one FX graph, whose
generated Python calls torch operations directly and frees each intermediate after its last
use. Weights, and weight-only subgraphs evaluated once (TASO section 7.3), are buffers of the
module on the device, so a run moves no weights. The same module runs eagerly, is captured
in a CUDA graph (`TorchRunnable(cuda_graphs=True)`), or is handed to inductor.
"""

from __future__ import annotations

import keyword
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.fx as fx
from torch.fx.proxy import GraphAppendingTracer

from graphsub.targets.torch import fusion
from graphsub.targets.torch.arrays import to_numpy, to_torch
from graphsub.targets.torch.lowering import ComputedType, LowerContext, lower, torch_dtype
from graphsub.errors import GraphsubError
from graphsub.ir.binding import bind_graph, binding_of, is_symbolic_graph
from graphsub.ir.graph import Graph, Value
from graphsub.tensors.symbolic import (SymbolRange, evaluate_size, is_symbolic, symbols_in,
                                       symbols_in_value)
from graphsub.tensors.types import TensorType
from graphsub.runtime.reference import materialized_weights
from graphsub.runtime.timing import Runnable, event_timed_calls, timed_calls


def _identifier(name: str, used: set[str]) -> str:
    base = "".join(c if c.isalnum() or c == "_" else "_" for c in name) or "x"
    if base[0].isdigit() or keyword.iskeyword(base):
        base = "_" + base
    out, k = base, 1
    while out in used:
        out = f"{base}_{k}"
        k += 1
    used.add(out)
    return out


def symbol_sources(graph: Graph) -> dict[str, tuple[int, int]]:
    """Where a program reads each size symbol: the (input position, axis) of a dimension that
    is the symbol. An error names the symbols no input has as a dimension: those an input's
    dimension is computed from, and those the operators compute with (a slice of a constant
    to the sequence's length, in a part of a captured graph whose inputs are all constants)."""
    sources: dict[str, tuple[int, int]] = {}
    needed = set(_symbols_used(graph))
    for k, nid in enumerate(graph.inputs):
        for axis, d in enumerate(graph[nid].type.shape):
            needed |= symbols_in((d,))
            if not isinstance(d, int) and d.is_Symbol:
                sources.setdefault(d.name, (k, axis))
    unread = sorted(needed - set(sources))
    if unread:
        raise GraphsubError(f"size symbol(s) {', '.join(unread)} are not a dimension of any "
                            f"input: a program cannot read them")
    return sources


def _symbols_used(graph: Graph) -> frozenset[str]:
    """The size symbols in the graph's operators: their attributes and output types."""
    return frozenset().union(*(symbols_in(t.shape) | symbols_in_value(node.attrs)
                               for node in graph.nodes.values() for t in node.outputs))


def symbol_values(sources: Mapping[str, tuple[int, int]],
                  inputs: Sequence[torch.Tensor]) -> dict[str, Any]:
    """Each size symbol's value read from the inputs' shapes (`symbol_sources`): ints when
    run, torch's SymInts when torch traces the caller with dynamic shapes."""
    return {name: inputs[k].shape[axis] for name, (k, axis) in sources.items()}


def computed_attrs(attrs: Mapping[str, Any], sizes: Mapping[str, Any]) -> dict[str, Any]:
    """Attributes with each size expression (alone or in a tuple) computed from the sizes'
    values: what a lowering over size symbols is given."""

    def computed(value: Any) -> Any:
        if is_symbolic(value):
            return evaluate_size(value, sizes)
        if isinstance(value, tuple):
            return tuple(computed(v) for v in value)
        return value

    return {k: computed(v) for k, v in attrs.items()}


def _computed_type(t: TensorType, sizes: Mapping[str, Any]) -> TensorType | ComputedType:
    if t.is_static:
        return t
    return ComputedType(tuple(evaluate_size(d, sizes) for d in t.shape), t.dtype)


def to_tensor(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A device tensor holding a copy of the array (weights are read-only numpy arrays)."""
    return to_torch(array, device)


class TorchProgram:
    """`program(*inputs)` returns the graph's outputs, in order, as device tensors.

    `fuse` (default on): groups of nodes that are one library kernel run as that kernel
    (see `fusion`: linear layers on oneDNN on the CPU, attention as SDPA); `fusions` lists
    the kinds made."""

    def __init__(self, graph: Graph, device: str | torch.device = "cpu",
                 fused_conv_relu: Any = None, fuse: bool = True,
                 shared: SharedTensors | None = None,
                 reference: Mapping[str, int] | None = None) -> None:
        self.graph = graph
        self.device = torch.device(device)
        self._shared = shared
        self.input_names = list(graph.input_names)
        self.output_names = list(graph.output_names)
        self.input_types = [graph[i].type for i in graph.inputs]
        self.fusions: list[str] = []
        #: Where each size symbol is read (input position, axis); empty for static sizes.
        self.sources = symbol_sources(graph) if is_symbolic_graph(graph) else {}
        self._reference = dict(reference or {})
        self.module = self._build(fused_conv_relu, fuse)

    def binding(self, inputs: Sequence[torch.Tensor]) -> dict[str, int]:
        """The size symbols' values these inputs give."""
        return symbol_values(self.sources, inputs)

    def _build(self, fused_conv_relu: Any, fuse: bool) -> fx.GraphModule:
        graph = self.graph
        fx_graph = fx.Graph()
        tracer = GraphAppendingTracer(fx_graph)
        root = torch.nn.Module()
        used: set[str] = set()
        env: dict[Value, Any] = {}

        def const(array: np.ndarray) -> fx.Proxy:
            name = _identifier(f"c{len(used)}", used)
            tensor = (self._shared.tensor(array) if self._shared is not None
                      else to_tensor(array, self.device))
            root.register_buffer(name, tensor)
            return fx.Proxy(fx_graph.get_attr(name), tracer)

        def leaf(fn: Any, *args: Any) -> fx.Proxy:
            return tracer.create_proxy("call_function", fn, args, {})

        weights = materialized_weights(graph)

        def value(v: Value) -> Any:
            """A value's proxy; a weight becomes a buffer when first read (a fusion may
            read a weight in a form of its own and leave the original unread)."""
            if v not in env:
                env[v] = const(weights[v])
            return env[v]

        ctx = LowerContext(self.device, const, leaf, fused_conv_relu)
        for nid in graph.inputs:
            env[Value(nid, 0)] = fx.Proxy(
                fx_graph.placeholder(_identifier(graph[nid].attrs["name"], used)), tracer)
        # Over size symbols, each symbol is read from its input's shape when the program
        # runs (an int; a SymInt where torch traces the program with dynamic shapes) and
        # every size attribute is computed from them: one program for every size.
        sizes = {name: fx.Proxy(fx_graph.call_function(
            torch.ops.aten.sym_size.int, (env[Value(graph.inputs[k], 0)].node, axis)), tracer)
            for name, (k, axis) in self.sources.items()}
        # Which groups become library kernels does not depend on sizes, only whether they
        # pay: decided at the reference sizes.
        planned = bind_graph(graph, self._reference_binding()) if sizes else graph
        fusions = fusion.plan(planned, weights, self.device) if fuse else {}
        absorbed = {n for f in fusions.values() for n in f.absorbed}
        weight_only = graph.weight_only()
        for nid in graph.topo_order():
            node = graph[nid]
            if node.op == "input" or nid in weight_only or nid in absorbed:
                continue
            if nid in fusions:
                f = fusions[nid]
                args = [value(x) if isinstance(x, Value) else const(x) for x in f.inputs]
                env[Value(nid, 0)] = f.build(ctx, *args)
                self.fusions.append(f.kind)
                continue
            if sizes:
                fn = lower(ctx, node.op, computed_attrs(node.attrs, sizes),
                           tuple(_computed_type(t, sizes) for t in graph.input_types(nid)),
                           tuple(_computed_type(t, sizes) for t in node.outputs))
            else:
                fn = lower(ctx, node.op, node.attrs, graph.input_types(nid), node.outputs)
            results = fn(*(value(v) for v in node.inputs))
            for i in range(len(node.outputs)):
                env[Value(nid, i)] = results[i]
        fx_graph.output(tuple(value(v).node for v in graph.outputs))
        if fusions:  # views whose only reader a fusion absorbed
            fx_graph.eliminate_dead_code()
        return fx.GraphModule(root, fx_graph, class_name="GraphsubProgram")

    def _reference_binding(self) -> dict[str, int]:
        """The sizes fusions are decided at: those given, else each symbol at the default
        of a shape profile within its range (runtime.check_sizes)."""
        from graphsub.runtime.check_sizes import default_profile

        symbols = self.graph.facts.symbols or {name: SymbolRange()
                                                     for name in self.sources}
        binding = default_profile(symbols)[0].values
        binding.update({k: v for k, v in self._reference.items() if k in binding})
        return binding

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outputs: tuple[torch.Tensor, ...] = self.module(*inputs)
        return outputs

    def inputs_from(self, feeds: Mapping[str, np.ndarray]) -> list[torch.Tensor]:
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            from graphsub.errors import GraphsubError

            raise GraphsubError(f"no value given for graph input(s): {', '.join(missing)}")
        out = []
        for name, t in zip(self.input_names, self.input_types):
            out.append(to_torch(np.asarray(feeds[name]), self.device).to(torch_dtype(t.dtype)))
        return out

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Numpy in, numpy out."""
        with torch.inference_mode():
            outs = self(*self.inputs_from(feeds))
        return {name: to_numpy(t) for name, t in zip(self.output_names, outs)}


class SharedTensors:
    """Device copies of weight arrays, one per array, for programs of the same graph at
    several sizes: their weights are the same arrays (`bind_graph` keeps them)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._tensors: dict[int, tuple[np.ndarray, torch.Tensor]] = {}  # the array keeps its id

    def tensor(self, array: np.ndarray) -> torch.Tensor:
        entry = self._tensors.get(id(array))
        if entry is None:
            entry = self._tensors[id(array)] = (array, to_tensor(array, self.device))
        return entry[1]


class SizedTorchProgram:
    """A graph with size symbols as torch programs lowered per size: what `TorchTarget.
    program` falls back to where some operator's lowering cannot compute its sizes from the
    inputs' shapes. `module(*inputs)` takes inputs of any sizes in the symbols' ranges; each
    new binding of the symbols (read from the inputs' shapes) gets its own lowering of the
    bound graph (`bind_graph`), built on first use and kept for the last `KEPT` bindings.
    Weights are on the device once, shared by all of them."""

    KEPT = 32

    def __init__(self, graph: Graph, device: str | torch.device = "cpu",
                 fused_conv_relu: Any = None, fuse: bool = True) -> None:
        self.graph = graph
        self.device = torch.device(device)
        self.input_names = list(graph.input_names)
        self.output_names = list(graph.output_names)
        self._options = (fused_conv_relu, fuse)
        self._shared = SharedTensors(self.device)
        self._programs: OrderedDict[tuple[tuple[str, int], ...], TorchProgram] = OrderedDict()
        self.sources = symbol_sources(graph)
        self.module = _SizedModule(self)

    def binding(self, inputs: Sequence[torch.Tensor]) -> dict[str, int]:
        return symbol_values(self.sources, inputs)

    def at(self, binding: Mapping[str, int]) -> TorchProgram:
        """The program of the graph at these sizes (built now if not kept)."""
        key = tuple(sorted(binding.items()))
        program = self._programs.get(key)
        if program is None:
            program = TorchProgram(bind_graph(self.graph, dict(key)), self.device,
                                   *self._options, shared=self._shared)
            self._programs[key] = program
            if len(self._programs) > self.KEPT:
                self._programs.popitem(last=False)
        else:
            self._programs.move_to_end(key)
        return program

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outputs: tuple[torch.Tensor, ...] = self.at(self.binding(inputs)).module(*inputs)
        return outputs

    def _at_feeds(self, feeds: Mapping[str, np.ndarray]) -> TorchProgram:
        shapes = {n: np.shape(feeds[n]) for n in self.input_names if n in feeds}
        return self.at(binding_of(self.graph, shapes))

    def inputs_from(self, feeds: Mapping[str, np.ndarray]) -> list[torch.Tensor]:
        return self._at_feeds(feeds).inputs_from(feeds)

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Numpy in, numpy out."""
        return self._at_feeds(feeds).run(feeds)


# (torch absent, its classes are Any: the ignore is for mypy without the extras)
class _SizedModule(torch.nn.Module):  # type: ignore[misc, unused-ignore]
    """A SizedTorchProgram as a module (what a TorchProgram's `module` is for static sizes)."""

    def __init__(self, program: SizedTorchProgram) -> None:
        super().__init__()
        self._program = program

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self._program(*inputs)


class CudaGraphReplay:
    """A program captured in a CUDA graph over fixed input buffers: one replay launches every
    kernel of the model with no Python or dispatcher work in between."""

    def __init__(self, fn: Any, inputs: Sequence[torch.Tensor], warmup: int = 3) -> None:
        self.inputs = list(inputs)
        # (unannotated in torch; with torch absent, Any: the ignore is unused there)
        stream = torch.cuda.Stream()  # type: ignore[no-untyped-call, unused-ignore]
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.inference_mode():
            for _ in range(warmup):  # cuDNN autotuning and allocations happen here
                fn(*self.inputs)
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.inference_mode(), torch.cuda.graph(self.graph):
            self.outputs: tuple[torch.Tensor, ...] = fn(*self.inputs)

    def replay(self) -> tuple[torch.Tensor, ...]:
        self.graph.replay()
        return self.outputs


def cuda_event() -> torch.cuda.Event:
    """A CUDA event that records its time: what `event_timed_calls` times a GPU with."""
    # (unannotated; with torch absent, Any: the ignore is unused there)
    return torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call, unused-ignore]


class TorchRunnable(Runnable):
    """A program on its device, timed the way the device runs it: wall clock around a call on
    the CPU; CUDA events around a CUDA-graph replay (or an eager call) on a GPU, each run
    synchronized, so a sample is one inference's latency."""

    def __init__(self, program: TorchProgram | SizedTorchProgram, cuda_graphs: bool = True,
                 label: str = "") -> None:
        self.program = program
        self.label = label
        self.cuda = program.device.type == "cuda"
        self.cuda_graphs = cuda_graphs and self.cuda
        self._inputs: list[torch.Tensor] = []
        self._replay: CudaGraphReplay | None = None

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.program.run(feeds)

    def bind(self, feeds: Mapping[str, np.ndarray]) -> None:
        self._inputs = self.program.inputs_from(feeds)
        self._replay = None
        if self.cuda_graphs:
            self._replay = CudaGraphReplay(self.program, self._inputs)

    def timed(self, n: int) -> list[float]:
        with torch.inference_mode():
            if not self.cuda:
                return timed_calls(lambda: self.program(*self._inputs), n)
            return event_timed_calls(self._launch, n, cuda_event)

    def _launch(self) -> object:
        """One inference on the bound inputs: a replay of the captured graph, or a call."""
        if self._replay is not None:
            return self._replay.replay()
        return self.program(*self._inputs)

    def close(self) -> None:
        self._replay = None
        self._inputs = []
