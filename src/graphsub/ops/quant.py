"""Quantization: the operators of quantized models, with their exact integer semantics.

Three kinds of quantized model reach graphsub, and each writes its own operators:
onnxruntime's QDQ format (`QuantizeLinear` / `DequantizeLinear` around float operators, which
onnxruntime fuses into integer kernels at session time), its dynamic quantization
(`DynamicQuantizeLinear`, `MatMulInteger`, `ConvInteger`: activations quantized per run) and its
QOperator format (`QLinearMatMul`, `QLinearConv`: integer in, integer out), and 4-bit weights
(com.microsoft `MatMulNBits`). Modelling them, rather than leaving them opaque, gives the
reference evaluator and the torch backend their semantics, lets the rule check draw integer
operands, and lets rules move layout operators through a (de)quantization where that is exact
(graphsub.rules.library, quantization.rules).

The semantics are onnxruntime's, to the rounding: a value is quantized as
`saturate(round_half_even(x / scale) + zero_point)` with the division in float32 (MLAS
divides; it does not multiply by a reciprocal), integer products accumulate exactly in int32,
and a QLinear operator requantizes its accumulator with the float32 multiplier
`(a_scale * b_scale) / y_scale`, as onnxruntime computes it. All of them are kernels of their
own to fission (`Category.OPAQUE`): graphsub generates float kernels, not integer ones.

Forms outside these semantics stay opaque nodes run by onnxruntime (the importers return
None): blocked quantization (opset 21's `block_size`), 4-bit and float8 types, which numpy
lacks, float zero points of `MatMulNBits` and its `g_idx`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from onnx import TensorProto, helper

from graphsub.errors import ShapeError
from graphsub.tensors.symbolic import Dim, ceildiv
from graphsub.tensors.types import Attrs, TensorType
from graphsub.ops.base import (AttrSpec, CanonFn, Category, ExportFn, OpDef, OperandRole, Shape,
                               TorchFn, TorchLowering, Types, ints, is_float, norm_axis,
                               onnx_importer, pair, register, same_dim)
from graphsub.ops.conv import (conv2d_reference, onnx_conv_attrs, padding_attr, resolve_pads,
                               same_over_sizes, window_out)
from graphsub.ops.linalg import matmul_shape

from graphsub.ops.contexts import OpExportContext, OpImportContext
from graphsub.tensors.values import Value

if TYPE_CHECKING:
    import onnx


#: The integer types graphsub quantizes to, with their ranges.
QUANT_RANGES: dict[str, tuple[int, int]] = {
    "uint8": (0, 255), "int8": (-128, 127), "uint16": (0, 65535), "int16": (-32768, 32767)}
#: What a dequantization reads: the quantized types, and int32 (a QDQ bias).
DEQUANT_TYPES = (*QUANT_RANGES, "int32")
_EIGHT_BIT = ("uint8", "int8")
_SCALE_TYPES = ("float32", "float16")

#: What the rule check draws: a positive scalar scale, and 8-bit values and zero points.
_SCALE = OperandRole(shapes=((), (4,)), positive=True)  # per tensor, and per channel of 4


def _quant_axis_tries(shapes: Sequence[Shape], attrs: Mapping[str, Any]) -> tuple[int, ...]:
    """The default axis and the first (a per-channel scale runs along one of them); for a
    scalar scale the axis changes nothing, and a rule that moves it is caught where a
    scale is a vector."""
    return (1, 0) if shapes and len(shapes[0]) >= 2 else (0,)
_ZERO_POINT = OperandRole(shapes=((), (4,)), dtype="uint8")
_QUANTIZED = OperandRole(dtype="uint8")


# ---- shared pieces ----------------------------------------------------------------------------

def _per_axis(scale: TensorType) -> bool:
    """Whether a scale quantizes along an axis (a vector of several) rather than the whole
    tensor (a scalar, or a vector of one, which onnxruntime reads as a scalar)."""
    return scale.rank == 1 and scale.shape[0] != 1


def _check_params(op: str, x: TensorType, axis: int, scale: TensorType,
                  zero_point: TensorType | None) -> None:
    if not is_float(scale):
        raise ShapeError(f"{op}: the scale must be a float tensor, got {scale.dtype}")
    if scale.rank > 1:
        raise ShapeError(f"{op}: the scale must be a scalar or a vector, got {scale.shape}")
    if _per_axis(scale) and not same_dim(scale.shape[0], x.shape[axis]):
        raise ShapeError(f"{op}: {scale.shape[0]} scales for axis {axis} of size "
                         f"{x.shape[axis]}")
    if zero_point is not None and zero_point.shape != scale.shape \
            and not (zero_point.numel == 1 and scale.numel == 1):
        raise ShapeError(f"{op}: the zero point's shape {zero_point.shape} is not the scale's "
                         f"{scale.shape}")


def _axis_canon(op: str) -> CanonFn:
    def canon(values: dict[str, Any], ins: Types) -> dict[str, Any]:
        if len(ins) >= 2 and _per_axis(ins[1]):
            values["axis"] = norm_axis(values["axis"], ins[0].rank, op)
        else:
            values["axis"] = 0  # the whole tensor: the axis means nothing
        return values

    return canon


def _along(param: np.ndarray, axis: int, rank: int) -> np.ndarray:
    """A scale or zero point shaped to broadcast against a tensor of `rank`: a scalar for the
    whole tensor, a vector along `axis`."""
    if param.size == 1 or param.ndim == 0:
        return param.reshape(())
    shape = [1] * rank
    shape[axis] = param.size
    return param.reshape(shape)


def _saturate(values: np.ndarray, dtype: str) -> np.ndarray:
    lo, hi = QUANT_RANGES[dtype]
    return np.asarray(np.clip(values, lo, hi).astype(dtype))


def _quantize_values(x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | np.integer | int,
                     dtype: str) -> np.ndarray:
    """onnxruntime's quantization: round half to even of x / scale, divided in float32."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        q = np.rint(x.astype(np.float32) / scale.astype(np.float32))
    return _saturate(q.astype(np.float64) + np.asarray(zero_point, np.float64), dtype)


def _along_shape(param: TensorType, axis: int, rank: int) -> tuple[int, ...]:
    """The shape `_along` gives a scale or zero point of this type, for torch lowerings,
    which resolve every shape when the program is built."""
    if param.numel == 1:
        return ()
    shape = [1] * rank
    shape[axis] = param.numel
    return tuple(shape)


def _torch_saturate(t: TorchLowering, values: Any, dtype: str) -> Any:
    lo, hi = QUANT_RANGES[dtype]
    return values.clamp(lo, hi).to(t.dtype(dtype))


def _import_dtype(ctx: OpImportContext, node: onnx.NodeProto, zero_point_position: int
                  ) -> str | None:
    """The quantized type a node writes: its zero point's, else opset 21's `output_dtype`,
    else uint8."""
    names = list(node.input)
    if len(names) > zero_point_position and names[zero_point_position]:
        return ctx.type_of(ctx.value(names[zero_point_position])).dtype
    code = ctx.attr(node, "output_dtype", 0)
    return helper.tensor_dtype_to_np_dtype(code).name if code else "uint8"


def _slots(node: onnx.NodeProto) -> tuple[int, ...]:
    """The positions of the inputs a node gives (an optional input left out is '')."""
    return tuple(i for i, name in enumerate(node.input) if name)


def _placed(ins: Sequence[str], slots: Sequence[int]) -> list[str]:
    """Input names put back at their ONNX positions, '' where one was left out."""
    names = [""] * (max(slots) + 1)
    for name, slot in zip(ins, slots):
        names[slot] = name
    return names


# ---- QuantizeLinear ---------------------------------------------------------------------------

def _quantize_infer(attrs: Attrs, ins: Types) -> Types:
    x, scale = ins[0], ins[1]
    zero_point = ins[2] if len(ins) > 2 else None
    if not is_float(x):
        raise ShapeError(f"quantize: needs a float input, got {x.dtype}")
    if attrs["dtype"] not in QUANT_RANGES:  # a rule asking for int32 ended in a KeyError
        raise ShapeError(f"quantize: makes {', '.join(QUANT_RANGES)}, not {attrs['dtype']}")
    _check_params("quantize", x, attrs["axis"], scale, zero_point)
    if zero_point is not None and zero_point.dtype != attrs["dtype"]:
        raise ShapeError(f"quantize: the zero point is {zero_point.dtype}, the output "
                         f"{attrs['dtype']}")
    return (TensorType(x.shape, attrs["dtype"]),)


def _quantize_eval(attrs: Attrs, xs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    x, axis = xs[0], attrs["axis"]
    zero_point = _along(xs[2], axis, x.ndim) if len(xs) > 2 else 0
    return (_quantize_values(x, _along(xs[1], axis, x.ndim), zero_point, attrs["dtype"]),)


def _as_float32(ctx: OpExportContext, name: str, t: TensorType) -> str:
    """A float16 value cast to float32, for opsets before 19, whose (de)quantization takes
    float32 alone: exact, and onnxruntime computes in float32 anyway."""
    if t.dtype == "float32" or ctx.opset >= 19:
        return name
    out = ctx.fresh(f"{name}_f32")
    ctx.emit("Cast", [name], [out], to=TensorProto.FLOAT)
    return out


def _quantize_export(ctx: OpExportContext, attrs: Attrs, ins: list[str], outs: list[str],
                     types: Types) -> None:
    inputs = [_as_float32(ctx, n, t) for n, t in zip(ins[:2], types)] + list(ins[2:])
    if len(inputs) == 2 and attrs["dtype"] != "uint8":  # the type is the zero point's
        inputs.append(ctx.const(np.zeros(types[1].shape, attrs["dtype"]), "zero_point"))
    extra = {"axis": attrs["axis"]} if _per_axis(types[1]) else {}
    ctx.emit("QuantizeLinear", inputs, outs, **extra)


def _quantize_torch(t: TorchLowering, attrs: Attrs, ins: Types, outs: Types) -> TorchFn:
    shape, dtype = _along_shape(ins[1], attrs["axis"], ins[0].rank), attrs["dtype"]
    torch = t.torch

    def quantize(x: Any, scale: Any, zero_point: Any = None) -> tuple[Any, ...]:
        q = torch.round(x.float() / scale.reshape(shape).float())
        if zero_point is not None:
            q = q + zero_point.reshape(shape).float()
        return (_torch_saturate(t, q, dtype),)

    return quantize


register(OpDef(
    name="quantize", inputs=(2, 3), category=Category.OPAQUE,
    attrs=(AttrSpec("axis", 1, int, tries=_quant_axis_tries),
           AttrSpec("dtype", "uint8", str, tries=("uint8", "int8"))),
    roles=(OperandRole(), _SCALE, _ZERO_POINT),
    infer=_quantize_infer, evaluate=_quantize_eval, export=_quantize_export,
    torch=_quantize_torch, canonicalize=_axis_canon("quantize"),
    flops=lambda attrs, ins, outs: 2 * ins[0].numel,
    doc="QuantizeLinear: saturate(round_half_even(x / scale) + zero_point), per tensor or "
        "per axis; `dtype` is the integer type written (the zero point's).",
))


@onnx_importer("QuantizeLinear")
def _import_quantize(ctx: OpImportContext, node: onnx.NodeProto) -> list[Value] | None:
    if ctx.attr(node, "block_size", 0):
        return None  # blocked quantization: onnxruntime runs it
    dtype = _import_dtype(ctx, node, 2)
    ins = ctx.inputs(node)
    if dtype not in QUANT_RANGES or ctx.type_of(ins[1]).dtype not in _SCALE_TYPES:
        return None
    return ctx.add("quantize", ins, axis=ctx.attr(node, "axis", 1), dtype=dtype)


# ---- DequantizeLinear -------------------------------------------------------------------------

def _dequantize_infer(attrs: Attrs, ins: Types) -> Types:
    q, scale = ins[0], ins[1]
    zero_point = ins[2] if len(ins) > 2 else None
    if q.dtype not in DEQUANT_TYPES:
        raise ShapeError(f"dequantize: reads {', '.join(DEQUANT_TYPES)}, got {q.dtype}")
    _check_params("dequantize", q, attrs["axis"], scale, zero_point)
    if zero_point is not None and zero_point.dtype != q.dtype:
        raise ShapeError(f"dequantize: the zero point is {zero_point.dtype}, the input "
                         f"{q.dtype}")
    return (TensorType(q.shape, scale.dtype),)


def _dequantize_eval(attrs: Attrs, xs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    q, axis = xs[0], attrs["axis"]
    shifted = q.astype(np.int64)
    if len(xs) > 2:
        shifted = shifted - _along(xs[2], axis, q.ndim).astype(np.int64)
    scale = _along(xs[1], axis, q.ndim)
    # onnxruntime multiplies in float32; the integer is exact there, so one rounding
    return (np.asarray((shifted.astype(np.float32) * scale.astype(np.float32))
                       .astype(xs[1].dtype)),)


def _dequantize_export(ctx: OpExportContext, attrs: Attrs, ins: list[str], outs: list[str],
                       types: Types) -> None:
    extra = {"axis": attrs["axis"]} if _per_axis(types[1]) else {}
    scale = _as_float32(ctx, ins[1], types[1])
    if scale == ins[1]:
        ctx.emit("DequantizeLinear", ins, outs, **extra)
        return
    wide = ctx.fresh("dequantized_f32")
    ctx.emit("DequantizeLinear", [ins[0], scale, *ins[2:]], [wide], **extra)
    ctx.emit("Cast", [wide], outs, to=TensorProto.FLOAT16)


def _dequantize_torch(t: TorchLowering, attrs: Attrs, ins: Types, outs: Types) -> TorchFn:
    shape, out = _along_shape(ins[1], attrs["axis"], ins[0].rank), t.dtype(outs[0].dtype)

    def dequantize(q: Any, scale: Any, zero_point: Any = None) -> tuple[Any, ...]:
        shifted = q.to(t.torch.int32)
        if zero_point is not None:
            shifted = shifted - zero_point.reshape(shape).to(t.torch.int32)
        return ((shifted.float() * scale.reshape(shape).float()).to(out),)

    return dequantize


register(OpDef(
    name="dequantize", inputs=(2, 3), category=Category.OPAQUE,
    attrs=(AttrSpec("axis", 1, int, tries=_quant_axis_tries),),
    roles=(_QUANTIZED, _SCALE, _ZERO_POINT),
    infer=_dequantize_infer, evaluate=_dequantize_eval, export=_dequantize_export,
    torch=_dequantize_torch, canonicalize=_axis_canon("dequantize"),
    flops=lambda attrs, ins, outs: 2 * ins[0].numel,
    doc="DequantizeLinear: (q - zero_point) * scale in the scale's type, per tensor or per "
        "axis. Never folded into a float weight (ops.is_foldable).",
))


@onnx_importer("DequantizeLinear")
def _import_dequantize(ctx: OpImportContext, node: onnx.NodeProto) -> list[Value] | None:
    ins = ctx.inputs(node)
    if ctx.attr(node, "block_size", 0) or ctx.type_of(ins[0]).dtype not in DEQUANT_TYPES \
            or ctx.type_of(ins[1]).dtype not in _SCALE_TYPES:
        return None
    return ctx.add("dequantize", ins, axis=ctx.attr(node, "axis", 1))


# ---- DynamicQuantizeLinear --------------------------------------------------------------------

def _dynamic_infer(attrs: Attrs, ins: Types) -> Types:
    if ins[0].dtype != "float32":
        raise ShapeError(f"dynamic_quantize: needs a float32 input, got {ins[0].dtype}")
    return (TensorType(ins[0].shape, "uint8"), TensorType((), "float32"),
            TensorType((), "uint8"))


def _dynamic_eval(attrs: Attrs, xs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    """onnxruntime's DynamicQuantizeLinear: the range widened to hold 0, its scale over 255
    levels (1 where the range is empty), the zero point rounded from -min / scale."""
    x = xs[0].astype(np.float32)
    low = np.float32(min(float(x.min()) if x.size else 0.0, 0.0))
    high = np.float32(max(float(x.max()) if x.size else 0.0, 0.0))
    scale = np.float32(1.0) if high == low else np.float32((high - low) / np.float32(255))
    initial = np.float32(np.float32(0) - low / scale)
    zero_point = np.uint8(np.rint(np.clip(initial, np.float32(0), np.float32(255))))
    y = _quantize_values(x, np.array(scale), zero_point, "uint8")
    return y, np.array(scale, np.float32), np.array(zero_point, np.uint8)


def _dynamic_torch(t: TorchLowering, attrs: Attrs, ins: Types, outs: Types) -> TorchFn:
    torch = t.torch

    def dynamic_quantize(x: Any) -> tuple[Any, ...]:
        zero = x.new_zeros(())
        low, high = torch.minimum(x.min(), zero), torch.maximum(x.max(), zero)
        scale = torch.where(high == low, torch.ones_like(high), (high - low) / 255.0)
        zero_point = torch.round((0.0 - low / scale).clamp(0.0, 255.0))
        y = _torch_saturate(t, torch.round(x / scale) + zero_point, "uint8")
        return y, scale, zero_point.to(torch.uint8)

    return dynamic_quantize


register(OpDef(
    name="dynamic_quantize", inputs=(1, 1), category=Category.OPAQUE,
    infer=_dynamic_infer, evaluate=_dynamic_eval, torch=_dynamic_torch,
    export=lambda ctx, attrs, ins, outs, types: ctx.emit("DynamicQuantizeLinear", ins, outs),
    flops=lambda attrs, ins, outs: 4 * ins[0].numel,
    doc="DynamicQuantizeLinear: x quantized to uint8 with a scale and zero point computed from "
        "its range at run time; three outputs (values, scale, zero point).",
))


@onnx_importer("DynamicQuantizeLinear")
def _import_dynamic_quantize(ctx: OpImportContext, node: onnx.NodeProto) -> list[Value] | None:
    if not all(node.output):
        return None
    return ctx.add("dynamic_quantize", ctx.inputs(node))


# ---- integer products: MatMulInteger, ConvInteger ---------------------------------------------

def _integer_operands(op: str, a: TensorType, b: TensorType) -> None:
    for t in (a, b):
        if t.dtype not in _EIGHT_BIT:
            raise ShapeError(f"{op}: reads uint8 or int8, got {t.dtype}")


def _zero_points(attrs: Attrs, xs: Sequence[np.ndarray], first: int) -> tuple[Any, Any]:
    """The two zero points of an integer product (0 for one left out), from the inputs at
    ONNX positions `first` and `first + 1`."""
    by_slot = dict(zip(attrs["slots"], xs))
    return (by_slot.get(first, np.int64(0)), by_slot.get(first + 1, np.int64(0)))


def _check_slots(op: str, attrs: Attrs, ins: Types) -> None:
    slots = attrs["slots"]
    if len(ins) != len(slots) or tuple(slots[:2]) != (0, 1) or list(slots) != sorted(set(slots)):
        raise ShapeError(f"{op}: slots {slots} do not place {len(ins)} inputs in order, the "
                         "first two at 0 and 1")


def _matmul_integer_infer(attrs: Attrs, ins: Types) -> Types:
    _integer_operands("matmul_integer", ins[0], ins[1])
    _check_slots("matmul_integer", attrs, ins)
    return (TensorType(matmul_shape(ins[0].shape, ins[1].shape), "int32"),)


def _shifted(values: np.ndarray, zero_point: Any, column_axis: int | None = None) -> np.ndarray:
    zp = np.asarray(zero_point).astype(np.int64)
    if zp.ndim == 1 and zp.size > 1 and column_axis is not None:
        shape = [1] * values.ndim
        shape[column_axis] = zp.size
        zp = zp.reshape(shape)
    return values.astype(np.int64) - zp.reshape(zp.shape if zp.size > 1 else ())


def _matmul_integer_eval(attrs: Attrs, xs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    a_zp, b_zp = _zero_points(attrs, xs, 2)
    a = _shifted(xs[0], a_zp, xs[0].ndim - 2 if xs[0].ndim >= 2 else None)
    b = _shifted(xs[1], b_zp, xs[1].ndim - 1)
    return (np.asarray(np.matmul(a, b).astype(np.int32)),)


def _torch_shifted(t: TorchLowering, values: Any, zero_point: Any, shape: tuple[int, ...]
                   ) -> Any:
    """Integer operands as float64 (exact far beyond 8-bit products; CUDA has no integer
    matrix product), less their zero points (of `shape`: `_along_shape`)."""
    shifted = values.to(t.torch.float64)
    if zero_point is None:
        return shifted
    return shifted - zero_point.to(t.torch.float64).reshape(shape)


def _shape_of(types: Types, slots: Sequence[int], slot: int, axis: int, rank: int
              ) -> tuple[int, ...]:
    """The broadcast shape of the zero point at ONNX position `slot` (() where left out)."""
    return _along_shape(types[slots.index(slot)], axis, rank) if slot in slots else ()


def _matmul_integer_torch(t: TorchLowering, attrs: Attrs, ins: Types, outs: Types) -> TorchFn:
    slots, a_rank, b_rank = attrs["slots"], ins[0].rank, ins[1].rank
    a_shape = _shape_of(ins, slots, 2, a_rank - 2, a_rank)
    b_shape = _shape_of(ins, slots, 3, b_rank - 1, b_rank)
    torch = t.torch

    def matmul_integer(a: Any, b: Any, *zero_points: Any) -> tuple[Any, ...]:
        by_slot = dict(zip(slots[2:], zero_points))
        a_ = _torch_shifted(t, a, by_slot.get(2), a_shape)
        b_ = _torch_shifted(t, b, by_slot.get(3), b_shape)
        return (torch.matmul(a_, b_).to(torch.int32),)

    return matmul_integer


def _export_slots(onnx_type: str, **fixed: Any) -> ExportFn:
    def export(ctx: OpExportContext, attrs: Attrs, ins: list[str], outs: list[str],
               types: Types) -> None:
        extra = {k: fn(attrs, types) for k, fn in fixed.items()}
        ctx.emit(onnx_type, _placed(ins, attrs["slots"]), outs,
                 **{k: v for k, v in extra.items() if v is not None})

    return export


_SLOTS = AttrSpec("slots", (0, 1), ints)

register(OpDef(
    name="matmul_integer", inputs=(2, 4), category=Category.OPAQUE, attrs=(_SLOTS,),
    roles=(_QUANTIZED, _QUANTIZED, _ZERO_POINT, _ZERO_POINT),
    infer=_matmul_integer_infer, evaluate=_matmul_integer_eval, torch=_matmul_integer_torch,
    export=_export_slots("MatMulInteger"),
    flops=lambda attrs, ins, outs: 2 * outs[0].numel * ins[0].shape[-1],
    doc="MatMulInteger: (a - a_zero_point) @ (b - b_zero_point) accumulated exactly in int32; "
        "`slots` are the ONNX positions of the inputs given (a zero point may be left out).",
))


@onnx_importer("MatMulInteger")
def _import_matmul_integer(ctx: OpImportContext, node: onnx.NodeProto) -> list[Value] | None:
    ins = ctx.inputs(node)
    if ctx.type_of(ins[0]).rank < 2 or ctx.type_of(ins[1]).rank < 2:
        return None
    return ctx.add("matmul_integer", ins, slots=_slots(node))


def _conv_out_shape(op: str, attrs: Attrs, x: TensorType, w: TensorType) -> tuple[Dim, ...]:
    if x.rank != 4 or w.rank != 4:
        raise ShapeError(f"{op}: input and weight must be 4-D, got {x.shape} and {w.shape}")
    n, c, h, wd = x.shape
    cout, cin_g, kh, kw = w.shape
    if cin_g == 0 or c % cin_g or cout % (c // cin_g):
        raise ShapeError(f"{op}: {c} input channels do not fit the weight {w.shape}")
    (sh, sw), (dh, dw) = attrs["stride"], attrs["dilation"]
    if same_over_sizes(attrs["padding"], (h, wd), (sh, sw)):
        return (n, cout, ceildiv(h, sh), ceildiv(wd, sw))
    t, left, b, r = resolve_pads(attrs["padding"], (h, wd), (kh, kw), (sh, sw), (dh, dw))
    return (n, cout, window_out(h, kh, sh, dh, t, b, op), window_out(wd, kw, sw, dw, left, r, op))


def _integer_conv(attrs: Attrs, x: np.ndarray, w: np.ndarray, out_shape: Sequence[int]
                  ) -> np.ndarray:
    """The convolution of shifted integer operands, exactly (float64 holds every 8-bit
    product sum a real layer makes), padded with zeros of the shifted values, that is with
    the zero point, as ONNX specifies."""
    pads = resolve_pads(attrs["padding"], x.shape[2:], w.shape[2:], attrs["stride"],
                        attrs["dilation"])
    out = conv2d_reference(x.astype(np.float64), w.astype(np.float64), None, attrs["stride"],
                           pads, attrs["dilation"], tuple(out_shape[2:]))
    rounded: np.ndarray = np.rint(out)
    return rounded.astype(np.int64)


def _conv_integer_infer(attrs: Attrs, ins: Types) -> Types:
    _integer_operands("conv_integer", ins[0], ins[1])
    _check_slots("conv_integer", attrs, ins)
    return (TensorType(_conv_out_shape("conv_integer", attrs, ins[0], ins[1]), "int32"),)


def _conv_integer_eval(attrs: Attrs, xs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    x_zp, w_zp = _zero_points(attrs, xs, 2)
    x, w = _shifted(xs[0], x_zp, 1), _shifted(xs[1], w_zp, 0)
    out_shape = _conv_out_shape("conv_integer", attrs,
                                TensorType(x.shape, "uint8"), TensorType(w.shape, "uint8"))
    return (_integer_conv(attrs, x, w, out_shape).astype(np.int32),)


def _torch_conv(t: TorchLowering, attrs: Attrs, x_type: TensorType, w_type: TensorType
                ) -> Callable[[Any, Any], Any]:
    """conv2d of float64 operands with the node's stride, padding and dilation."""
    F = t.F
    groups = x_type.shape[1] // w_type.shape[1]
    stride, dilation = tuple(attrs["stride"]), tuple(attrs["dilation"])
    top, left, bottom, right = resolve_pads(attrs["padding"], x_type.shape[2:],
                                            w_type.shape[2:], stride, dilation)
    return lambda x, w: F.conv2d(F.pad(x, (left, right, top, bottom)), w, None, stride, 0,
                                 dilation, groups)


def _conv_integer_torch(t: TorchLowering, attrs: Attrs, ins: Types, outs: Types) -> TorchFn:
    slots, conv = attrs["slots"], _torch_conv(t, attrs, ins[0], ins[1])
    x_shape, w_shape = _shape_of(ins, slots, 2, 1, 4), _shape_of(ins, slots, 3, 0, 4)

    def conv_integer(x: Any, w: Any, *zero_points: Any) -> tuple[Any, ...]:
        by_slot = dict(zip(slots[2:], zero_points))
        out = conv(_torch_shifted(t, x, by_slot.get(2), x_shape),
                   _torch_shifted(t, w, by_slot.get(3), w_shape))
        return (t.torch.round(out).to(t.torch.int32),)

    return conv_integer


def _conv_onnx_attrs(attrs: Attrs, types: Types, x_at: int, w_at: int) -> dict[str, Any]:
    x, w = types[x_at], types[w_at]
    out: dict[str, Any] = dict(kernel_shape=list(w.shape[2:]), strides=list(attrs["stride"]),
                               dilations=list(attrs["dilation"]), group=x.shape[1] // w.shape[1])
    pads = resolve_pads(attrs["padding"], x.shape[2:], w.shape[2:], attrs["stride"],
                        attrs["dilation"])
    out["pads"] = list(pads)
    return out


def _conv_integer_export(ctx: OpExportContext, attrs: Attrs, ins: list[str], outs: list[str],
                         types: Types) -> None:
    ctx.emit("ConvInteger", _placed(ins, attrs["slots"]), outs,
             **_conv_onnx_attrs(attrs, types, 0, 1))


_CONV_ATTRS = (AttrSpec("stride", (1, 1), pair, tries=((1, 1), (2, 2))),
               AttrSpec("padding", (0, 0, 0, 0), padding_attr, tries=((0, 0, 0, 0), (1, 1, 1, 1))),
               AttrSpec("dilation", (1, 1), pair, tries=((1, 1), (2, 2))))

register(OpDef(
    name="conv_integer", inputs=(2, 4), category=Category.OPAQUE, attrs=(*_CONV_ATTRS, _SLOTS),
    roles=(_QUANTIZED, _QUANTIZED, _ZERO_POINT, _ZERO_POINT),
    infer=_conv_integer_infer, evaluate=_conv_integer_eval, torch=_conv_integer_torch,
    export=_conv_integer_export,
    flops=lambda attrs, ins, outs: 2 * outs[0].numel * ins[1].numel // max(ins[1].shape[0], 1),
    doc="ConvInteger: the 2-D convolution of (x - x_zero_point) and (w - w_zero_point), "
        "exactly, in int32.",
))


@onnx_importer("ConvInteger")
def _import_conv_integer(ctx: OpImportContext, node: onnx.NodeProto) -> list[Value] | None:
    ins = ctx.inputs(node)
    conv = onnx_conv_attrs(ctx, node, ctx.type_of(ins[0]), ctx.type_of(ins[1]))
    if conv is None:
        return None
    return ctx.add("conv_integer", ins, slots=_slots(node), **conv)


# ---- QLinearMatMul, QLinearConv ---------------------------------------------------------------

def _requantize(acc: np.ndarray, multiplier: np.ndarray, zero_point: np.ndarray,
                dtype: str) -> np.ndarray:
    """An int32 accumulator to the output's integer type, as MLAS does it: the accumulator
    as float32 times the float32 multiplier, rounded half to even, plus the zero point."""
    with np.errstate(over="ignore", invalid="ignore"):
        scaled = np.rint(acc.astype(np.float32) * multiplier.astype(np.float32))
    return _saturate(scaled.astype(np.float64) + np.asarray(zero_point, np.float64), dtype)


def _multiplier(in_scale: np.ndarray, weight_scale: np.ndarray, out_scale: np.ndarray
                ) -> np.ndarray:
    """(in_scale * weight_scale) / out_scale in float32, in onnxruntime's order."""
    product = np.float32(in_scale.reshape(())) * weight_scale.astype(np.float32)
    return (product / np.float32(out_scale.reshape(()))).astype(np.float32)


def _qlinear_matmul_infer(attrs: Attrs, ins: Types) -> Types:
    a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp = ins
    _integer_operands("qlinear_matmul", a, b)
    for zp, of in ((a_zp, a), (b_zp, b)):
        if zp.dtype != of.dtype:
            raise ShapeError(f"qlinear_matmul: a zero point is {zp.dtype}, its operand "
                             f"{of.dtype}")
    if y_zp.dtype not in _EIGHT_BIT:
        raise ShapeError(f"qlinear_matmul: writes uint8 or int8, got {y_zp.dtype}")
    if any(t.numel != 1 for t in (a_scale, a_zp, y_scale, y_zp)):
        raise ShapeError("qlinear_matmul: A and the output are quantized per tensor")
    for scale in (a_scale, b_scale, y_scale):
        if scale.dtype != "float32":
            raise ShapeError(f"qlinear_matmul: scales are float32, got {scale.dtype}")
    return (TensorType(matmul_shape(a.shape, b.shape), y_zp.dtype),)


def _qlinear_matmul_eval(attrs: Attrs, xs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp = xs
    acc = np.matmul(_shifted(a, a_zp), _shifted(b, b_zp, b.ndim - 1))
    multiplier = _multiplier(a_scale, b_scale.reshape(-1) if b_scale.size > 1 else b_scale,
                             y_scale)
    return (_requantize(acc, multiplier.reshape(multiplier.shape if multiplier.size > 1 else ()),
                        y_zp.reshape(()), str(y_zp.dtype)),)


def _torch_requantize(t: TorchLowering, acc: Any, multiplier: Any, zero_point: Any,
                      dtype: str) -> Any:
    scaled = t.torch.round(acc.to(t.torch.float32) * multiplier)
    return _torch_saturate(t, scaled + zero_point.reshape(()).float(), dtype)


def _torch_multiplier(t: TorchLowering, in_scale: Any, weight_scale: Any, out_scale: Any) -> Any:
    return (in_scale.reshape(()).float() * weight_scale.float()) / out_scale.reshape(()).float()


def _qlinear_matmul_torch(t: TorchLowering, attrs: Attrs, ins: Types, outs: Types) -> TorchFn:
    b_rank, dtype = ins[3].rank, outs[0].dtype
    b_zp_shape = _along_shape(ins[5], b_rank - 1, b_rank)
    b_scale_shape = (-1,) if ins[4].numel > 1 else ()
    torch = t.torch

    def qlinear_matmul(a: Any, a_scale: Any, a_zp: Any, b: Any, b_scale: Any, b_zp: Any,
                       y_scale: Any, y_zp: Any) -> tuple[Any, ...]:
        acc = torch.matmul(_torch_shifted(t, a, a_zp, ()), _torch_shifted(t, b, b_zp, b_zp_shape))
        multiplier = _torch_multiplier(t, a_scale, b_scale.reshape(b_scale_shape), y_scale)
        return (_torch_requantize(t, torch.round(acc), multiplier, y_zp, dtype),)

    return qlinear_matmul


register(OpDef(
    name="qlinear_matmul", inputs=(8, 8), category=Category.OPAQUE,
    roles=(_QUANTIZED, _SCALE, _ZERO_POINT, _QUANTIZED, _SCALE, _ZERO_POINT, _SCALE, _ZERO_POINT),
    infer=_qlinear_matmul_infer, evaluate=_qlinear_matmul_eval, torch=_qlinear_matmul_torch,
    export=lambda ctx, attrs, ins, outs, types: ctx.emit("QLinearMatMul", ins, outs),
    flops=lambda attrs, ins, outs: 2 * outs[0].numel * ins[0].shape[-1],
    doc="QLinearMatMul: the integer product of two quantized operands requantized to the "
        "output's scale and zero point.",
))


@onnx_importer("QLinearMatMul")
def _import_qlinear_matmul(ctx: OpImportContext, node: onnx.NodeProto) -> list[Value] | None:
    ins = ctx.inputs(node)
    if len(ins) != 8 or ctx.type_of(ins[0]).rank < 2 or ctx.type_of(ins[3]).rank < 2:
        return None
    return ctx.add("qlinear_matmul", ins)


def _qlinear_conv_infer(attrs: Attrs, ins: Types) -> Types:
    x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp = ins[:8]
    _integer_operands("qlinear_conv", x, w)
    if y_zp.dtype not in _EIGHT_BIT:
        raise ShapeError(f"qlinear_conv: writes uint8 or int8, got {y_zp.dtype}")
    shape = _conv_out_shape("qlinear_conv", attrs, x, w)
    if len(ins) > 8 and (ins[8].dtype != "int32" or ins[8].shape != (w.shape[0],)):
        raise ShapeError(f"qlinear_conv: the bias must be int32 of shape ({w.shape[0]},)")
    return (TensorType(shape, y_zp.dtype),)


def _qlinear_conv_eval(attrs: Attrs, xs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp = xs[:8]
    shifted_w = _shifted(w, w_zp, 0)
    shifted_x = _shifted(x, x_zp)
    shape = _conv_out_shape("qlinear_conv", attrs, TensorType(x.shape, "uint8"),
                            TensorType(w.shape, "uint8"))
    acc = _integer_conv(attrs, shifted_x, shifted_w, shape)
    if len(xs) > 8:
        acc = acc + xs[8].astype(np.int64).reshape(1, -1, 1, 1)
    multiplier = _multiplier(x_scale, w_scale.reshape(-1), y_scale)
    multiplier = multiplier.reshape(1, -1, 1, 1) if multiplier.size > 1 else multiplier.reshape(())
    return (_requantize(acc, multiplier, y_zp.reshape(()), str(y_zp.dtype)),)


def _qlinear_conv_torch(t: TorchLowering, attrs: Attrs, ins: Types, outs: Types) -> TorchFn:
    conv, dtype = _torch_conv(t, attrs, ins[0], ins[3]), outs[0].dtype
    w_zp_shape = _along_shape(ins[5], 0, 4)
    per_channel = (1, -1, 1, 1) if ins[4].numel > 1 else ()
    torch = t.torch

    def qlinear_conv(x: Any, x_scale: Any, x_zp: Any, w: Any, w_scale: Any, w_zp: Any,
                     y_scale: Any, y_zp: Any, bias: Any = None) -> tuple[Any, ...]:
        acc = torch.round(conv(_torch_shifted(t, x, x_zp, ()),
                               _torch_shifted(t, w, w_zp, w_zp_shape)))
        if bias is not None:
            acc = acc + bias.to(torch.float64).reshape(1, -1, 1, 1)
        multiplier = _torch_multiplier(t, x_scale, w_scale.reshape(-1), y_scale)
        multiplier = multiplier.reshape(per_channel)
        return (_torch_requantize(t, acc, multiplier, y_zp, dtype),)

    return qlinear_conv


register(OpDef(
    name="qlinear_conv", inputs=(8, 9), category=Category.OPAQUE, attrs=_CONV_ATTRS,
    roles=(_QUANTIZED, _SCALE, _ZERO_POINT, _QUANTIZED, _SCALE, _ZERO_POINT, _SCALE, _ZERO_POINT),
    infer=_qlinear_conv_infer, evaluate=_qlinear_conv_eval, torch=_qlinear_conv_torch,
    export=lambda ctx, attrs, ins, outs, types: ctx.emit(
        "QLinearConv", ins, outs, **_conv_onnx_attrs(attrs, types, 0, 3)),
    flops=lambda attrs, ins, outs: 2 * outs[0].numel * ins[3].numel // max(ins[3].shape[0], 1),
    doc="QLinearConv: the integer 2-D convolution of quantized input and weights (weights per "
        "output channel or per tensor), plus an int32 bias, requantized to the output's scale "
        "and zero point.",
))


@onnx_importer("QLinearConv")
def _import_qlinear_conv(ctx: OpImportContext, node: onnx.NodeProto) -> list[Value] | None:
    ins = ctx.inputs(node)
    if len(ins) != len(node.input) or len(ins) < 8:
        return None
    conv = onnx_conv_attrs(ctx, node, ctx.type_of(ins[0]), ctx.type_of(ins[3]))
    if conv is None:
        return None
    return ctx.add("qlinear_conv", ins, **conv)


# ---- MatMulNBits (com.microsoft) -------------------------------------------------------------

def _unpack(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """The `count` unsigned `bits`-bit values of each row of packed bytes, lowest bits first,
    as onnxruntime packs them."""
    per_byte = 8 // bits
    shifts = np.arange(per_byte, dtype=np.uint8) * bits
    values = (packed[..., None] >> shifts) & np.uint8((1 << bits) - 1)
    return values.reshape(*packed.shape[:-1], -1)[..., :count]


def _nbits_blocks(attrs: Attrs) -> int:
    blocks: int = -(-attrs["K"] // attrs["block_size"])
    return blocks


def _nbits_weight(attrs: Attrs, packed: np.ndarray, scales: np.ndarray,
                  zero_points: np.ndarray | None) -> np.ndarray:
    """The (N, K) float64 weight a MatMulNBits node's packed weight, scales and packed zero
    points stand for."""
    n, bits, block = attrs["N"], attrs["bits"], attrs["block_size"]
    blocks = _nbits_blocks(attrs)
    q = _unpack(packed.reshape(n, blocks, -1), bits, block).astype(np.int64)
    if zero_points is None:
        zp = np.full((n, blocks), 1 << (bits - 1), np.int64)
    else:
        zp = _unpack(zero_points.reshape(n, -1), bits, blocks).astype(np.int64)
    w = (q - zp[:, :, None]) * scales.astype(np.float64).reshape(n, blocks)[:, :, None]
    return w.reshape(n, blocks * block)[:, :attrs["K"]]


def _nbits_inputs(attrs: Attrs, xs: Sequence[Any]) -> dict[str, Any]:
    names = ("a", "b", "scales", "zero_points", "g_idx", "bias")
    return {names[slot]: x for slot, x in zip(attrs["slots"], xs)}


def _nbits_infer(attrs: Attrs, ins: Types) -> Types:
    _check_slots("matmul_nbits", attrs, ins)
    given = _nbits_inputs(attrs, ins)
    if "scales" not in given:
        raise ShapeError("matmul_nbits: the scales (input 2) are required")
    a = given["a"]
    if a.dtype not in _SCALE_TYPES or a.rank < 1 or not _same(a.shape[-1], attrs["K"]):
        raise ShapeError(f"matmul_nbits: A must be float with {attrs['K']} columns, got "
                         f"{a.dtype} {a.shape}")
    if attrs["bits"] not in (2, 4, 8) or "g_idx" in given:
        raise ShapeError("matmul_nbits: models 2-, 4- and 8-bit weights without g_idx")
    if given["b"].dtype != "uint8" or given["b"].numel != \
            attrs["N"] * _nbits_blocks(attrs) * attrs["block_size"] * attrs["bits"] // 8:
        raise ShapeError(f"matmul_nbits: the packed weight {given['b'].shape} does not hold "
                         f"{attrs['N']} x {attrs['K']} {attrs['bits']}-bit values")
    if "zero_points" in given and given["zero_points"].dtype != "uint8":
        raise ShapeError("matmul_nbits: models packed uint8 zero points only")
    return (TensorType(a.shape[:-1] + (attrs["N"],), a.dtype),)


def _same(a: Dim, b: int) -> bool:
    return type(a) is int and a == b


def _nbits_eval(attrs: Attrs, xs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    given = _nbits_inputs(attrs, xs)
    w = _nbits_weight(attrs, given["b"], given["scales"], given.get("zero_points"))
    y = np.matmul(given["a"].astype(np.float64), w.T)
    if "bias" in given:
        y = y + given["bias"].astype(np.float64)
    return (np.asarray(y.astype(given["a"].dtype)),)


def _nbits_torch(t: TorchLowering, attrs: Attrs, ins: Types, outs: Types) -> TorchFn:
    torch = t.torch
    n, bits, block, k = attrs["N"], attrs["bits"], attrs["block_size"], attrs["K"]
    blocks, mask, per_byte = _nbits_blocks(attrs), (1 << bits) - 1, 8 // bits

    def unpack(packed: Any, shape: tuple[int, ...], count: int) -> Any:
        """`packed` as `shape` bytes, each split into its values, the last axis cut to
        `count` (every shape fixed here: the program is traced)."""
        shifts = torch.arange(per_byte, device=packed.device, dtype=torch.int32) * bits
        values = (packed.reshape(shape).to(torch.int32)[..., None] >> shifts) & mask
        return values.reshape(*shape[:-1], shape[-1] * per_byte)[..., :count]

    b_bytes = block * bits // 8
    zp_bytes = -(-blocks * bits // 8)

    def matmul_nbits(*xs: Any) -> tuple[Any, ...]:
        given = _nbits_inputs(attrs, xs)
        q = unpack(given["b"], (n, blocks, b_bytes), block)
        if "zero_points" in given:
            zp = unpack(given["zero_points"], (n, zp_bytes), blocks)
        else:
            zp = torch.full((n, blocks), 1 << (bits - 1), dtype=torch.int32, device=q.device)
        scales = given["scales"].to(torch.float32).reshape(n, blocks)
        w = ((q - zp[:, :, None]).to(torch.float32) * scales[:, :, None]).reshape(n, -1)[:, :k]
        a = given["a"]
        y = torch.matmul(a.to(torch.float32), w.T)
        if "bias" in given:
            y = y + given["bias"].to(torch.float32)
        return (y.to(a.dtype),)

    return matmul_nbits


def _nbits_export(ctx: OpExportContext, attrs: Attrs, ins: list[str], outs: list[str],
                  types: Types) -> None:
    ctx.emit("MatMulNBits", _placed(ins, attrs["slots"]), outs, domain="com.microsoft",
             K=attrs["K"], N=attrs["N"], bits=attrs["bits"], block_size=attrs["block_size"],
             **({"accuracy_level": attrs["accuracy_level"]} if attrs["accuracy_level"] else {}))


register(OpDef(
    name="matmul_nbits", inputs=(3, 6), category=Category.OPAQUE,
    attrs=(AttrSpec("K", 1, int), AttrSpec("N", 1, int), AttrSpec("bits", 4, int),
           AttrSpec("block_size", 32, int), AttrSpec("accuracy_level", 0, int, tries=(0, 4)),
           AttrSpec("slots", (0, 1, 2), ints)),
    infer=_nbits_infer, evaluate=_nbits_eval, torch=_nbits_torch, export=_nbits_export,
    flops=lambda attrs, ins, outs: 2 * outs[0].numel * attrs["K"],
    doc="com.microsoft MatMulNBits: A @ W^T (+ bias) where W is N x K weights of 2, 4 or 8 "
        "bits in blocks along K, each block with its scale and packed zero point (the middle "
        "of the range when none is given). `accuracy_level` lets onnxruntime quantize A too "
        "(level 4), which the reference does not: such a node agrees with it to within A's "
        "int8 rounding.",
))


@onnx_importer("com.microsoft.MatMulNBits")
def _import_matmul_nbits(ctx: OpImportContext, node: onnx.NodeProto) -> list[Value] | None:
    slots = _slots(node)
    ins = ctx.inputs(node)
    if 4 in slots or (3 in slots and ctx.type_of(ins[slots.index(3)]).dtype != "uint8"):
        return None  # g_idx, or float zero points: onnxruntime runs it
    return ctx.add("matmul_nbits", ins, slots=slots,
                   **{name: ctx.attr(node, name, default) for name, default in (
                       ("K", None), ("N", None), ("bits", 4), ("block_size", None),
                       ("accuracy_level", 0))})
