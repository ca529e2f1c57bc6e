"""2-D max and average pooling and global average pooling (NCHW)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from graphsub.errors import ShapeError
from graphsub.tensors.symbolic import Dim, ceildiv
from graphsub.tensors.types import Attrs, TensorType
from graphsub.ops.base import (AtenBuilder, AtenCall, AttrSpec, Category, ExportFn, InferFn, OpDef,
                               OperandRole, TorchFn, TorchLowering, Types, aten_importer, is_float,
                               onnx_importer, pair, register)
from graphsub.ops.conv import (AUTO_PAD, PADDING_TRIES, STRIDE_TRIES, Pads, canonical_padding,
                               onnx_pads, pad_nchw, padding_attr, resolve_pads,
                               same_over_sizes, symmetric_pads, window_out, windows)

from graphsub.ops.contexts import OpExportContext, OpImportContext
from graphsub.tensors.values import Value

if TYPE_CHECKING:
    import onnx


def _pool_geometry(attrs: Attrs, x: TensorType, op: str
                   ) -> tuple[Pads | None, tuple[Dim, Dim]]:
    if x.rank != 4:
        raise ShapeError(f"{op}: input must be 4-D (NCHW), got {x.shape}")
    kernel, stride = attrs["kernel"], attrs["stride"]
    if same_over_sizes(attrs["padding"], x.shape[2:], stride):
        return None, (ceildiv(x.shape[2], stride[0]), ceildiv(x.shape[3], stride[1]))
    pads = resolve_pads(attrs["padding"], x.shape[2:], kernel, stride)
    if max(pads[0], pads[2]) >= kernel[0] or max(pads[1], pads[3]) >= kernel[1]:
        raise ShapeError(f"{op}: padding {pads} must be smaller than the kernel {kernel}")
    ho = window_out(x.shape[2], kernel[0], stride[0], 1, pads[0], pads[2], op)
    wo = window_out(x.shape[3], kernel[1], stride[1], 1, pads[1], pads[3], op)
    return pads, (ho, wo)


def _pool_infer(op: str) -> InferFn:
    def infer(attrs: Attrs, ins: Types) -> Types:
        x = ins[0]
        _, (ho, wo) = _pool_geometry(attrs, x, op)
        return (TensorType(x.shape[:2] + (ho, wo), x.dtype),)

    return infer


def _pool_canon(values: dict[str, Any], ins: Types) -> dict[str, Any]:
    if values.get("stride") is None:
        values["stride"] = values["kernel"]
    if ins and ins[0].rank == 4:
        values["padding"] = canonical_padding(values["padding"], ins[0].shape[2:],
                                              values["kernel"], values["stride"])
    return values


def _max_eval(attrs: Attrs, xs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    x = xs[0]
    pads, out_hw = _pool_geometry(attrs, TensorType(x.shape, str(x.dtype)), "max_pool2d")
    assert pads is not None  # an array's sizes are numbers: its pads are known
    low = np.finfo(x.dtype).min if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    win = windows(pad_nchw(x, pads, low), attrs["kernel"], attrs["stride"], (1, 1), out_hw)
    return (win.max(axis=(-2, -1)).astype(x.dtype),)


def _avg_eval(attrs: Attrs, xs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    x = xs[0]
    pads, out_hw = _pool_geometry(attrs, TensorType(x.shape, str(x.dtype)), "avg_pool2d")
    assert pads is not None  # an array's sizes are numbers: its pads are known
    kernel, stride = attrs["kernel"], attrs["stride"]
    sums = windows(pad_nchw(x.astype(np.float64), pads), kernel, stride, (1, 1), out_hw)
    sums = sums.sum(axis=(-2, -1))
    if attrs["count_include_pad"]:
        counts = np.float64(kernel[0] * kernel[1])
    else:
        ones = np.ones((1, 1) + x.shape[2:])
        counts = windows(pad_nchw(ones, pads), kernel, stride, (1, 1), out_hw).sum(axis=(-2, -1))
    return ((sums / counts).astype(x.dtype),)


def _pool_export(onnx_type: str) -> ExportFn:
    def export(ctx: OpExportContext, attrs: Attrs, ins: list[str], outs: list[str],
               types: Types) -> None:
        extra: dict[str, Any] = {}
        if onnx_type == "AveragePool":
            extra["count_include_pad"] = int(attrs["count_include_pad"])
        if same_over_sizes(attrs["padding"], types[0].shape[2:], attrs["stride"]):
            extra["auto_pad"] = AUTO_PAD[attrs["padding"]]
        else:
            extra["pads"] = list(resolve_pads(attrs["padding"], types[0].shape[2:],
                                              attrs["kernel"], attrs["stride"]))
        ctx.emit(onnx_type, ins, outs, kernel_shape=list(attrs["kernel"]),
                 strides=list(attrs["stride"]), **extra)

    return export


def _pool_flops(attrs: Attrs, ins: Types, outs: Types) -> int:
    kernel: tuple[int, int] = attrs["kernel"]
    return outs[0].numel * kernel[0] * kernel[1]


def _torch_pads(attrs: Attrs, x: TensorType) -> tuple[Pads, bool]:
    """The pads, and whether torch's built-in (symmetric, at most half the kernel) padding
    expresses them."""
    pads = resolve_pads(attrs["padding"], x.shape[2:], attrs["kernel"], attrs["stride"])
    sym = symmetric_pads(pads)
    k = attrs["kernel"]
    builtin = sym is not None and sym[0] <= k[0] // 2 and sym[1] <= k[1] // 2
    return pads, builtin


def _max_torch(t: TorchLowering, attrs: Attrs, ins: Types, outs: Types) -> TorchFn:
    F = t.F
    k, s = tuple(attrs["kernel"]), tuple(attrs["stride"])
    pads, builtin = _torch_pads(attrs, ins[0])
    if builtin:
        p = (pads[0], pads[1])
        return lambda x: (F.max_pool2d(x, k, s, p),)
    top, left, bottom, right = pads
    low = -math.inf if is_float(ins[0]) else int(np.iinfo(np.dtype(ins[0].dtype)).min)
    return lambda x: (F.max_pool2d(F.pad(x, (left, right, top, bottom), value=low), k, s),)


def _avg_torch(t: TorchLowering, attrs: Attrs, ins: Types, outs: Types) -> TorchFn:
    F = t.F
    k, s = tuple(attrs["kernel"]), tuple(attrs["stride"])
    include = bool(attrs["count_include_pad"])
    pads, builtin = _torch_pads(attrs, ins[0])
    if builtin:
        p = (pads[0], pads[1])
        return lambda x: (F.avg_pool2d(x, k, s, p, count_include_pad=include),)
    top, left, bottom, right = pads
    if include or not any(pads):
        return lambda x: (F.avg_pool2d(F.pad(x, (left, right, top, bottom)), k, s),)
    # Padded cells do not count: rescale the zero-padded average by kernel area / real cells.
    h, w = ins[0].shape[2:]
    ones = np.pad(np.ones((h, w)), ((top, bottom), (left, right)))
    ho, wo = outs[0].shape[2:]
    counts = np.array([[ones[i * s[0]:i * s[0] + k[0], j * s[1]:j * s[1] + k[1]].sum()
                        for j in range(wo)] for i in range(ho)])
    scale = t.const((k[0] * k[1] / counts).astype(ins[0].dtype).reshape(1, 1, ho, wo))
    return lambda x: (F.avg_pool2d(F.pad(x, (left, right, top, bottom)), k, s) * scale,)


def _gap_torch(t: TorchLowering, attrs: Attrs, ins: Types, outs: Types) -> TorchFn:
    dims, mean = tuple(range(2, ins[0].rank)), t.torch.mean
    return lambda x: (mean(x, dim=dims, keepdim=True),)


_POOL_ATTRS = (AttrSpec("kernel", convert=pair, tries=((3, 3), (2, 2))),
               AttrSpec("stride", None, pair, tries=STRIDE_TRIES),
               AttrSpec("padding", "valid", padding_attr, tries=PADDING_TRIES))
#: What the rule check pools: an image.
_IMAGE = (OperandRole(shapes=((1, 4, 6, 6), (2, 4, 7, 5))),)

register(OpDef(
    name="max_pool2d", inputs=(1, 1), attrs=_POOL_ATTRS, category=Category.REDUCE, roles=_IMAGE,
    infer=_pool_infer("max_pool2d"), evaluate=_max_eval, export=_pool_export("MaxPool"),
    flops=_pool_flops, canonicalize=_pool_canon, torch=_max_torch,
    doc="Max pooling; padding never wins the max. Stride defaults to the kernel size.",
))

register(OpDef(
    name="avg_pool2d", inputs=(1, 1), category=Category.REDUCE, roles=_IMAGE,
    attrs=_POOL_ATTRS + (AttrSpec("count_include_pad", False, bool, tries=(True, False)),),
    infer=_pool_infer("avg_pool2d"), evaluate=_avg_eval, export=_pool_export("AveragePool"),
    flops=_pool_flops, canonicalize=_pool_canon, torch=_avg_torch,
    doc="Average pooling; padded cells count only with count_include_pad.",
))


def _gap_infer(attrs: Attrs, ins: Types) -> Types:
    x = ins[0]
    if x.rank < 3:
        raise ShapeError(f"global_avg_pool: input must be N x C x spatial, got {x.shape}")
    return (TensorType(x.shape[:2] + (1,) * (x.rank - 2), x.dtype),)


register(OpDef(
    name="global_avg_pool", inputs=(1, 1), infer=_gap_infer, torch=_gap_torch,
    category=Category.REDUCE, roles=_IMAGE,
    evaluate=lambda attrs, xs: (xs[0].mean(axis=tuple(range(2, xs[0].ndim)), keepdims=True,
                                           dtype=np.float64).astype(xs[0].dtype),),
    export=lambda ctx, attrs, ins, outs, types: ctx.emit("GlobalAveragePool", ins, outs),
    flops=lambda attrs, ins, outs: ins[0].numel,
))


@onnx_importer("MaxPool", "AveragePool")
def _import_pool(ctx: OpImportContext, node: onnx.NodeProto) -> list[Value] | None:
    x = ctx.inputs(node)[0]
    x_t = ctx.type_of(x)
    if x_t.rank != 4 or (len(node.output) > 1 and ctx.is_used(node.output[1])):
        return None
    if any(d != 1 for d in ctx.attr(node, "dilations", (1, 1))):
        return None
    if ctx.attr(node, "storage_order", 0):
        return None
    kernel = pair(ctx.attr(node, "kernel_shape"))
    stride = pair(ctx.attr(node, "strides", (1, 1)))
    padding = onnx_pads(ctx, node, x_t.shape[2:], kernel, stride, (1, 1))
    if padding is None:
        return None
    if ctx.attr(node, "ceil_mode", 0):
        t, left, b, r = resolve_pads(padding, x_t.shape[2:], kernel, stride)
        spans = (x_t.shape[2] + t + b - kernel[0], x_t.shape[3] + left + r - kernel[1])
        if spans[0] % stride[0] or spans[1] % stride[1]:
            return None  # ceil mode changes the output size here: keep the ONNX op as is
    attrs: dict[str, Any] = dict(kernel=kernel, stride=stride, padding=padding)
    op = "max_pool2d"
    if node.op_type == "AveragePool":
        op = "avg_pool2d"
        attrs["count_include_pad"] = bool(ctx.attr(node, "count_include_pad", 0))
    return ctx.add(op, [x], **attrs)


@onnx_importer("GlobalAveragePool")
def _import_gap(ctx: OpImportContext, node: onnx.NodeProto) -> list[Value]:
    return ctx.add("global_avg_pool", ctx.inputs(node))


def _aten_pool_check(n: AtenCall) -> str | None:
    if any(d != 1 for d in n.args.get("dilation", [1, 1])) or n.args.get("ceil_mode"):
        return "dilated or ceil-mode pooling"
    if n.args.get("divisor_override") is not None:
        return "pooling with a divisor override"
    return None


def _aten_pair(v: Sequence[int] | int) -> tuple[int, int]:
    v = list(v) if not isinstance(v, int) else [v]
    return (v[0], v[-1])


def _aten_pool_attrs(a: dict[str, Any]) -> dict[str, Any]:
    kernel = _aten_pair(a["kernel_size"])
    stride = _aten_pair(a["stride"]) if a.get("stride") else kernel
    ph, pw = _aten_pair(a.get("padding", 0) or 0)
    return dict(kernel=kernel, stride=stride, padding=(ph, pw, ph, pw))


@aten_importer("max_pool2d_with_indices.default", check=_aten_pool_check)
def _aten_max_pool_indices(c: AtenBuilder, n: AtenCall) -> object:
    return (c.op("max_pool2d", c.value(n.args["self"]), **_aten_pool_attrs(n.args)), None)


@aten_importer("max_pool2d.default", check=_aten_pool_check)
def _aten_max_pool(c: AtenBuilder, n: AtenCall) -> object:
    return c.op("max_pool2d", c.value(n.args["self"]), **_aten_pool_attrs(n.args))


@aten_importer("avg_pool2d.default", check=_aten_pool_check)
def _aten_avg_pool(c: AtenBuilder, n: AtenCall) -> object:
    return c.op("avg_pool2d", c.value(n.args["self"]),
                count_include_pad=bool(n.args["count_include_pad"]), **_aten_pool_attrs(n.args))


def _aten_adaptive_check(n: AtenCall) -> str | None:
    return None if list(n.args["output_size"]) == [1, 1] else "adaptive pooling to more than 1x1"


@aten_importer("_adaptive_avg_pool2d.default", "adaptive_avg_pool2d.default",
               check=_aten_adaptive_check)
def _aten_adaptive(c: AtenBuilder, n: AtenCall) -> object:
    return c.op("global_avg_pool", c.value(n.args["self"]))
