"""Graph inputs, weights and sizes. All are nodes, so a rule's pattern variable can bind any.

`sizes` is the one source computed at run time: an integer tensor whose elements are size
expressions (`(batch, seq * 4)`), what an exporter's shape computations give where a model
reads its own sizes as data (the positions `Range(seq)` counts, a mask's `ConstantOfShape`).
Its inputs are the tensors whose dimensions define its symbols, which is what it reads."""

from __future__ import annotations

from typing import Any

import numpy as np

from graphsub.errors import GraphsubError, ShapeError
from graphsub.tensors.types import Attrs, Constant, TensorType
from graphsub.tensors.symbolic import bind_all, evaluate_size, is_static
from graphsub.ops.base import (AttrSpec, Category, OpDef, TorchFn, TorchLowering, Types, ints,
                               register, size_dims)

from graphsub.ops.contexts import OpExportContext

def _no_export(ctx: OpExportContext, attrs: Attrs, ins: list[str], outs: list[str],
               types: Types) -> None:
    raise AssertionError("inputs and weights are written by the exporter itself")


def _no_eval(attrs: Attrs, xs: Any) -> tuple[np.ndarray, ...]:
    raise GraphsubError(f"no value was given for graph input {attrs['name']!r}")


def _constant(value: Any) -> Constant:
    return value if isinstance(value, Constant) else Constant(np.asarray(value))


def _zero_bytes(attrs: Attrs, ins: Types, outs: Types) -> int:
    return 0


register(OpDef(
    name="input", inputs=(0, 0), category=Category.SOURCE,
    attrs=(AttrSpec("name", convert=str), AttrSpec("shape", convert=size_dims),
           AttrSpec("dtype", "float32", str), AttrSpec("onnx_type", b"", bytes)),
    infer=lambda attrs, ins: (TensorType(attrs["shape"], attrs["dtype"], attrs["onnx_type"]),),
    evaluate=_no_eval, export=_no_export, bytes=_zero_bytes,
    doc="A named graph input; its dimensions may be size symbols. An opaque value (an ONNX "
        "sequence, map or optional, strings) keeps its ONNX type in onnx_type.",
))

register(OpDef(
    name="weight", inputs=(0, 0), attrs=(AttrSpec("value", convert=_constant),),
    category=Category.SOURCE,
    infer=lambda attrs, ins: (attrs["value"].type,),
    evaluate=lambda attrs, xs: (attrs["value"].array,),
    export=_no_export, bytes=_zero_bytes,
    doc="A constant tensor (ONNX initializer or Constant).",
))


def size_sources(value: Any) -> tuple[tuple[str, int, int], ...]:
    """Where each size symbol is read: (symbol, input index, axis) of an operator that
    computes with its inputs' sizes (`sizes`, `causal_mask`)."""
    return tuple((str(name), int(index), int(axis)) for name, index, axis in value)


def size_binding(sources: Any, xs: Any) -> dict[str, Any]:
    """Each size symbol's value, read from the shapes of the inputs `sources` names (ints,
    or SymInts while torch traces)."""
    return {name: xs[index].shape[axis] for name, index, axis in sources}


def _sizes_infer(attrs: Attrs, ins: Types) -> Types:
    for name, index, axis in attrs["sources"]:
        if index >= len(ins) or axis >= ins[index].rank:
            raise ShapeError(f"sizes: symbol {name} has no source at input {index}, axis {axis}")
    return (TensorType(attrs["shape"], attrs["dtype"]),)


def _sizes_eval(attrs: Attrs, xs: Any) -> tuple[np.ndarray, ...]:
    binding = size_binding(attrs["sources"], xs)
    values = bind_all(attrs["values"], binding)
    return (np.array(values, dtype=attrs["dtype"]).reshape(attrs["shape"]),)


def _sizes_torch(t: TorchLowering, attrs: Attrs, ins: Types, outs: Types) -> TorchFn:
    """The sizes from the inputs' shapes: ints in a static program, torch's symbolic ints
    where a program is traced with dynamic shapes."""
    sources, values, shape = attrs["sources"], attrs["values"], attrs["shape"]
    if is_static(values):
        fixed = t.const(np.array(values, dtype=attrs["dtype"]).reshape(shape))
        return lambda *xs: (fixed,)
    dtype, tensor = t.dtype(attrs["dtype"]), t.torch.tensor

    def sizes(*xs: Any) -> tuple[Any, ...]:
        binding = size_binding(sources, xs)
        flat = [evaluate_size(v, binding) for v in values]
        return (tensor(flat, dtype=dtype, device=t.device).reshape(shape),)

    return sizes


def _sizes_export(ctx: OpExportContext, attrs: Attrs, ins: list[str], outs: list[str],
                  types: Types) -> None:
    ctx.emit_sizes(attrs["values"], attrs["shape"], attrs["dtype"], outs[0])


register(OpDef(
    name="sizes", inputs=(1, None), category=Category.OPAQUE,
    attrs=(AttrSpec("values", convert=size_dims), AttrSpec("shape", convert=ints),
           AttrSpec("dtype", "int64", str), AttrSpec("sources", convert=size_sources)),
    infer=_sizes_infer, evaluate=_sizes_eval, export=_sizes_export, bytes=_zero_bytes,
    torch=_sizes_torch,
    doc="An integer tensor of size expressions, read from the shapes of its inputs.",
))
