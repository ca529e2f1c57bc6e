"""Normalizations: softmax, layer normalization and (inference) batch normalization.

These are the coarse operators that operator fission splits into primitives later on; here
they are defined once, with ONNX export that falls back to primitives where the target opset
lacks the fused op (LayerNormalization arrived in opset 17).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from graphsub.errors import ShapeError
from graphsub.ir.types import Attrs
from graphsub.ops.base import AttrSpec, OpDef, Types, f32, norm_axis, onnx_importer, register


def _axis_canon(op: str):
    def canon(values: dict[str, Any], ins: Types) -> dict[str, Any]:
        values["axis"] = norm_axis(values["axis"], ins[0].rank, op)
        return values

    return canon


def _float_same(op: str):
    def infer(attrs: Attrs, ins: Types) -> Types:
        if not ins[0].dtype.startswith("float"):
            raise ShapeError(f"{op}: needs a floating-point input, got {ins[0].dtype}")
        return (ins[0],)

    return infer


def _softmax(attrs: Attrs, xs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    x = xs[0].astype(np.float64)
    e = np.exp(x - x.max(axis=attrs["axis"], keepdims=True))
    return ((e / e.sum(axis=attrs["axis"], keepdims=True)).astype(xs[0].dtype),)


register(OpDef(
    name="softmax", inputs=(1, 1), attrs=(AttrSpec("axis", -1, int),),
    infer=_float_same("softmax"), evaluate=_softmax,
    export=lambda ctx, attrs, ins, outs, types: ctx.emit("Softmax", ins, outs,
                                                         axis=attrs["axis"]),
    canonicalize=_axis_canon("softmax"),
    flops=lambda attrs, ins, outs: 5 * ins[0].numel,
))


@onnx_importer("Softmax")
def _import_softmax(ctx, node):
    return ctx.add("softmax", ctx.inputs(node), axis=ctx.attr(node, "axis", -1))


# ---- layer normalization ----------------------------------------------------------------------

def _ln_infer(attrs: Attrs, ins: Types) -> Types:
    x = _float_same("layer_norm")(attrs, ins)[0]
    norm_shape = x.shape[attrs["axis"]:]
    for name, t in zip(("scale", "bias"), ins[1:]):
        try:
            ok = tuple(np.broadcast_shapes(t.shape, norm_shape)) == norm_shape
        except ValueError:
            ok = False
        if not ok:
            raise ShapeError(f"layer_norm: {name} of shape {t.shape} does not broadcast to the "
                             f"normalized shape {norm_shape}")
    return (x,)


def _ln_eval(attrs: Attrs, xs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    x = xs[0].astype(np.float64)
    axes = tuple(range(attrs["axis"], x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    y = (x - mean) / np.sqrt(var + attrs["epsilon"]) * xs[1]
    if len(xs) > 2:
        y = y + xs[2]
    return (y.astype(xs[0].dtype),)


def _ln_export(ctx, attrs: Attrs, ins: list[str], outs: list[str], types: Types) -> None:
    if ctx.opset >= 17:
        ctx.emit("LayerNormalization", ins, outs, axis=attrs["axis"], epsilon=attrs["epsilon"])
        return
    x = types[0]
    axes = list(range(attrs["axis"], x.rank))
    mean, centered, sq, var, std, normed = (ctx.fresh("ln") for _ in range(6))
    ctx.emit("ReduceMean", [ins[0]], [mean], axes=axes, keepdims=1)
    ctx.emit("Sub", [ins[0], mean], [centered])
    ctx.emit("Mul", [centered, centered], [sq])
    ctx.emit("ReduceMean", [sq], [var], axes=axes, keepdims=1)
    eps = ctx.const(np.array(attrs["epsilon"], dtype=x.dtype))
    shifted = ctx.fresh("ln")
    ctx.emit("Add", [var, eps], [shifted])
    ctx.emit("Sqrt", [shifted], [std])
    ctx.emit("Div", [centered, std], [normed])
    if len(ins) > 2:
        scaled = ctx.fresh("ln")
        ctx.emit("Mul", [normed, ins[1]], [scaled])
        ctx.emit("Add", [scaled, ins[2]], outs)
    else:
        ctx.emit("Mul", [normed, ins[1]], outs)


register(OpDef(
    name="layer_norm", inputs=(2, 3),
    attrs=(AttrSpec("axis", -1, int), AttrSpec("epsilon", 1e-5, f32)),
    infer=_ln_infer, evaluate=_ln_eval, export=_ln_export,
    canonicalize=_axis_canon("layer_norm"),
    flops=lambda attrs, ins, outs: 8 * ins[0].numel,
    doc="Normalize over the axes from `axis` on, then scale (and shift).",
))


@onnx_importer("LayerNormalization")
def _import_layer_norm(ctx, node):
    if any(ctx.is_used(o) for o in node.output[1:]):
        return None  # mean / inverse-std outputs are not modelled
    if ctx.attr(node, "stash_type", 1) != 1:
        return None
    return ctx.add("layer_norm", ctx.inputs(node), axis=ctx.attr(node, "axis", -1),
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


register(OpDef(
    name="batch_norm", inputs=(5, 5), attrs=(AttrSpec("epsilon", 1e-5, f32),),
    infer=_bn_infer, evaluate=_bn_eval,
    export=lambda ctx, attrs, ins, outs, types: ctx.emit("BatchNormalization", ins, outs,
                                                         epsilon=attrs["epsilon"]),
    flops=lambda attrs, ins, outs: 2 * ins[0].numel,
    doc="Inference batch normalization: inputs x, scale, bias, running mean, running var.",
))


@onnx_importer("BatchNormalization")
def _import_batch_norm(ctx, node):
    if ctx.attr(node, "training_mode", 0) or any(ctx.is_used(o) for o in node.output[1:]):
        return None
    return ctx.add("batch_norm", ctx.inputs(node), epsilon=ctx.attr(node, "epsilon", 1e-5))
