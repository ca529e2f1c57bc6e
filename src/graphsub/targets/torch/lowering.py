"""graphsub operators as torch code: the context every operator's lowering is built in.

Each operator's lowering is part of its definition (`OpDef.torch`, written in the operator's
family module beside its numpy semantics; see `graphsub.ops.base.TorchLowering` for the
contract). This module is the torch side of that contract: it hands a lowering the torch
module, constants on the device and untraced calls, and builds a node's function.

Operators that torch can express as views (transpose, reshape, split, slices with positive
steps, ...) are lowered to views: no kernel runs and no data moves, and a matmul reading a
transposed view hands the transpose to the BLAS as an operand layout (TASO section 7.5).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch
import torch.nn.functional as F
# (the class below holds the module as its attribute `torch`, which its annotations would
# read)
from torch import device as TorchDevice, dtype as TorchDtype

from graphsub.targets.torch.arrays import to_torch
from graphsub.errors import NoLoweringError
from graphsub.tensors.types import TensorType
from graphsub.ops import all_ops, get_op
from graphsub.ops.base import TorchFn

Types = tuple[TensorType, ...]


@dataclass(frozen=True)
class ComputedType:
    """A tensor type whose symbolic dimensions are the program's computed sizes: what a
    lowering sees of its operands in a program over size symbols (a lowering that needs a
    size as a number fails on it, and the target then lowers per size)."""

    shape: tuple[Any, ...]
    dtype: str

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> Any:
        return math.prod(self.shape, start=1)

    @property
    def is_opaque(self) -> bool:
        """Never: a program over size symbols computes only tensors."""
        return False

_DTYPES = {
    "float32": torch.float32, "float16": torch.float16, "float64": torch.float64,
    "bfloat16": torch.bfloat16, "int8": torch.int8, "int16": torch.int16,
    "int32": torch.int32, "int64": torch.int64, "uint8": torch.uint8, "uint16": torch.uint16,
    "uint32": torch.uint32, "uint64": torch.uint64, "bool": torch.bool,
}


def torch_dtype(name: str) -> torch.dtype:
    return _DTYPES[name]


class LowerContext:
    """What a lowering may ask of the program being built (graphsub.ops.base.TorchLowering):
    torch itself, constants on the device, and calls that must not be traced (the onnxruntime
    fallback of opaque nodes)."""

    torch = torch
    F = F

    def __init__(self, device: TorchDevice,
                 const: Callable[[np.ndarray], Any] | None = None,
                 leaf: Callable[..., Any] | None = None,
                 fused_conv_relu: Any = None) -> None:
        self.device = device
        self.fused_conv_relu = fused_conv_relu
        self._const = const
        self._leaf = leaf

    def const(self, array: np.ndarray) -> Any:
        if self._const is not None:
            return self._const(array)
        return to_torch(np.asarray(array), self.device)

    def leaf(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self._leaf(fn, *args) if self._leaf is not None else fn(*args)

    def dtype(self, name: str) -> TorchDtype:
        return torch_dtype(name)

    def generated(self, fn: Callable[..., tuple[Any, ...]], ins: Types, outs: Types) -> TorchFn:
        """`fn` traced into ATen and compiled by inductor into a kernel (C++ on the CPU,
        Triton on CUDA), once per body and input types: inductor's cache keeps it across
        runs. Inputs are made contiguous first, the layout it was compiled for; the program
        calls the kernel without tracing into it. Where inductor cannot compile here (no C++
        compiler, an operator it lacks), `fn` runs as it is.

        The compilation is graphsub's own, outside any torch.compile under way: inside the
        torch.compile backend, inductor would otherwise make its fake tensors in dynamo's
        shape environment and leave guards there over symbols of its own, which no input of
        the user's graph has (dynamo then fails building the graph's guards)."""
        examples = [torch.zeros(t.shape, dtype=torch_dtype(t.dtype), device=self.device)
                    for t in ins]
        try:
            from torch._guards import tracing
            from torch._inductor.compile_fx import compile_fx
            from torch.fx.experimental.proxy_tensor import make_fx

            with torch.no_grad(), tracing(None):
                # a callable here: torch types compile_fx's result as a union of outputs
                compiled = cast(Callable[..., Any], compile_fx(make_fx(fn)(*examples), examples))
        except Exception as exc:  # inductor's failures have no common type
            warnings.warn(f"graphsub: a generated kernel runs uncompiled: inductor failed "
                          f"({type(exc).__name__}: {str(exc)[:200]})", RuntimeWarning,
                          stacklevel=2)
            return fn

        def kernel(*xs: Any) -> tuple[Any, ...]:
            return tuple(compiled(*(x.contiguous() for x in xs)))

        def call(*xs: Any) -> tuple[Any, ...]:
            result = self.leaf(kernel, *xs)
            return tuple(result[i] for i in range(len(outs)))

        return call


def lower(ctx: LowerContext, op: str, attrs: Mapping[str, Any],
          ins: tuple[TensorType | ComputedType, ...],
          outs: tuple[TensorType | ComputedType, ...]) -> TorchFn:
    """The torch function of one node, built by its operator's lowering. In a program over
    size symbols, its attributes and types hold the sizes computed (program.computed_attrs,
    ComputedType), which lowerings read as they read static ones."""
    # Called as ops.base.LowerFn is not: it names the static forms only, and mypy takes
    # LowerContext's `torch` and `F` for read-only, which TorchLowering's are not.
    fn: Callable[..., TorchFn] | None = get_op(op).torch
    if fn is None:
        raise NoLoweringError(f"graphsub's torch backend cannot run operator {op!r}")
    return fn(ctx, attrs, ins, outs)


def lowered_ops() -> Sequence[str]:
    """The operators the torch targets can run."""
    return sorted(name for name, op in all_ops().items() if op.torch is not None)
