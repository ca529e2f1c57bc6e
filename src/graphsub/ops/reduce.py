"""Reductions: sum, mean and max over a set of axes, with or without keeping dimensions."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from graphsub.tensors.types import Attrs, TensorType
from graphsub.errors import ConversionError
from graphsub.ops.base import (AXES_TRIES, AtenBuilder, AtenCall, AtenImportFn, AttrSpec,
                               Category, ExportFn, LowerFn, OpDef, TorchFn, TorchLowering, Types,
                               aten_importer, ints, is_float, norm_axis, onnx_importer, register)

from graphsub.ops.contexts import OpExportContext, OpImportContext
from graphsub.tensors.values import Value

if TYPE_CHECKING:
    import onnx


def _canon(values: dict[str, Any], ins: Types) -> dict[str, Any]:
    rank = ins[0].rank
    axes = values["axes"] if values["axes"] is not None else tuple(range(rank))
    # A scalar has nothing to reduce over: its one axis the axis conventions allow is none.
    values["axes"] = tuple(sorted({norm_axis(a, rank, "reduce") for a in axes})) if rank else ()
    return values


def _infer(attrs: Attrs, ins: Types) -> Types:
    x, axes = ins[0], attrs["axes"]
    if attrs["keepdims"]:
        shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    else:
        shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
    return (TensorType(shape, x.dtype),)


def _export(onnx_type: str, axes_as_input_from: int) -> ExportFn:
    def export(ctx: OpExportContext, attrs: Attrs, ins: list[str], outs: list[str],
               types: Types) -> None:
        keep = int(attrs["keepdims"])
        if not attrs["axes"]:  # reducing over nothing: the identity
            ctx.emit("Identity", ins, outs)
        elif ctx.opset >= axes_as_input_from:
            axes = ctx.const(np.array(attrs["axes"], dtype=np.int64))
            ctx.emit(onnx_type, [ins[0], axes], outs, keepdims=keep)
        else:
            ctx.emit(onnx_type, ins, outs, axes=list(attrs["axes"]), keepdims=keep)

    return export


def _torch(kind: str) -> LowerFn:
    def lower(t: TorchLowering, attrs: Attrs, ins: Types, outs: Types) -> TorchFn:
        torch = t.torch
        axes, keep = tuple(attrs["axes"]), bool(attrs["keepdims"])
        if not axes:
            return lambda x: (x,)
        if kind == "max":
            return lambda x: (torch.amax(x, dim=axes, keepdim=keep),)
        if kind == "sum":
            return lambda x: (torch.sum(x, dim=axes, keepdim=keep, dtype=x.dtype),)
        if is_float(ins[0]):
            return lambda x: (torch.mean(x, dim=axes, keepdim=keep),)
        dtype = t.dtype(ins[0].dtype)  # the reference averages integers in float64
        return lambda x: (torch.mean(x.double(), dim=axes, keepdim=keep).to(dtype),)

    return lower


def _reduce(name: str, onnx_type: str, fn: Callable[..., np.ndarray | np.generic],
            axes_input_from: int) -> None:
    register(OpDef(
        name=name, inputs=(1, 1), torch=_torch(name.removeprefix("reduce_")),
        category=Category.REDUCE,
        attrs=(AttrSpec("axes", None, ints, tries=AXES_TRIES),
               AttrSpec("keepdims", True, bool, tries=(True, False))),
        infer=_infer,
        evaluate=lambda attrs, xs: (np.asarray(fn(xs[0], axis=attrs["axes"],
                                                  keepdims=attrs["keepdims"]))
                                    .astype(xs[0].dtype),),
        export=_export(onnx_type, axes_input_from), canonicalize=_canon,
        flops=lambda attrs, ins, outs: ins[0].numel,
        doc=f"{onnx_type} over the given axes (all axes when None).",
    ))


def _mean(x: np.ndarray, axis: tuple[int, ...], keepdims: bool) -> np.ndarray | np.generic:
    return np.mean(x, axis=axis, keepdims=keepdims, dtype=np.float64)


def _sum(x: np.ndarray, axis: tuple[int, ...], keepdims: bool) -> np.ndarray | np.generic:
    acc = np.float64 if x.dtype.kind == "f" else None
    return np.sum(x, axis=axis, keepdims=keepdims, dtype=acc)


_reduce("reduce_sum", "ReduceSum", _sum, 13)
_reduce("reduce_mean", "ReduceMean", _mean, 18)
_reduce("reduce_max", "ReduceMax", np.max, 18)

_IMPORTS = {"ReduceSum": "reduce_sum", "ReduceMean": "reduce_mean", "ReduceMax": "reduce_max"}


@onnx_importer(*_IMPORTS)
def _import_reduce(ctx: OpImportContext, node: onnx.NodeProto) -> list[Value] | None:
    x = ctx.inputs(node)[0]
    axes: Sequence[int] | None
    if len(node.input) > 1 and node.input[1]:
        c = ctx.constant(node.input[1])
        if c is None:
            return None
        axes = [int(a) for a in np.atleast_1d(c)]
    else:
        axes = ctx.attr(node, "axes", None)
    if not axes:
        if ctx.attr(node, "noop_with_empty_axes", 0):
            return ctx.add("identity", [x])
        axes = None
    return ctx.add(_IMPORTS[node.op_type], [x], axes=axes,
                   keepdims=bool(ctx.attr(node, "keepdims", 1)))


def _aten_reduce(ours: str) -> AtenImportFn:
    def convert(c: AtenBuilder, n: AtenCall) -> object:
        if n.args.get("dtype") is not None:
            raise ConversionError("reduction with a dtype")
        dims = n.args.get("dim")
        axes = None if dims is None or (isinstance(dims, (list, tuple)) and not dims) else (
            [dims] if isinstance(dims, int) else list(dims))
        return c.op(ours, c.value(n.args["self"]), axes=axes,
                    keepdims=bool(n.args.get("keepdim", False)))

    return convert


aten_importer("mean.dim")(_aten_reduce("reduce_mean"))
aten_importer("sum.dim_IntList")(_aten_reduce("reduce_sum"))
aten_importer("amax.default")(_aten_reduce("reduce_max"))
