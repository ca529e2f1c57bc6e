"""graphsub's own module run through CUDA graphs, as inductor's "reduce-overhead" mode runs
its code: one replay launches every kernel with no Python or dispatcher work in between.

Captured once per input signature (shapes, strides, dtypes, the sizes given as ints) over
static input buffers: a call copies its tensors into them and replays. The module's
parameters and buffers (which torch.compile passes as inputs) are not copied: the captured
graph reads them where they are, and a call that hands another tensor in their place is
captured again. Outputs are copies: the captured graph's own output buffers are overwritten by
the next replay, and a caller may keep what it got (a generation loop keeps every step's).

A program that writes into its inputs (a static key/value cache) has those inputs read and
written in place, as parameters are, and its warm-up calls run on copies of them: only the
replay of the caller's own call writes them, once.

Tensors made here are ordinary tensors (no inference mode), so the module works however it is
called afterwards (inference tensors cannot be written into outside `torch.inference_mode()`,
which broke CUDA-graph trees captured during the backend's race).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from graphsub.frontends.side_effects import private_copy

#: Warm-up calls before a capture (cuDNN's autotuner, lazy allocations, first-call paths).
WARMUP = 3
#: Captured graphs kept (one per input signature: a dynamic model called at many sizes).
KEPT = 16


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    inputs: list[Any]     # static buffers where copied, the caller's tensors where not
    outputs: Any
    pointers: dict[int, int]  # position -> data_ptr of each parameter read in place


class CudaGraphed:
    """`fn` called through CUDA graphs (see the module's docstring); inputs at `static`
    positions (parameters, buffers) are read in place, and so are those at `written`
    positions (which the program writes into), never written by a warm-up call."""

    def __init__(self, fn: Callable[..., Any], static: Sequence[int] = (),
                 written: Sequence[int] = ()) -> None:
        self.fn = fn
        self.written = frozenset(written)
        self.static = frozenset(static) | self.written
        self._graphs: dict[tuple[Any, ...], _Captured] = {}

    def __call__(self, *args: Any) -> Any:
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if not tensors or not all(t.is_cuda for t in tensors) or (
                torch.is_grad_enabled() and any(t.requires_grad for t in tensors)):
            return self.fn(*args)
        key = tuple((tuple(a.shape), a.stride(), a.dtype) if isinstance(a, torch.Tensor)
                    else a for a in args)
        captured = self._graphs.get(key)
        if captured is not None and any(args[i].data_ptr() != ptr
                                        for i, ptr in captured.pointers.items()):
            captured = None  # a parameter moved: capture again
        if captured is None:
            captured = self._capture(args)
            if len(self._graphs) >= KEPT:
                self._graphs.pop(next(iter(self._graphs)))
            self._graphs[key] = captured
        else:
            for i, (buffer, a) in enumerate(zip(captured.inputs, args)):
                if isinstance(a, torch.Tensor) and i not in self.static:
                    buffer.copy_(a)
        captured.graph.replay()
        return _copied(captured.outputs)

    def _capture(self, args: Sequence[Any]) -> _Captured:
        inputs = [a if not isinstance(a, torch.Tensor) or i in self.static
                  else a.detach().clone(memory_format=torch.preserve_format)
                  for i, a in enumerate(args)]
        # (unannotated in torch; with torch absent, Any: the ignore is unused there)
        stream = torch.cuda.Stream()  # type: ignore[no-untyped-call, unused-ignore]
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.no_grad():
            for _ in range(WARMUP):
                self.fn(*[private_copy(a) if i in self.written else a
                          for i, a in enumerate(inputs)])
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(graph):
            outputs = self.fn(*inputs)
        pointers = {i: args[i].data_ptr() for i in self.static
                    if i < len(args) and isinstance(args[i], torch.Tensor)}
        return _Captured(graph, inputs, outputs, pointers)


def _copied(outputs: Any) -> Any:
    if isinstance(outputs, torch.Tensor):
        return outputs.clone()
    if isinstance(outputs, (list, tuple)):
        return type(outputs)(_copied(o) for o in outputs)
    return outputs
