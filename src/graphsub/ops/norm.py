"""Normalizations: softmax, layer, RMS and (inference) batch normalization.

These are the coarse operators that operator fission splits into primitives later on; here
they are defined once, with ONNX export that falls back to primitives where the target opset
lacks the fused op (LayerNormalization arrived in opset 17, RMSNormalization in 23).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from graphsub.errors import ConversionError, ShapeError
from graphsub.tensors.types import Attrs, TensorType
from graphsub.ops.base import (AXIS_TRIES, AtenBuilder, AtenCall, AtenImportFn, AttrSpec, CanonFn,
                               Category, ExportFn, InferFn, LowerFn, OpDef, OperandRole, TorchFn,
                               TorchLowering, Types, aten_importer, broadcasts_to, f32, norm_axis,
                               onnx_importer, is_float, register)

from graphsub.ops.contexts import OpExportContext, OpImportContext
from graphsub.tensors.values import Value

if TYPE_CHECKING:
    import onnx


#: A normalization's axis, and its scale and bias where the rule check draws them: vectors.
_AXIS = AttrSpec("axis", -1, int, tries=AXIS_TRIES)
#: A model's epsilon and one large enough to change every output: a rule that drops or
#: moves an epsilon differs there.
EPSILON_TRIES = (1e-5, 0.5)
_VECTOR = OperandRole(shapes=((4,), (6,)))


def _axis_canon(op: str) -> CanonFn:
    def canon(values: dict[str, Any], ins: Types) -> dict[str, Any]:
        values["axis"] = norm_axis(values["axis"], ins[0].rank, op)
        return values

    return canon


def _float_same(op: str) -> InferFn:
    def infer(attrs: Attrs, ins: Types) -> Types:
        if not is_float(ins[0]):
            raise ShapeError(f"{op}: needs a floating-point input, got {ins[0].dtype}")
        return (ins[0],)

    return infer


def _softmax(attrs: Attrs, xs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    x = xs[0].astype(np.float64)
    with np.errstate(invalid="ignore"):  # a row of -inf (fully masked) is NaN, as in ONNX
        e = np.exp(x - x.max(axis=attrs["axis"], keepdims=True))
        return ((e / e.sum(axis=attrs["axis"], keepdims=True)).astype(xs[0].dtype),)


def _log_softmax(attrs: Attrs, xs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    # Shifted by the maximum, as every stable kernel does: exp never overflows, and the
    # largest entry's term is exactly 1, so the log never sees 0.
    x = xs[0].astype(np.float64)
    shifted = x - x.max(axis=attrs["axis"], keepdims=True)
    return ((shifted - np.log(np.exp(shifted).sum(axis=attrs["axis"], keepdims=True)))
            .astype(xs[0].dtype),)


def _along_axis(name: str) -> LowerFn:
    """The lowering of `torch.<name>(x, axis)`."""
    def lower(t: TorchLowering, attrs: Attrs, ins: Types, outs: Types) -> TorchFn:
        axis, fn = attrs["axis"], getattr(t.torch, name)
        return lambda x: (fn(x, axis),)

    return lower


def _export_along_axis(onnx_type: str) -> ExportFn:
    """The export of an ONNX operator along one axis (`onnx_type`, its `axis` attribute)."""
    def export(ctx: OpExportContext, attrs: Attrs, ins: list[str], outs: list[str],
               types: Types) -> None:
        ctx.emit(onnx_type, ins, outs, axis=attrs["axis"])

    return export


#: graphsub op -> (ONNX op, numpy semantics, doc): normalizations along one axis.
_SOFTMAXES = {
    "softmax": ("Softmax", _softmax, "Softmax along one axis."),
    "log_softmax": ("LogSoftmax", _log_softmax,
                    "The logarithm of softmax along one axis, computed stably."),
}

for _name, (_onnx_type, _evaluate, _doc) in _SOFTMAXES.items():
    register(OpDef(
        name=_name, inputs=(1, 1), attrs=(_AXIS,), category=Category.COARSE,
        infer=_float_same(_name), evaluate=_evaluate, torch=_along_axis(_name),
        export=_export_along_axis(_onnx_type),
        canonicalize=_axis_canon(_name),
        flops=lambda attrs, ins, outs: 5 * ins[0].numel,
        doc=f"{_doc} (ONNX {_onnx_type})",
    ))


@onnx_importer(*(onnx_type for onnx_type, _, _ in _SOFTMAXES.values()))
def _import_softmax(ctx: OpImportContext, node: onnx.NodeProto) -> list[Value]:
    name = {onnx_type: name for name, (onnx_type, _, _) in _SOFTMAXES.items()}[node.op_type]
    return ctx.add(name, ctx.inputs(node), axis=ctx.attr(node, "axis", -1))


# ---- softmax with the exporters' NaN guard ----------------------------------------------------

def _guarded_softmax(attrs: Attrs, xs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    (y,) = _softmax(attrs, xs)
    return (np.where(np.isnan(y), np.zeros((), y.dtype), y),)


def _export_guarded_softmax(ctx: OpExportContext, attrs: Attrs, ins: list[str], outs: list[str],
                            types: Types) -> None:
    probs, nan = ctx.fresh("softmax"), ctx.fresh("isnan")
    ctx.emit("Softmax", ins, [probs], axis=attrs["axis"])
    ctx.emit("IsNaN", [probs], [nan])
    ctx.emit("Where", [nan, ctx.const(np.array(0, types[0].dtype)), probs], outs)


def _torch_guarded_softmax(t: TorchLowering, attrs: Attrs, ins: Types, outs: Types) -> TorchFn:
    axis = attrs["axis"]  # a softmax is never infinite: only its NaNs change
    return lambda x: (t.torch.softmax(x, axis).nan_to_num(0.0),)


register(OpDef(
    name="guarded_softmax", inputs=(1, 1), attrs=(_AXIS,), category=Category.OPAQUE,
    infer=_float_same("guarded_softmax"), evaluate=_guarded_softmax,
    torch=_torch_guarded_softmax, export=_export_guarded_softmax,
    canonicalize=_axis_canon("guarded_softmax"),
    flops=lambda attrs, ins, outs: 6 * ins[0].numel,
    # The softmax's pass, then the guard's two as libraries run them: IsNaN reads the
    # probabilities and writes a boolean mask, Where reads both and writes the result.
    bytes=lambda attrs, ins, outs: 5 * ins[0].nbytes + 2 * ins[0].numel,
    doc="Softmax whose NaNs become zeros: Where(IsNaN(p), 0, p) after Softmax, the guard the "
        "dynamo exporter writes after attention's softmax so that a fully masked query (a row "
        "of -inf scores, whose softmax is NaN) gives zeros, as torch's attention does. Its own "
        "operator, so that no softmax rule drops the guard; the rule "
        "softmax-guard-unneeded drops it where a constant mask leaves every row a score.",
))


# ---- layer normalization ----------------------------------------------------------------------

def _normalized_infer(op: str) -> InferFn:
    """Shape inference of a normalization over the axes from `axis` on, whose scale (and
    shift) must broadcast to the normalized shape."""
    def infer(attrs: Attrs, ins: Types) -> Types:
        x = _float_same(op)(attrs, ins)[0]
        norm_shape = x.shape[attrs["axis"]:]
        for name, t in zip(("scale", "bias"), ins[1:]):
            if not broadcasts_to(t.shape, norm_shape):
                raise ShapeError(f"{op}: {name} of shape {t.shape} does not broadcast to the "
                                 f"normalized shape {norm_shape}")
        return (x,)

    return infer


def _ln_eval(attrs: Attrs, xs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    x = xs[0].astype(np.float64)
    axes = tuple(range(attrs["axis"], x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    y = (x - mean) / np.sqrt(var + attrs["epsilon"]) * xs[1]
    if len(xs) > 2:
        y = y + xs[2]
    return (y.astype(xs[0].dtype),)


def _emit_mean(ctx: OpExportContext, x: str, axes: list[int]) -> str:
    """ReduceMean over `axes`, keeping them (axes an input from opset 18)."""
    out = ctx.fresh("mean")
    if ctx.opset >= 18:
        ctx.emit("ReduceMean", [x, ctx.const(np.array(axes, dtype=np.int64))], [out], keepdims=1)
    else:
        ctx.emit("ReduceMean", [x], [out], axes=axes, keepdims=1)
    return out


def _emit_scaled_by_rms(ctx: OpExportContext, attrs: Attrs, x: str, ins: list[str], outs: list[str],
                        types: Types) -> None:
    """x / sqrt(mean(x * x) + eps) * scale (+ shift): the primitives a layer norm (x centred)
    and an RMS norm (x as it is) are written as where the opset lacks their operator."""
    axes = list(range(attrs["axis"], types[0].rank))
    sq, shifted, std, normed = (ctx.fresh("norm") for _ in range(4))
    ctx.emit("Mul", [x, x], [sq])
    eps = ctx.const(np.array(attrs["epsilon"], dtype=types[0].dtype))
    ctx.emit("Add", [_emit_mean(ctx, sq, axes), eps], [shifted])
    ctx.emit("Sqrt", [shifted], [std])
    ctx.emit("Div", [x, std], [normed])
    if len(ins) > 2:
        scaled = ctx.fresh("norm")
        ctx.emit("Mul", [normed, ins[1]], [scaled])
        ctx.emit("Add", [scaled, ins[2]], outs)
    else:
        ctx.emit("Mul", [normed, ins[1]], outs)


def _ln_export(ctx: OpExportContext, attrs: Attrs, ins: list[str], outs: list[str],
               types: Types) -> None:
    if ctx.opset >= 17:
        ctx.emit("LayerNormalization", ins, outs, axis=attrs["axis"], epsilon=attrs["epsilon"])
        return
    centered = ctx.fresh("ln")
    ctx.emit("Sub", [ins[0], _emit_mean(ctx, ins[0], list(range(attrs["axis"], types[0].rank)))],
             [centered])
    _emit_scaled_by_rms(ctx, attrs, centered, ins, outs, types)


def _fitting(norm_shape: tuple[int, ...], t: TensorType) -> Callable[[Any], Any]:
    """How a scale or shift of type `t` becomes what torch's norms want, a tensor of exactly
    the normalized shape (ours may broadcast to it); decided from the type, ahead of the run."""
    if t.shape == norm_shape:
        return lambda v: v
    return lambda v: v.expand(norm_shape).contiguous()


def _ln_torch(t: TorchLowering, attrs: Attrs, ins: Types, outs: Types) -> TorchFn:
    norm_shape = tuple(ins[0].shape[attrs["axis"]:])
    eps, layer_norm_ = attrs["epsilon"], t.F.layer_norm
    fit = [_fitting(norm_shape, p) for p in ins[1:]]

    def layer_norm(x: Any, scale: Any, bias: Any = None) -> tuple[Any, ...]:
        bias = fit[1](bias) if bias is not None else None
        return (layer_norm_(x, norm_shape, fit[0](scale), bias, eps),)

    return layer_norm


register(OpDef(
    name="layer_norm", inputs=(2, 3), category=Category.COARSE,
    roles=(OperandRole(), _VECTOR, _VECTOR),
    attrs=(_AXIS, AttrSpec("epsilon", 1e-5, f32, tries=EPSILON_TRIES)),
    infer=_normalized_infer("layer_norm"), evaluate=_ln_eval, export=_ln_export, torch=_ln_torch,
    canonicalize=_axis_canon("layer_norm"),
    flops=lambda attrs, ins, outs: 8 * ins[0].numel,
    doc="Normalize over the axes from `axis` on, then scale (and shift).",
))


@onnx_importer("LayerNormalization")
def _import_layer_norm(ctx: OpImportContext, node: onnx.NodeProto) -> list[Value] | None:
    if any(ctx.is_used(o) for o in node.output[1:]):
        return None  # mean / inverse-std outputs are not modelled
    if ctx.attr(node, "stash_type", 1) != 1:
        return None
    return ctx.add("layer_norm", ctx.inputs(node), axis=ctx.attr(node, "axis", -1),
                   epsilon=ctx.attr(node, "epsilon", 1e-5))


# ---- RMS normalization ----------------------------------------------------------------------

def _rms_eval(attrs: Attrs, xs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    x = xs[0].astype(np.float64)
    axes = tuple(range(attrs["axis"], x.ndim))
    y = x / np.sqrt((x * x).mean(axis=axes, keepdims=True) + attrs["epsilon"]) * xs[1]
    return (y.astype(xs[0].dtype),)


def _rms_export(ctx: OpExportContext, attrs: Attrs, ins: list[str], outs: list[str],
                types: Types) -> None:
    if ctx.opset >= 23:
        ctx.emit("RMSNormalization", ins, outs, axis=attrs["axis"], epsilon=attrs["epsilon"])
        return
    _emit_scaled_by_rms(ctx, attrs, ins[0], ins, outs, types)


def _rms_torch(t: TorchLowering, attrs: Attrs, ins: Types, outs: Types) -> TorchFn:
    norm_shape = tuple(ins[0].shape[attrs["axis"]:])
    eps, rms_norm_, fit = attrs["epsilon"], t.F.rms_norm, _fitting(norm_shape, ins[1])
    return lambda x, scale: (rms_norm_(x, norm_shape, fit(scale), eps),)


register(OpDef(
    name="rms_norm", inputs=(2, 2), category=Category.COARSE, roles=(OperandRole(), _VECTOR),
    attrs=(_AXIS, AttrSpec("epsilon", 1e-5, f32, tries=EPSILON_TRIES)),
    infer=_normalized_infer("rms_norm"), evaluate=_rms_eval, export=_rms_export, torch=_rms_torch,
    canonicalize=_axis_canon("rms_norm"),
    flops=lambda attrs, ins, outs: 4 * ins[0].numel,
    doc="Divide by the root mean square over the axes from `axis` on (plus epsilon), then "
        "scale (ONNX RMSNormalization, opset 23; primitives before).",
))


@onnx_importer("RMSNormalization")
def _import_rms_norm(ctx: OpImportContext, node: onnx.NodeProto) -> list[Value] | None:
    if ctx.attr(node, "stash_type", 1) != 1:
        return None
    return ctx.add("rms_norm", ctx.inputs(node), axis=ctx.attr(node, "axis", -1),
                   epsilon=ctx.attr(node, "epsilon", 1e-5))


# ---- batch normalization (inference) --------------------------------------------------------

def _bn_infer(attrs: Attrs, ins: Types) -> Types:
    x = _float_same("batch_norm")(attrs, ins)[0]
    if x.rank < 2:
        raise ShapeError(f"batch_norm: input must be N x C x ..., got {x.shape}")
    for name, t in zip(("scale", "bias", "mean", "var"), ins[1:]):
        if t.shape != (x.shape[1],):
            raise ShapeError(f"batch_norm: {name} must have shape ({x.shape[1]},), got {t.shape}")
    return (x,)


def _bn_eval(attrs: Attrs, xs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    x, scale, bias, mean, var = xs
    shape = (1, -1) + (1,) * (x.ndim - 2)
    inv = scale.astype(np.float64) / np.sqrt(var.astype(np.float64) + attrs["epsilon"])
    y = (x - mean.reshape(shape)) * inv.reshape(shape) + bias.reshape(shape)
    return (y.astype(x.dtype),)


def _bn_torch(t: TorchLowering, attrs: Attrs, ins: Types, outs: Types) -> TorchFn:
    eps, batch_norm = attrs["epsilon"], t.F.batch_norm
    return lambda x, scale, bias, mean, var: (
        batch_norm(x, mean, var, scale, bias, False, 0.0, eps),)


register(OpDef(
    name="batch_norm", inputs=(5, 5), attrs=(AttrSpec("epsilon", 1e-5, f32, tries=EPSILON_TRIES),),
    category=Category.COARSE,
    # Per-channel vectors, positive variances.
    roles=(OperandRole(shapes=((1, 4, 6, 6), (1, 8, 6, 6))),
           *[OperandRole(shapes=((4,), (8,)))] * 3,
           OperandRole(shapes=((4,), (8,)), positive=True)),
    infer=_bn_infer, evaluate=_bn_eval, torch=_bn_torch,
    export=lambda ctx, attrs, ins, outs, types: ctx.emit("BatchNormalization", ins, outs,
                                                         epsilon=attrs["epsilon"]),
    flops=lambda attrs, ins, outs: 2 * ins[0].numel,
    doc="Inference batch normalization: inputs x, scale, bias, running mean, running var.",
))


@onnx_importer("BatchNormalization")
def _import_batch_norm(ctx: OpImportContext, node: onnx.NodeProto) -> list[Value] | None:
    if ctx.attr(node, "training_mode", 0) or any(ctx.is_used(o) for o in node.output[1:]):
        return None
    return ctx.add("batch_norm", ctx.inputs(node), epsilon=ctx.attr(node, "epsilon", 1e-5))


# ---- ATen import (torch.compile) -----------------------------------------------------------

def _aten_along_axis(ours: str) -> tuple[AtenImportFn, AtenImportFn]:
    """The importers of aten._<op>.default and aten.<op>.int. Both may compute in another
    precision than their input's: CUDA's `_softmax(x, dim, half_to_float=True)` (what a
    float16 `softmax(x, dtype=float32)` becomes there) and `.int`'s `dtype` cast the input
    first, which is how graphsub writes it, so that the attention rules see the same graph
    on every device."""
    def direct(c: AtenBuilder, n: AtenCall) -> object:
        x = c.value(n.args["self"])
        if n.args.get("half_to_float"):
            x = c.op("cast", x, to="float32")
        return c.op(ours, x, axis=n.args["dim"])

    return direct, _with_dtype(ours)


def _with_dtype(ours: str) -> AtenImportFn:
    """The importer of an ATen softmax taking a `dtype` to compute in (a cast first)."""
    def importer(c: AtenBuilder, n: AtenCall) -> object:
        x = c.value(n.args["self"])
        dtype = n.args.get("dtype")
        if dtype is not None:
            name = c.dtype_name(dtype)
            if name is None:
                raise ConversionError(f"{ours} in {dtype}")
            x = c.op("cast", x, to=name)
        return c.op(ours, x, axis=n.args["dim"])

    return importer


for _name in _SOFTMAXES:
    _direct, _with = _aten_along_axis(_name)
    aten_importer(f"_{_name}.default")(_direct)
    aten_importer(f"{_name}.int")(_with)

#: torch's reference attention path (what scaled_dot_product_attention traces to where no
#: fused kernel takes the inputs): a softmax whose rows of -inf alone give zeros. That is the
#: guarded softmax wherever the scores are numbers (they differ only on a NaN score: NaN
#: there, zero here), and the attention rules read it as attention's.
aten_importer("_safe_softmax.default")(_with_dtype("guarded_softmax"))


def _filled(c: AtenBuilder, shape: Sequence[int], fill: float, like: object) -> object:
    return c.weight(np.full(tuple(shape), fill, dtype=c.dtype(like)))


@aten_importer("native_layer_norm.default")
def _aten_layer_norm(c: AtenBuilder, n: AtenCall) -> object:
    a = n.args
    x = c.value(a["input"])
    shape = tuple(a["normalized_shape"])
    w = c.value(a["weight"]) if a["weight"] is not None else _filled(c, shape, 1.0, x)
    args = [x, w] + ([c.value(a["bias"])] if a["bias"] is not None else [])
    y = c.op("layer_norm", *args, axis=-len(shape), epsilon=float(a["eps"]))
    return (y, None, None)  # mean and inverse std are not modelled


def _aten_bn_check(n: AtenCall) -> str | None:
    return "training-mode batch norm" if n.args.get("training") else None


@aten_importer("native_batch_norm.default", "_native_batch_norm_legit_no_training.default",
               check=_aten_bn_check)
def _aten_batch_norm(c: AtenBuilder, n: AtenCall) -> object:
    a = n.args
    x = c.value(a["input"])
    channels = (c.shape(x)[1],)
    w = c.value(a["weight"]) if a["weight"] is not None else _filled(c, channels, 1.0, x)
    bias = c.value(a["bias"]) if a["bias"] is not None else _filled(c, channels, 0.0, x)
    y = c.op("batch_norm", x, w, bias, c.value(a["running_mean"]), c.value(a["running_var"]),
             epsilon=float(a["eps"]))
    return (y, None, None)
