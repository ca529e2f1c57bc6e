"""Element-wise operators: unary math, activations, broadcasting binary ops, scalar mul, cast."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from scipy import special

from graphsub.errors import ShapeError
from graphsub.ir.types import SUPPORTED_DTYPES, Attrs, TensorType
from graphsub.ops.base import (AttrSpec, OpDef, Types, broadcast, choice, onnx_importer,
                               register, same_dtype, f32)

ACTIVATIONS = ("none", "relu", "sigmoid", "tanh")


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return np.exp(-np.logaddexp(0, -x)).astype(x.dtype)


def apply_activation(name: str, x: np.ndarray) -> np.ndarray:
    """The numpy semantics of a fused activation attribute."""
    if name == "none":
        return x
    if name == "relu":
        return np.maximum(x, 0).astype(x.dtype)
    if name == "sigmoid":
        return _sigmoid(x)
    if name == "tanh":
        return np.tanh(x)
    raise ValueError(f"unknown activation {name!r}")


ACTIVATION_ONNX = {"relu": "Relu", "sigmoid": "Sigmoid", "tanh": "Tanh"}


def emit_with_activation(ctx, activation: str, emit_core: Callable[[str], None],
                         output: str) -> None:
    """Emit an op whose result goes through a fused activation (a separate ONNX node)."""
    if activation == "none":
        emit_core(output)
        return
    tmp = ctx.fresh("preact")
    emit_core(tmp)
    ctx.emit(ACTIVATION_ONNX[activation], [tmp], [output])


def _same_type(attrs: Attrs, ins: Types) -> Types:
    return (ins[0],)


def _per_element(factor: int) -> Callable[[Attrs, Types, Types], int]:
    return lambda attrs, ins, outs: factor * outs[0].numel


def _gelu(attrs: Attrs, xs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    x = xs[0]
    if attrs["approximate"] == "tanh":
        inner = math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)
        return ((0.5 * x * (1 + np.tanh(inner))).astype(x.dtype),)
    return ((0.5 * x * (1 + special.erf(x / math.sqrt(2)))).astype(x.dtype),)


def _export_gelu(ctx, attrs: Attrs, ins: list[str], outs: list[str], types: Types) -> None:
    if ctx.opset >= 20:
        ctx.emit("Gelu", ins, outs, approximate=attrs["approximate"])
        return
    dtype = types[0].dtype
    x = ins[0]
    if attrs["approximate"] == "tanh":
        cube = ctx.fresh("gelu")
        ctx.emit("Mul", [x, x], [sq := ctx.fresh("gelu")])
        ctx.emit("Mul", [sq, x], [cube])
        scaled = ctx.fresh("gelu")
        ctx.emit("Mul", [cube, ctx.const(np.array(0.044715, dtype))], [scaled])
        inner = ctx.fresh("gelu")
        ctx.emit("Add", [x, scaled], [inner])
        inner2 = ctx.fresh("gelu")
        ctx.emit("Mul", [inner, ctx.const(np.array(math.sqrt(2 / math.pi), dtype))], [inner2])
        core = ctx.fresh("gelu")
        ctx.emit("Tanh", [inner2], [core])
    else:
        scaled = ctx.fresh("gelu")
        ctx.emit("Div", [x, ctx.const(np.array(math.sqrt(2), dtype))], [scaled])
        core = ctx.fresh("gelu")
        ctx.emit("Erf", [scaled], [core])
    plus1 = ctx.fresh("gelu")
    ctx.emit("Add", [core, ctx.const(np.array(1, dtype))], [plus1])
    half = ctx.fresh("gelu")
    ctx.emit("Mul", [x, ctx.const(np.array(0.5, dtype))], [half])
    ctx.emit("Mul", [half, plus1], outs)


def _float_only(name: str) -> Callable[[Attrs, Types], Types]:
    def infer(attrs: Attrs, ins: Types) -> Types:
        if not ins[0].dtype.startswith(("float", "bfloat")):
            raise ShapeError(f"{name}: needs a floating-point input, got {ins[0].dtype}")
        return (ins[0],)

    return infer


def _unary(name: str, onnx_type: str, fn: Callable[[np.ndarray], np.ndarray], flops: int,
           float_only: bool = True, view: str = "") -> OpDef:
    return register(OpDef(
        name=name, inputs=(1, 1), view=view,
        infer=_float_only(name) if float_only else _same_type,
        evaluate=lambda attrs, xs: (np.asarray(fn(xs[0])).astype(xs[0].dtype),),
        export=lambda ctx, attrs, ins, outs, types: ctx.emit(onnx_type, ins, outs),
        flops=_per_element(flops),
        doc=f"Element-wise {name} (ONNX {onnx_type}).",
    ))


RELU = _unary("relu", "Relu", lambda x: np.maximum(x, 0), 1, float_only=False)
SIGMOID = _unary("sigmoid", "Sigmoid", _sigmoid, 4)
TANH = _unary("tanh", "Tanh", np.tanh, 4)
ERF = _unary("erf", "Erf", special.erf, 4)
EXP = _unary("exp", "Exp", np.exp, 1)
LOG = _unary("log", "Log", np.log, 1)
SQRT = _unary("sqrt", "Sqrt", np.sqrt, 1)
NEG = _unary("neg", "Neg", np.negative, 1, float_only=False)
RECIPROCAL = _unary("reciprocal", "Reciprocal", np.reciprocal, 1)
IDENTITY = _unary("identity", "Identity", lambda x: x, 0, float_only=False, view="alias")

register(OpDef(
    name="dropout", inputs=(1, 1), view="alias", attrs=(AttrSpec("ratio", 0.5, f32),),
    infer=_same_type, evaluate=lambda attrs, xs: (xs[0],),
    export=lambda ctx, attrs, ins, outs, types: ctx.emit("Identity", ins, outs),
    doc="Dropout at inference: the identity. Kept so imported graphs stay faithful; exported "
        "as Identity.",
))

register(OpDef(
    name="gelu", inputs=(1, 1), attrs=(AttrSpec("approximate", "none", choice("none", "tanh")),),
    infer=_float_only("gelu"), evaluate=_gelu, export=_export_gelu, flops=_per_element(8),
    doc="Gaussian error linear unit; exported as ONNX Gelu from opset 20, else as primitives.",
))

register(OpDef(
    name="leaky_relu", inputs=(1, 1), attrs=(AttrSpec("alpha", 0.01, f32),),
    infer=_float_only("leaky_relu"),
    evaluate=lambda attrs, xs: (np.where(xs[0] >= 0, xs[0], xs[0] * np.float32(attrs["alpha"]))
                                .astype(xs[0].dtype),),
    export=lambda ctx, attrs, ins, outs, types: ctx.emit("LeakyRelu", ins, outs,
                                                         alpha=attrs["alpha"]),
    flops=_per_element(2),
))


def _optional_float(v: object) -> float | None:
    return None if v is None else f32(v)


def _export_clip(ctx, attrs: Attrs, ins: list[str], outs: list[str], types: Types) -> None:
    dtype = types[0].dtype
    lo = "" if attrs["min"] is None else ctx.const(np.array(attrs["min"], dtype))
    hi = "" if attrs["max"] is None else ctx.const(np.array(attrs["max"], dtype))
    inputs = [ins[0], lo, hi]
    while inputs[-1] == "":
        inputs.pop()
    ctx.emit("Clip", inputs, outs)


def _eval_clip(attrs: Attrs, xs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    x = xs[0]
    if attrs["min"] is not None:
        x = np.maximum(x, np.array(attrs["min"], x.dtype))
    if attrs["max"] is not None:
        x = np.minimum(x, np.array(attrs["max"], x.dtype))
    return (x,)


register(OpDef(
    name="clip", inputs=(1, 1),
    attrs=(AttrSpec("min", None, _optional_float), AttrSpec("max", None, _optional_float)),
    infer=_same_type, evaluate=_eval_clip, export=_export_clip, flops=_per_element(2),
    doc="Clamp to [min, max]; either bound may be None (unbounded).",
))


def _dtype_name(v: object) -> str:
    name = str(np.dtype(v)) if str(v) != "bfloat16" else "bfloat16"  # type: ignore[call-overload]
    if name not in SUPPORTED_DTYPES:
        raise ValueError(f"unsupported dtype {name}")
    return name


def _export_cast(ctx, attrs: Attrs, ins: list[str], outs: list[str], types: Types) -> None:
    from onnx import helper

    ctx.emit("Cast", ins, outs, to=helper.np_dtype_to_tensor_dtype(np.dtype(attrs["to"])))


register(OpDef(
    name="cast", inputs=(1, 1), attrs=(AttrSpec("to", "float32", _dtype_name),),
    infer=lambda attrs, ins: (TensorType(ins[0].shape, attrs["to"]),),
    evaluate=lambda attrs, xs: (xs[0].astype(attrs["to"]),),
    export=_export_cast,
))


# ---- binary, broadcasting ----------------------------------------------------------------

def _binary_infer(name: str) -> Callable[[Attrs, Types], Types]:
    def infer(attrs: Attrs, ins: Types) -> Types:
        return (TensorType(broadcast(name, ins), same_dtype(name, ins)),)

    return infer


def _int_safe_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if np.issubdtype(a.dtype, np.integer):
        q = np.abs(a) // np.abs(b)  # ONNX integer division truncates toward zero
        return (q * np.sign(a) * np.sign(b)).astype(a.dtype)
    return np.divide(a, b).astype(a.dtype)


def _binary(name: str, onnx_type: str, fn: Callable[[np.ndarray, np.ndarray], np.ndarray],
            doc: str, commutative: bool = False) -> OpDef:
    return register(OpDef(
        name=name, inputs=(2, 2), infer=_binary_infer(name),
        evaluate=lambda attrs, xs: (np.asarray(fn(xs[0], xs[1])).astype(xs[0].dtype),),
        export=lambda ctx, attrs, ins, outs, types: ctx.emit(onnx_type, ins, outs),
        flops=_per_element(1), doc=doc, commutative=commutative,
    ))


ADD = _binary("add", "Add", np.add, "Element-wise sum with numpy broadcasting.", True)
SUB = _binary("sub", "Sub", np.subtract, "Element-wise difference with broadcasting.")
MUL = _binary("mul", "Mul", np.multiply, "Element-wise product with broadcasting.", True)
DIV = _binary("div", "Div", _int_safe_div, "Element-wise quotient with broadcasting.")
POW = _binary("pow", "Pow", np.power, "Element-wise power with broadcasting.")


def _smul_infer(attrs: Attrs, ins: Types) -> Types:
    if ins[1].shape != ():
        raise ShapeError(f"smul: the scale must be a scalar (shape ()), got {ins[1].shape}")
    same_dtype("smul", ins)
    return (ins[0],)


register(OpDef(
    name="smul", inputs=(2, 2), infer=_smul_infer,
    evaluate=lambda attrs, xs: ((xs[0] * xs[1]).astype(xs[0].dtype),),
    export=lambda ctx, attrs, ins, outs, types: ctx.emit("Mul", ins, outs),
    flops=_per_element(1),
    doc="Multiplication by a scalar tensor (TASO's scalar mul); folds into convolutions.",
))


# ---- ONNX import ---------------------------------------------------------------------------

_UNARY_IMPORTS = {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Erf": "erf",
                  "Exp": "exp", "Log": "log", "Sqrt": "sqrt", "Neg": "neg",
                  "Reciprocal": "reciprocal", "Identity": "identity"}
_BINARY_IMPORTS = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow"}


@onnx_importer(*_UNARY_IMPORTS)
def _import_unary(ctx, node):
    return ctx.add(_UNARY_IMPORTS[node.op_type], ctx.inputs(node))


@onnx_importer(*_BINARY_IMPORTS)
def _import_binary(ctx, node):
    a, b = ctx.inputs(node)
    ta, tb = ctx.type_of(a), ctx.type_of(b)
    if ta.dtype != tb.dtype:
        return None
    if node.op_type == "Mul" and (ta.shape == () or tb.shape == ()) and ta.shape != tb.shape:
        # Multiplication by a scalar is TASO's scalar mul: rules about it must match.
        x, s = (a, b) if tb.shape == () else (b, a)
        return ctx.add("smul", [x, s])
    return ctx.add(_BINARY_IMPORTS[node.op_type], [a, b])


@onnx_importer("Sum")
def _import_sum(ctx, node):
    values = ctx.inputs(node)
    acc = values[0]
    for v in values[1:]:
        (acc,) = ctx.add("add", [acc, v])
    return [acc] if len(values) > 1 else ctx.add("identity", [acc])


@onnx_importer("Gelu")
def _import_gelu(ctx, node):
    return ctx.add("gelu", ctx.inputs(node), approximate=ctx.attr(node, "approximate", "none"))


@onnx_importer("LeakyRelu")
def _import_leaky(ctx, node):
    return ctx.add("leaky_relu", ctx.inputs(node), alpha=ctx.attr(node, "alpha", 0.01))


@onnx_importer("Dropout")
def _import_dropout(ctx, node):
    if len(node.output) > 1 and ctx.is_used(node.output[1]):
        return None  # the mask output is not modelled
    ins = ctx.inputs(node)
    ratio = ctx.constant(node.input[1]) if len(node.input) > 1 and node.input[1] else None
    return ctx.add("dropout", ins[:1], ratio=float(ratio) if ratio is not None else 0.5)


@onnx_importer("Clip")
def _import_clip(ctx, node):
    bounds = []
    for i in (1, 2):
        if len(node.input) > i and node.input[i]:
            c = ctx.constant(node.input[i])
            if c is None:
                return None  # bounds computed at run time
            bounds.append(float(c))
        else:
            bounds.append(None)
    return ctx.add("clip", ctx.inputs(node)[:1], min=bounds[0], max=bounds[1])


@onnx_importer("Cast")
def _import_cast(ctx, node):
    from onnx import helper

    to = helper.tensor_dtype_to_np_dtype(ctx.attr(node, "to"))
    try:
        return ctx.add("cast", ctx.inputs(node), to=str(to))
    except Exception:
        return None
