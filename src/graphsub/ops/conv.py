"""2-D convolution (grouped, strided, dilated, fused activation, optional bias) and TASO's
enlarge operator, plus the padding arithmetic that pooling shares."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from graphsub.errors import ConversionError, ShapeError
from graphsub.tensors.symbolic import Dim, ceildiv, floordiv, is_negative, is_symbolic
from graphsub.tensors.types import Attrs, TensorType
from graphsub.ops.base import (AtenBuilder, AtenCall, AttrSpec, Category, OpDef, OperandRole, Shape,
                               TorchFn, TorchLowering, Types, aten_importer, choice, ints,
                               onnx_importer, pair, register, same_dtype)
from graphsub.ops.elementwise import (ACTIVATION_TRIES, ACTIVATIONS, apply_activation,
                                      emit_with_activation, torch_activation)

from graphsub.ops.contexts import OpExportContext, OpImportContext
from graphsub.tensors.values import Value

if TYPE_CHECKING:
    import onnx


Pads = tuple[int, int, int, int]  # top, left, bottom, right (ONNX order is t, l, b, r too)

#: What the rule check tries for the strides and padding of convolutions and pools.
STRIDE_TRIES = ((1, 1), (2, 2))
#: Both modes, and explicit pads (top, left, bottom, right) that are neither.
PADDING_TRIES = ("same", "valid", (0, 0, 1, 2))
DILATION_TRIES = ((1, 1), (2, 2))
#: Images the rule check draws for a convolution's input (4 or 8 channels), and kernels for
#: them: square and not, 1x1, grouped (4 input channels of 2 or 1), widening and narrowing.
_IMAGES = OperandRole(shapes=((1, 4, 6, 6), (1, 8, 6, 6), (2, 4, 7, 5), (1, 4, 4, 4)))
_KERNELS = OperandRole(shapes=((4, 4, 3, 3), (4, 4, 1, 1), (8, 4, 3, 3), (4, 4, 1, 3), (4, 4, 3, 1),
                        (4, 2, 3, 3), (4, 1, 3, 3), (8, 8, 3, 3), (4, 8, 1, 1), (8, 4, 1, 1)))


def padding_attr(value: Any) -> str | Pads:
    """'same' (ONNX SAME_UPPER), 'same_lower', 'valid', or explicit (top, left, bottom,
    right) pads. 'same_lower' stays a mode only over symbolic sizes at a stride above 1,
    where no pads express it for every size; elsewhere it is imported as its pads."""
    if isinstance(value, str):
        return choice("same", "same_lower", "valid")(value)
    p = ints(value)
    if len(p) == 1:
        p = p * 4
    elif len(p) == 2:
        p = (p[0], p[1], p[0], p[1])
    if len(p) != 4 or min(p) < 0:
        raise ValueError("explicit padding needs four non-negative integers (t, l, b, r)")
    return p


def same_pads(size: Sequence[Dim], kernel: Sequence[int], stride: Sequence[int],
              dilation: Sequence[int] = (1, 1)) -> Pads:
    """SAME padding as ONNX SAME_UPPER defines it: output = ceil(input / stride), with the odd
    pixel of padding at the end."""
    before, after = [], []
    for n, k, s, d in zip(size, kernel, stride, dilation):
        eff = (k - 1) * d + 1
        if is_symbolic(n):
            if s != 1:  # the padding depends on the size's remainder modulo the stride
                raise ShapeError(f"SAME padding at stride {s} over a dimension of size {n}")
            total = max(eff - 1, 0)
        else:
            total = max((-(-n // s) - 1) * s + eff - n, 0)
        before.append(total // 2)
        after.append(total - total // 2)
    return (before[0], before[1], after[0], after[1])


def resolve_pads(padding: str | Pads, size: Sequence[Dim], kernel: Sequence[int],
                 stride: Sequence[int], dilation: Sequence[int] = (1, 1)) -> Pads:
    if padding == "same":
        return same_pads(size, kernel, stride, dilation)
    if padding == "same_lower":  # the odd pixel of padding at the start
        t, left, b, r = same_pads(size, kernel, stride, dilation)
        return (b, r, t, left)
    if padding == "valid":
        return (0, 0, 0, 0)
    if isinstance(padding, str):
        raise ShapeError(f"unknown padding {padding!r}: same, same_lower, valid or four pads")
    return padding


def canonical_padding(padding: str | Pads, size: Sequence[Dim], kernel: Sequence[int],
                      stride: Sequence[int], dilation: Sequence[int] = (1, 1)) -> str | Pads:
    """Name pads 'same' or 'valid' when they are exactly that (preferring 'same' when both
    fit), so that rules which require equal padding see equal attributes."""
    if padding in ("same", "same_lower"):
        return padding
    explicit = resolve_pads(padding, size, kernel, stride, dilation)
    try:
        same = same_pads(size, kernel, stride, dilation)
    except ShapeError:
        same = None
    if explicit == same:
        return "same"  # also for 1x1 kernels at stride 1, where SAME and VALID coincide
    if explicit == (0, 0, 0, 0):
        return "valid"
    return padding


#: ONNX's auto_pad for graphsub's SAME paddings.
AUTO_PAD = {"same": "SAME_UPPER", "same_lower": "SAME_LOWER"}


def same_over_sizes(padding: str | Pads, size: Sequence[Dim], stride: Sequence[int]) -> bool:
    """SAME padding over a symbolic size at a stride above 1, whose pads depend on the size
    modulo the stride: the output is ceil(size / stride), and it is written with ONNX's
    auto_pad rather than pads."""
    return padding in ("same", "same_lower") and any(is_symbolic(n) and s != 1
                                                     for n, s in zip(size, stride))


def window_out(size: Dim, k: int, s: int, d: int, before: int, after: int, op: str) -> Dim:
    """The number of windows along one axis. Over a symbolic size, a window larger than the
    smallest sizes is the model's own limit, not a reason to refuse it."""
    eff = (k - 1) * d + 1
    span = size + before + after - eff
    if is_negative(span) is True:
        raise ShapeError(f"{op}: window {k} (dilation {d}) is larger than the padded input {size}")
    return floordiv(span, s) + 1


def _conv_infer(attrs: Attrs, ins: Types) -> Types:
    x, w = ins[0], ins[1]
    dtype = same_dtype("conv2d", ins)
    if x.rank != 4 or w.rank != 4:
        raise ShapeError(f"conv2d: input and weight must be 4-D (NCHW, OIHW), got {x.shape} "
                         f"and {w.shape}")
    n, c, h, wd = x.shape
    cout, cin_g, kh, kw = w.shape
    if cin_g == 0 or c % cin_g:
        raise ShapeError(f"conv2d: input channels {c} are not a multiple of the weight's "
                         f"input channels {cin_g}")
    groups = c // cin_g
    if cout % groups:
        raise ShapeError(f"conv2d: output channels {cout} are not divisible by the group "
                         f"count {groups} (= {c} input channels / {cin_g} per group)")
    if len(ins) == 3 and ins[2].shape != (cout,):
        raise ShapeError(f"conv2d: bias must have shape ({cout},), got {ins[2].shape}")
    sh, sw = attrs["stride"]
    dh, dw = attrs["dilation"]
    if same_over_sizes(attrs["padding"], (h, wd), (sh, sw)):
        return (TensorType((n, cout, ceildiv(h, sh), ceildiv(wd, sw)), dtype),)
    t, left, b, r = resolve_pads(attrs["padding"], (h, wd), (kh, kw), (sh, sw), (dh, dw))
    ho = window_out(h, kh, sh, dh, t, b, "conv2d")
    wo = window_out(wd, kw, sw, dw, left, r, "conv2d")
    return (TensorType((n, cout, ho, wo), dtype),)


def _conv_canon(values: dict[str, Any], ins: Types) -> dict[str, Any]:
    if len(ins) >= 2 and ins[0].rank == 4 and ins[1].rank == 4:
        values["padding"] = canonical_padding(values["padding"], ins[0].shape[2:],
                                              ins[1].shape[2:], values["stride"],
                                              values["dilation"])
    return values


def pad_nchw(x: np.ndarray, pads: Pads, value: float = 0.0) -> np.ndarray:
    t, left, b, r = pads
    if not any(pads):
        return x
    return np.pad(x, ((0, 0), (0, 0), (t, b), (left, r)), constant_values=value)


def windows(x: np.ndarray, kernel: tuple[int, int], stride: tuple[int, int],
            dilation: tuple[int, int], out_hw: Sequence[int]) -> np.ndarray:
    """View of x (N, C, H, W) as (N, C, Ho, Wo, kh, kw) sliding windows."""
    kh, kw = kernel
    dh, dw = dilation
    v = sliding_window_view(x, ((kh - 1) * dh + 1, (kw - 1) * dw + 1), axis=(2, 3))
    v = v[:, :, ::stride[0], ::stride[1], ::dh, ::dw]
    return v[:, :, :out_hw[0], :out_hw[1]]


def conv2d_reference(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None,
                     stride: tuple[int, int], pads: Pads, dilation: tuple[int, int],
                     out_hw: Sequence[int]) -> np.ndarray:
    n, c = x.shape[:2]
    cout, cin_g, kh, kw = w.shape
    groups = c // cin_g
    win = windows(pad_nchw(x, pads), (kh, kw), stride, dilation, out_hw)
    win = win.reshape(n, groups, cin_g, out_hw[0], out_hw[1], kh, kw)
    wg = w.reshape(groups, cout // groups, cin_g, kh, kw)
    out: np.ndarray = np.einsum("ngchwij,gocij->ngohw", win, wg, optimize=True)
    out = out.reshape(n, cout, out_hw[0], out_hw[1])
    if bias is not None:
        out = out + bias.reshape(1, cout, 1, 1)
    return out.astype(x.dtype)


def _conv_eval(attrs: Attrs, xs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    x, w = xs[0], xs[1]
    bias = xs[2] if len(xs) > 2 else None
    types = tuple(TensorType(a.shape, str(a.dtype)) for a in xs)
    out_t = _conv_infer(attrs, types)[0]
    pads = resolve_pads(attrs["padding"], x.shape[2:], w.shape[2:], attrs["stride"],
                        attrs["dilation"])
    out = conv2d_reference(x, w, bias, attrs["stride"], pads, attrs["dilation"],
                           out_t.shape[2:])
    return (apply_activation(attrs["activation"], out),)


def _conv_flops(attrs: Attrs, ins: Types, outs: Types) -> int:
    _, cin_g, kh, kw = ins[1].shape
    return 2 * outs[0].numel * cin_g * kh * kw + (outs[0].numel if len(ins) > 2 else 0)


def _conv_export(ctx: OpExportContext, attrs: Attrs, ins: list[str], outs: list[str],
                 types: Types) -> None:
    x, w = types[0], types[1]
    onnx_attrs: dict[str, Any] = dict(
        kernel_shape=list(w.shape[2:]), strides=list(attrs["stride"]),
        dilations=list(attrs["dilation"]), group=x.shape[1] // w.shape[1])
    if same_over_sizes(attrs["padding"], x.shape[2:], attrs["stride"]):
        onnx_attrs["auto_pad"] = AUTO_PAD[attrs["padding"]]
    else:
        pads = resolve_pads(attrs["padding"], x.shape[2:], w.shape[2:], attrs["stride"],
                            attrs["dilation"])
        onnx_attrs["pads"] = [pads[0], pads[1], pads[2], pads[3]]
    emit_with_activation(ctx, attrs["activation"],
                         lambda out: ctx.emit("Conv", ins, [out], **onnx_attrs), outs[0])


def symmetric_pads(pads: Pads) -> tuple[int, int] | None:
    """(top, left) when the pads are the same on both sides of each axis (what torch's own
    padding argument expresses), else None."""
    t, left, b, r = pads
    return (t, left) if (t, left) == (b, r) else None


def _conv_torch(t: TorchLowering, attrs: Attrs, ins: Types, outs: Types) -> TorchFn:
    F = t.F
    x, w = ins[0], ins[1]
    groups = x.shape[1] // w.shape[1]
    stride, dilation = tuple(attrs["stride"]), tuple(attrs["dilation"])
    pads = resolve_pads(attrs["padding"], x.shape[2:], w.shape[2:], stride, dilation)
    sym = symmetric_pads(pads)
    activation = attrs["activation"]
    fused = t.fused_conv_relu
    if activation == "relu" and fused is not None and sym is not None:
        # cuDNN's fused convolution + bias + relu: one kernel instead of two.
        def conv_relu(x_: Any, w_: Any, b_: Any = None) -> tuple[Any, ...]:
            return (fused(x_, w_, b_, stride, sym, dilation, groups),)

        return conv_relu
    act = torch_activation(t, activation)
    if sym is not None:
        def conv(x_: Any, w_: Any, b_: Any = None) -> tuple[Any, ...]:
            return (act(F.conv2d(x_, w_, b_, stride, sym, dilation, groups)),)
        return conv
    top, left, bottom, right = pads

    def conv_padded(x_: Any, w_: Any, b_: Any = None) -> tuple[Any, ...]:
        return (act(F.conv2d(F.pad(x_, (left, right, top, bottom)), w_, b_, stride, 0,
                             dilation, groups)),)
    return conv_padded


register(OpDef(
    name="conv2d", inputs=(2, 3), torch=_conv_torch, category=Category.LINEAR,
    roles=(_IMAGES, _KERNELS, OperandRole(shapes=((4,), (8,)))),
    attrs=(AttrSpec("stride", (1, 1), pair, tries=STRIDE_TRIES),
           AttrSpec("padding", "same", padding_attr, tries=PADDING_TRIES),
           AttrSpec("dilation", (1, 1), pair, tries=DILATION_TRIES),
           AttrSpec("activation", "none", choice(*ACTIVATIONS), tries=ACTIVATION_TRIES)),
    infer=_conv_infer, evaluate=_conv_eval, export=_conv_export, flops=_conv_flops,
    canonicalize=_conv_canon,
    doc="NCHW convolution; the group count is input channels / weight input channels, as in "
        "TASO, so concatenating weights along the right axis yields grouped convolutions.",
))


def onnx_pads(ctx: OpImportContext, node: onnx.NodeProto, spatial: Sequence[Dim],
              kernel: Sequence[int], stride: Sequence[int], dilation: Sequence[int]
              ) -> str | Pads | None:
    """Translate ONNX auto_pad/pads to a graphsub padding attribute (None: unsupported)."""
    auto = ctx.attr(node, "auto_pad", "NOTSET")
    if isinstance(auto, bytes):
        auto = auto.decode()
    if auto == "SAME_UPPER":
        return "same"
    if auto == "VALID":
        return "valid"
    if auto == "SAME_LOWER":
        if same_over_sizes("same_lower", spatial, stride):
            return "same_lower"
        t, left, b, r = same_pads(spatial, kernel, stride, dilation)
        return (b, r, t, left)
    pads = tuple(ctx.attr(node, "pads", (0, 0, 0, 0)))
    if len(pads) != 4:
        return None
    return pads


def onnx_conv_attrs(ctx: OpImportContext, node: onnx.NodeProto, x: TensorType, w: TensorType
                    ) -> dict[str, Any] | None:
    """An ONNX convolution node's stride, padding and dilation as conv2d's attributes, for
    input and weight types `x`, `w` (None: not a convolution graphsub models: 1-D and 3-D
    ones, groups that do not match the weight, padding it cannot express)."""
    if x.rank != 4 or w.rank != 4 or x.shape[1] != ctx.attr(node, "group", 1) * w.shape[1]:
        return None
    stride = pair(ctx.attr(node, "strides", (1, 1)))
    dilation = pair(ctx.attr(node, "dilations", (1, 1)))
    padding = onnx_pads(ctx, node, x.shape[2:], w.shape[2:], stride, dilation)
    if padding is None:
        return None
    return {"stride": stride, "padding": padding, "dilation": dilation}


@onnx_importer("Conv")
def _import_conv(ctx: OpImportContext, node: onnx.NodeProto) -> list[Value] | None:
    ins = ctx.inputs(node)
    attrs = onnx_conv_attrs(ctx, node, ctx.type_of(ins[0]), ctx.type_of(ins[1]))
    return None if attrs is None else ctx.add("conv2d", ins, **attrs)


def _aten_conv_check(n: AtenCall) -> str | None:
    if n.args["transposed"] or len(n.args["stride"]) != 2:
        return "only 2-D, non-transposed convolutions are modelled"
    return None


@aten_importer("convolution.default", check=_aten_conv_check)
def _aten_convolution(c: AtenBuilder, n: AtenCall) -> object:
    a = n.args
    x, w = c.value(a["input"]), c.value(a["weight"])
    if c.shape(x)[1] != a["groups"] * c.shape(w)[1]:
        raise ConversionError("group count does not match the shapes")
    ph, pw = a["padding"]
    args = [x, w] + ([c.value(a["bias"])] if a["bias"] is not None else [])
    return c.op("conv2d", *args, stride=tuple(a["stride"]), dilation=tuple(a["dilation"]),
                padding=(ph, pw, ph, pw))


# ---- enlarge (TASO) -------------------------------------------------------------------------

def _enlarge_infer(attrs: Attrs, ins: Types) -> Types:
    w = ins[0]
    kh, kw = attrs["kernel"]
    if w.rank != 4:
        raise ShapeError(f"enlarge: the kernel must be 4-D (OIHW), got {w.shape}")
    h, wd = w.shape[2:]
    if kh < h or kw < wd or (kh - h) % 2 or (kw - wd) % 2:
        raise ShapeError(f"enlarge: cannot center a {h}x{wd} kernel in {kh}x{kw}")
    return (TensorType(w.shape[:2] + (kh, kw), w.dtype),)


def _enlarge_pads(attrs: Attrs, shape: tuple[int, ...]) -> tuple[int, int]:
    kh, kw = attrs["kernel"]
    return (kh - shape[2]) // 2, (kw - shape[3]) // 2


def _enlarge_eval(attrs: Attrs, xs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    ph, pw = _enlarge_pads(attrs, xs[0].shape)
    return (np.pad(xs[0], ((0, 0), (0, 0), (ph, ph), (pw, pw))),)


def _enlarge_export(ctx: OpExportContext, attrs: Attrs, ins: list[str], outs: list[str],
                    types: Types) -> None:
    ph, pw = _enlarge_pads(attrs, types[0].shape)
    pads = np.array([0, 0, ph, pw, 0, 0, ph, pw], dtype=np.int64)
    ctx.emit("Pad", [ins[0], ctx.const(pads)], outs, mode="constant")


def _enlarge_torch(t: TorchLowering, attrs: Attrs, ins: Types, outs: Types) -> TorchFn:
    ph, pw = _enlarge_pads(attrs, ins[0].shape)
    return lambda w: (t.F.pad(w, (pw, pw, ph, ph)),)


def _larger_kernel(in_shapes: Sequence[Shape],
                   attrs: Mapping[str, Any]) -> tuple[tuple[int, int], ...]:
    """For the rule check: a kernel two larger than the largest side of the one enlarged."""
    k = max(in_shapes[0][2:]) + 2
    return ((k, k),)


register(OpDef(
    name="enlarge", inputs=(1, 1), category=Category.LAYOUT, roles=(_KERNELS,),
    attrs=(AttrSpec("kernel", convert=pair, tries=_larger_kernel),),
    infer=_enlarge_infer, evaluate=_enlarge_eval, export=_enlarge_export, torch=_enlarge_torch,
    doc="Zero-pad a convolution kernel to a larger size, centred (TASO), so that convolutions "
        "with different kernels can merge. A SAME convolution with the enlarged kernel computes "
        "the same result.",
))
