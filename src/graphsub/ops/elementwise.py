"""Element-wise operators: unary math, activations, broadcasting binary ops, scalar mul, cast."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
from scipy import special

from graphsub.errors import ConversionError, ShapeError
from graphsub.tensors.types import SUPPORTED_DTYPES, Attrs, TensorType
from graphsub.ops.base import (ANY_SHAPES, AtenBuilder, AtenCall, AtenImportFn, AttrSpec, Category,
                               LowerFn, OpDef, PostOp, OperandRole, TorchFn, TorchLowering, Types,
                               aten_importer, broadcast, choice, f32, is_float, onnx_importer,
                               register, same_dtype)

from graphsub.ops.contexts import OpExportContext, OpImportContext
from graphsub.tensors.values import Value

if TYPE_CHECKING:
    import onnx


ACTIVATIONS = ("none", "relu", "sigmoid", "tanh")
#: What the rule check tries for a fused activation attribute.
ACTIVATION_TRIES = ("none", "relu", "sigmoid")


def _sigmoid(x: np.ndarray) -> np.ndarray:
    y: np.ndarray = np.exp(-np.logaddexp(0, -x))
    return y.astype(x.dtype)


def apply_activation(name: str, x: np.ndarray) -> np.ndarray:
    """The numpy semantics of a fused activation attribute."""
    if name == "none":
        return x
    if name == "relu":
        y: np.ndarray = np.maximum(x, 0)
        return y.astype(x.dtype)
    if name == "sigmoid":
        return _sigmoid(x)
    if name == "tanh":
        y = np.tanh(x)
        return y
    raise ValueError(f"unknown activation {name!r}")


ACTIVATION_ONNX = {"relu": "Relu", "sigmoid": "Sigmoid", "tanh": "Tanh"}


def torch_activation(t: TorchLowering, name: str) -> Callable[[object], object]:
    """The torch semantics of a fused activation attribute."""
    if name == "none":
        return lambda y: y
    fns: dict[str, Callable[[object], object]] = {
        "relu": t.torch.relu, "sigmoid": t.torch.sigmoid, "tanh": t.torch.tanh}
    return fns[name]


def torch_function(name: str) -> LowerFn:
    """The lowering of an operator that is one torch function of its inputs (`torch.<name>`),
    without attributes."""
    def lower(t: TorchLowering, attrs: Attrs, ins: Types, outs: Types) -> TorchFn:
        fn = getattr(t.torch, name)
        return lambda *xs: (fn(*xs),)

    return lower


def _torch_identity(t: TorchLowering, attrs: Attrs, ins: Types, outs: Types) -> TorchFn:
    return lambda x: (x,)


def emit_with_activation(ctx: OpExportContext, activation: str, emit_core: Callable[[str], None],
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


def _export_gelu(ctx: OpExportContext, attrs: Attrs, ins: list[str], outs: list[str],
                 types: Types) -> None:
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
        if not is_float(ins[0]):
            raise ShapeError(f"{name}: needs a floating-point input, got {ins[0].dtype}")
        return (ins[0],)

    return infer


#: The input of an operator defined for positive values only, as the rule check draws it.
_POSITIVE = OperandRole(positive=True)


def _unary(name: str, onnx_type: str, fn: Callable[[np.ndarray], np.ndarray], flops: int,
           float_only: bool = True, view: str = "", torch: LowerFn | None = None,
           roles: tuple[OperandRole, ...] = (), post_op: PostOp | None = None) -> OpDef:
    return register(OpDef(
        name=name, inputs=(1, 1), view=view, torch=torch or torch_function(name),
        category=Category.ELEMENTWISE, roles=roles, post_op=post_op,
        infer=_float_only(name) if float_only else _same_type,
        evaluate=lambda attrs, xs: (np.asarray(fn(xs[0])).astype(xs[0].dtype),),
        export=lambda ctx, attrs, ins, outs, types: ctx.emit(onnx_type, ins, outs),
        flops=_per_element(flops),
        doc=f"Element-wise {name} (ONNX {onnx_type}).",
    ))


RELU = _unary("relu", "Relu", lambda x: np.maximum(x, 0), 1, float_only=False,
               post_op=PostOp("relu"))
SIGMOID = _unary("sigmoid", "Sigmoid", _sigmoid, 4, post_op=PostOp("sigmoid"))
TANH = _unary("tanh", "Tanh", np.tanh, 4, post_op=PostOp("tanh"))
ERF = _unary("erf", "Erf", special.erf, 4)
EXP = _unary("exp", "Exp", np.exp, 1)
LOG = _unary("log", "Log", np.log, 1, roles=(_POSITIVE,))
SQRT = _unary("sqrt", "Sqrt", np.sqrt, 1, roles=(_POSITIVE,))
NEG = _unary("neg", "Neg", np.negative, 1, float_only=False)
RECIPROCAL = _unary("reciprocal", "Reciprocal", np.reciprocal, 1, roles=(_POSITIVE,))
IDENTITY = _unary("identity", "Identity", lambda x: x, 0, float_only=False, view="alias",
                  torch=_torch_identity)

register(OpDef(
    name="dropout", inputs=(1, 1), view="alias", attrs=(AttrSpec("ratio", 0.5, f32, tries=(0.5, 0.1)),),
    category=Category.ELEMENTWISE,
    infer=_same_type, evaluate=lambda attrs, xs: (xs[0],), torch=_torch_identity,
    export=lambda ctx, attrs, ins, outs, types: ctx.emit("Identity", ins, outs),
    doc="Dropout at inference: the identity. Kept so imported graphs stay faithful; exported "
        "as Identity.",
))

def _torch_gelu(t: TorchLowering, attrs: Attrs, ins: Types, outs: Types) -> TorchFn:
    approximate = attrs["approximate"]
    return lambda x: (t.F.gelu(x, approximate=approximate),)


def _gelu_algorithm(attrs: Attrs) -> str:
    return "tanh" if attrs["approximate"] == "tanh" else "none"


register(OpDef(
    name="gelu", inputs=(1, 1), attrs=(AttrSpec("approximate", "none", choice("none", "tanh"),
                                                    tries=("none", "tanh")),),
    infer=_float_only("gelu"), evaluate=_gelu, export=_export_gelu, flops=_per_element(8),
    torch=_torch_gelu, category=Category.COARSE, post_op=PostOp("gelu", _gelu_algorithm),
    doc="Gaussian error linear unit; exported as ONNX Gelu from opset 20, else as primitives.",
))

def _torch_leaky_relu(t: TorchLowering, attrs: Attrs, ins: Types, outs: Types) -> TorchFn:
    alpha = attrs["alpha"]
    return lambda x: (t.F.leaky_relu(x, alpha),)


register(OpDef(
    name="leaky_relu", inputs=(1, 1), attrs=(AttrSpec("alpha", 0.01, f32, tries=(0.01, 0.2)),),
    category=Category.ELEMENTWISE,
    infer=_float_only("leaky_relu"), torch=_torch_leaky_relu,
    evaluate=lambda attrs, xs: (np.where(xs[0] >= 0, xs[0], xs[0] * np.float32(attrs["alpha"]))
                                .astype(xs[0].dtype),),
    export=lambda ctx, attrs, ins, outs, types: ctx.emit("LeakyRelu", ins, outs,
                                                         alpha=attrs["alpha"]),
    flops=_per_element(2),
))


def _optional_float(v: object) -> float | None:
    return None if v is None else f32(v)


def _export_clip(ctx: OpExportContext, attrs: Attrs, ins: list[str], outs: list[str],
                 types: Types) -> None:
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


def _torch_clip(t: TorchLowering, attrs: Attrs, ins: Types, outs: Types) -> TorchFn:
    # Bounds converted to the tensor's dtype as the numpy reference does (an integer tensor
    # clipped at -0.5 is clipped at 0).
    dtype = np.dtype(ins[0].dtype)
    lo = None if attrs["min"] is None else np.array(attrs["min"], dtype).item()
    hi = None if attrs["max"] is None else np.array(attrs["max"], dtype).item()
    if lo is None and hi is None:
        return lambda x: (x,)
    return lambda x: (t.torch.clamp(x, lo, hi),)


register(OpDef(
    name="clip", inputs=(1, 1), category=Category.ELEMENTWISE,
    attrs=(AttrSpec("min", None, _optional_float, tries=(None, -0.5)),
           AttrSpec("max", None, _optional_float, tries=(None, 0.5))),
    infer=_same_type, evaluate=_eval_clip, export=_export_clip, flops=_per_element(2),
    torch=_torch_clip,
    doc="Clamp to [min, max]; either bound may be None (unbounded).",
))


def _dtype_name(v: object) -> str:
    # (an attribute's value, whatever a rule or a model gave: numpy says what dtype it names,
    # and its stubs take no `object`)
    name = str(np.dtype(v))  # type: ignore[call-overload]
    if name not in SUPPORTED_DTYPES:
        raise ValueError(f"unsupported dtype {name}")
    return name


def _export_cast(ctx: OpExportContext, attrs: Attrs, ins: list[str], outs: list[str],
                 types: Types) -> None:
    from onnx import helper

    ctx.emit("Cast", ins, outs, to=helper.np_dtype_to_tensor_dtype(np.dtype(attrs["to"])))


def _torch_cast(t: TorchLowering, attrs: Attrs, ins: Types, outs: Types) -> TorchFn:
    dtype = t.dtype(attrs["to"])
    return lambda x: (x.to(dtype),)


register(OpDef(
    name="cast", inputs=(1, 1),
    attrs=(AttrSpec("to", "float32", _dtype_name, tries=("float16", "float32", "float64", "int32")),),
    category=Category.ELEMENTWISE,
    infer=lambda attrs, ins: (TensorType(ins[0].shape, attrs["to"]),),
    evaluate=lambda attrs, xs: (xs[0].astype(attrs["to"]),),
    export=_export_cast, torch=_torch_cast,
))


# ---- binary, broadcasting ----------------------------------------------------------------

def _binary_infer(name: str) -> Callable[[Attrs, Types], Types]:
    def infer(attrs: Attrs, ins: Types) -> Types:
        return (TensorType(broadcast(name, ins), same_dtype(name, ins)),)

    return infer


def _int_safe_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if np.issubdtype(a.dtype, np.unsignedinteger):
        return np.asarray(a // b).astype(a.dtype)
    if np.issubdtype(a.dtype, np.integer):
        # ONNX integer division truncates toward zero; in int64, where |int8's minimum| fits
        wide_a, wide_b = a.astype(np.int64), b.astype(np.int64)
        signed: np.ndarray = np.abs(wide_a) // np.abs(wide_b) * np.sign(wide_a) * np.sign(wide_b)
        return signed.astype(a.dtype)
    quotient: np.ndarray = np.divide(a, b)
    return quotient.astype(a.dtype)


def _torch_div(t: TorchLowering, attrs: Attrs, ins: Types, outs: Types) -> TorchFn:
    if is_float(ins[0]):
        return lambda a, b: (t.torch.div(a, b),)
    return lambda a, b: (t.torch.div(a, b, rounding_mode="trunc"),)  # ONNX integer division


def _binary(name: str, onnx_type: str, fn: Callable[[np.ndarray, np.ndarray], np.ndarray],
            doc: str, commutative: bool = False, torch: LowerFn | None = None,
            roles: tuple[OperandRole, ...] = (), associative: bool = False) -> OpDef:
    return register(OpDef(
        name=name, inputs=(2, 2), infer=_binary_infer(name), torch=torch or torch_function(name),
        category=Category.ELEMENTWISE, roles=roles,
        evaluate=lambda attrs, xs: (np.asarray(fn(xs[0], xs[1])).astype(xs[0].dtype),),
        export=lambda ctx, attrs, ins, outs, types: ctx.emit(onnx_type, ins, outs),
        flops=_per_element(1), doc=doc, commutative=commutative,
        associative=associative,
    ))


ADD = _binary("add", "Add", np.add, "Element-wise sum with numpy broadcasting.", True,
              associative=True)
SUB = _binary("sub", "Sub", np.subtract, "Element-wise difference with broadcasting.")
MUL = _binary("mul", "Mul", np.multiply, "Element-wise product with broadcasting.", True,
              associative=True)
DIV = _binary("div", "Div", _int_safe_div, "Element-wise quotient with broadcasting.",
              torch=_torch_div,
              # A divisor is positive, and may be a row scaling (one value per row) or the
              # reduction of a row (a column of ones).
              roles=(OperandRole(), OperandRole(shapes=ANY_SHAPES + ((4, 1), (2, 4, 1)),
                                                positive=True)))
POW = _binary("pow", "Pow", np.power, "Element-wise power with broadcasting.")


def _smul_infer(attrs: Attrs, ins: Types) -> Types:
    if ins[1].shape != ():
        raise ShapeError(f"smul: the scale must be a scalar (shape ()), got {ins[1].shape}")
    same_dtype("smul", ins)
    return (ins[0],)


register(OpDef(
    name="smul", inputs=(2, 2), infer=_smul_infer, category=Category.ELEMENTWISE,
    roles=(OperandRole(), OperandRole(shapes=((),))),
    evaluate=lambda attrs, xs: ((xs[0] * xs[1]).astype(xs[0].dtype),),
    export=lambda ctx, attrs, ins, outs, types: ctx.emit("Mul", ins, outs),
    flops=_per_element(1), torch=torch_function("mul"),
    doc="Multiplication by a scalar tensor (TASO's scalar mul); folds into convolutions.",
))


# ---- ONNX import ---------------------------------------------------------------------------

_UNARY_IMPORTS = {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Erf": "erf",
                  "Exp": "exp", "Log": "log", "Sqrt": "sqrt", "Neg": "neg",
                  "Reciprocal": "reciprocal", "Identity": "identity"}
_BINARY_IMPORTS = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow"}


@onnx_importer(*_UNARY_IMPORTS)
def _import_unary(ctx: OpImportContext, node: onnx.NodeProto) -> list[Value]:
    return ctx.add(_UNARY_IMPORTS[node.op_type], ctx.inputs(node))


@onnx_importer(*_BINARY_IMPORTS)
def _import_binary(ctx: OpImportContext, node: onnx.NodeProto) -> list[Value] | None:
    a, b = ctx.inputs(node)
    ta, tb = ctx.type_of(a), ctx.type_of(b)
    if node.op_type == "Pow" and ta.dtype != tb.dtype and ta.dtype.startswith(
            ("float", "bfloat")):
        # an exponent typed as an integer (tf2onnx's x ** 3): the same power in x's type
        exponent = ctx.constant(node.input[1])
        if exponent is not None and np.issubdtype(np.asarray(exponent).dtype, np.integer):
            b = ctx.weight(np.asarray(exponent).astype(np.dtype(ta.dtype)))
            return ctx.add("pow", [a, b])
    if ta.dtype != tb.dtype:
        return None
    if node.op_type == "Mul" and (ta.shape == () or tb.shape == ()) and ta.shape != tb.shape:
        # Multiplication by a scalar is TASO's scalar mul: rules about it must match.
        x, s = (a, b) if tb.shape == () else (b, a)
        return ctx.add("smul", [x, s])
    if node.op_type == "Mul":
        scale = _one_element_weight(ctx, node, ta, tb)
        if scale is not None:
            x, value = scale
            return ctx.add("smul", [x, ctx.weight(value)])
    return ctx.add(_BINARY_IMPORTS[node.op_type], [a, b])


def _one_element_weight(ctx: OpImportContext, node: onnx.NodeProto, ta: TensorType,
                        tb: TensorType) -> tuple[Value, np.ndarray] | None:
    """(the other operand, the scalar) where one operand of a Mul is a weight of one element
    whose rank the other's does not fall short of: a scalar multiplication however the
    exporter shaped it (Paddle2ONNX's learnable scales are [1]), so that the rules about
    scalar multiplication (a convolution's weights scaled instead) match it."""
    for k, (mine, other) in enumerate(((ta, tb), (tb, ta))):
        value = ctx.constant(node.input[k])
        if value is not None and value.size == 1 and len(mine.shape) <= len(other.shape) \
                and other.shape != ():
            return ctx.inputs(node)[1 - k], np.asarray(value).reshape(())
    return None


@onnx_importer("Sum")
def _import_sum(ctx: OpImportContext, node: onnx.NodeProto) -> list[Value]:
    values = ctx.inputs(node)
    acc = values[0]
    for v in values[1:]:
        (acc,) = ctx.add("add", [acc, v])
    return [acc] if len(values) > 1 else ctx.add("identity", [acc])


@onnx_importer("Gelu")
def _import_gelu(ctx: OpImportContext, node: onnx.NodeProto) -> list[Value]:
    return ctx.add("gelu", ctx.inputs(node), approximate=ctx.attr(node, "approximate", "none"))


@onnx_importer("LeakyRelu")
def _import_leaky(ctx: OpImportContext, node: onnx.NodeProto) -> list[Value]:
    return ctx.add("leaky_relu", ctx.inputs(node), alpha=ctx.attr(node, "alpha", 0.01))


@onnx_importer("Dropout")
def _import_dropout(ctx: OpImportContext, node: onnx.NodeProto) -> list[Value] | None:
    if len(node.output) > 1 and ctx.is_used(node.output[1]):
        return None  # the mask output is not modelled
    ins = ctx.inputs(node)
    ratio = ctx.constant(node.input[1]) if len(node.input) > 1 and node.input[1] else None
    return ctx.add("dropout", ins[:1], ratio=float(ratio) if ratio is not None else 0.5)


@onnx_importer("Clip")
def _import_clip(ctx: OpImportContext, node: onnx.NodeProto) -> list[Value] | None:
    bounds: list[float | None] = []
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
def _import_cast(ctx: OpImportContext, node: onnx.NodeProto) -> list[Value] | None:
    """A cast to a type graphsub does not model (strings, float8) stays an opaque node: the
    importer returns None for an element type onnx does not know, and `ctx.add` raises
    OpAttributeError, which the import catches, for one graphsub does not support."""
    from onnx import helper

    try:
        to = helper.tensor_dtype_to_np_dtype(ctx.attr(node, "to"))
    except KeyError:  # an element type code this onnx does not know
        return None
    return ctx.add("cast", ctx.inputs(node), to=str(to))


# ---- ATen import (torch.compile) -----------------------------------------------------------

def _aten_unary(ours: str) -> AtenImportFn:
    return lambda c, n: c.op(ours, c.value(n.args["self"]))


for _name in ("relu", "sigmoid", "tanh", "exp", "log", "sqrt", "neg", "erf", "reciprocal"):
    aten_importer(f"{_name}.default")(_aten_unary(_name))


@aten_importer("rsqrt.default")
def _aten_rsqrt(c: AtenBuilder, n: AtenCall) -> object:
    return c.op("reciprocal", c.op("sqrt", c.value(n.args["self"])))


@aten_importer("silu.default")
def _aten_silu(c: AtenBuilder, n: AtenCall) -> object:
    x = c.value(n.args["self"])
    return c.op("mul", x, c.op("sigmoid", x))


@aten_importer("gelu.default")
def _aten_gelu(c: AtenBuilder, n: AtenCall) -> object:
    return c.op("gelu", c.value(n.args["self"]), approximate=n.args.get("approximate", "none"))


@aten_importer("leaky_relu.default")
def _aten_leaky(c: AtenBuilder, n: AtenCall) -> object:
    return c.op("leaky_relu", c.value(n.args["self"]),
                alpha=float(n.args.get("negative_slope", 0.01)))


@aten_importer("hardtanh.default", "clamp.default")
def _aten_clip(c: AtenBuilder, n: AtenCall) -> object:
    lo = n.args.get("min_val", n.args.get("min"))
    hi = n.args.get("max_val", n.args.get("max"))
    return c.op("clip", c.value(n.args["self"]), min=lo, max=hi)


def _unit_alpha(n: AtenCall) -> str | None:
    return None if n.args.get("alpha", 1) == 1 else "alpha != 1"


def _aten_binary(ours: str) -> AtenImportFn:
    def convert(c: AtenBuilder, n: AtenCall) -> object:
        x, other = n.args["self"], n.args["other"]
        if not c.is_tensor(x):  # scalar first (rsub and friends are not here)
            raise ConversionError("scalar left operand")
        xv = c.value(x)
        if not c.is_tensor(other) and ours == "mul":
            return c.op("smul", xv, c.value(other, like=xv))
        return c.op(ours, xv, c.value(other, like=xv))

    return convert


for _name in ("add", "sub", "mul", "div"):
    aten_importer(f"{_name}.Tensor", f"{_name}.Scalar",
                  **({"check": _unit_alpha} if _name in ("add", "sub") else {}))(
        _aten_binary(_name))


@aten_importer("pow.Tensor_Scalar")
def _aten_pow(c: AtenBuilder, n: AtenCall) -> object:
    x = c.value(n.args["self"])
    return c.op("pow", x, c.value(n.args["exponent"], like=x))


@aten_importer("clone.default", "alias.default", "alias_copy.default", "detach.default",
               "detach_copy.default")
def _aten_identity(c: AtenBuilder, n: AtenCall) -> object:
    return c.value(n.args["self"])


def _to_copy_check(n: AtenCall) -> str | None:
    """A cast, or a copy that changes nothing else: the layout named as the strided one it
    is, the device named as the one it is on (what `.to(torch.float32)` on a module's
    activations traces to)."""
    kwargs = n.kwargs
    extra = {k for k in ("pin_memory", "memory_format") if kwargs.get(k)}
    if kwargs.get("layout") is not None and str(kwargs["layout"]) != "torch.strided":
        extra.add("layout")
    device = kwargs.get("device")
    if device is not None and str(device) != n.device_of(n.args["self"]):
        extra.add("device")
    return f"_to_copy changing {', '.join(sorted(extra))}" if extra else None


@aten_importer("_to_copy.default", check=_to_copy_check)
def _aten_to_copy(c: AtenBuilder, n: AtenCall) -> object:
    x = c.value(n.args["self"])
    dtype = n.args.get("dtype")
    if dtype is None:
        return x
    name = c.dtype_name(dtype)
    if name is None:
        raise ConversionError(f"cast to {dtype}")
    return c.op("cast", x, to=name)
