"""graphsub operators as torch code: one lowering per operator of the registry.

A lowering is called once, when a program is built, with the node's attributes and its input
and output types; it returns a function of the input tensors that uses torch operations only,
with every shape, pad and index resolved ahead (no `.shape`, `.item()` or host round trip at run
time), so the same function runs eagerly, is traced into an FX graph, captured in a CUDA graph
or handed to inductor. Constants a lowering needs (index tensors, divisors) are made once by the
context and live on the device.

Operators that torch can express as views (transpose, reshape, split, slices with positive
steps, ...) are lowered to views: no kernel runs and no data moves, and a matmul reading a
transposed view hands the transpose to the BLAS as an operand layout (TASO section 7.5).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from graphsub.errors import GraphsubError
from graphsub.ir.types import Attrs, TensorType
from graphsub.ops import view_ops
from graphsub.ops.conv import resolve_pads

Types = tuple[TensorType, ...]
Fn = Callable[..., tuple[Any, ...]]


class LowerContext:
    """What a lowering may ask of the program being built: constants on the device, and
    calls that must not be traced (the onnxruntime fallback of opaque nodes)."""

    def __init__(self, device: torch.device,
                 const: Callable[[np.ndarray], Any] | None = None,
                 leaf: Callable[..., Any] | None = None) -> None:
        self.device = device
        self._const = const
        self._leaf = leaf

    def const(self, array: np.ndarray) -> Any:
        if self._const is not None:
            return self._const(array)
        return torch.as_tensor(np.array(array), device=self.device)

    def leaf(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self._leaf(fn, *args) if self._leaf is not None else fn(*args)


LowerFn = Callable[[LowerContext, Attrs, Types, Types], Fn]
LOWERINGS: dict[str, LowerFn] = {}
#: Ops lowered to views of their input (no kernel): torch takes strided views too (slices
#: only when every step is positive).
VIEW_OPS = view_ops("alias", "strided")

_DTYPES = {
    "float32": torch.float32, "float16": torch.float16, "float64": torch.float64,
    "bfloat16": torch.bfloat16, "int8": torch.int8, "int16": torch.int16,
    "int32": torch.int32, "int64": torch.int64, "uint8": torch.uint8, "uint16": torch.uint16,
    "uint32": torch.uint32, "uint64": torch.uint64, "bool": torch.bool,
}


def torch_dtype(name: str) -> torch.dtype:
    return _DTYPES[name]


def lowers(*ops: str) -> Callable[[LowerFn], LowerFn]:
    def deco(fn: LowerFn) -> LowerFn:
        for op in ops:
            LOWERINGS[op] = fn
        return fn

    return deco


class NoLoweringError(GraphsubError):
    """An operator has no torch lowering on this device."""


def lower(ctx: LowerContext, op: str, attrs: Attrs, ins: Types, outs: Types) -> Fn:
    fn = LOWERINGS.get(op)
    if fn is None:
        raise NoLoweringError(f"graphsub's torch backend cannot run operator {op!r}")
    return fn(ctx, attrs, ins, outs)


def is_float(t: TensorType) -> bool:
    return t.dtype.startswith(("float", "bfloat"))


# ---- element-wise ---------------------------------------------------------------------------

def _activation(name: str) -> Callable[[Any], Any]:
    return {"none": lambda y: y, "relu": torch.relu, "sigmoid": torch.sigmoid,
            "tanh": torch.tanh}[name]


def _pointwise(fn: Callable[..., Any]) -> LowerFn:
    """The lowering of an op that is one torch function of its inputs, without attributes."""
    def lower_pointwise(ctx: LowerContext, attrs: Attrs, ins: Types, outs: Types) -> Fn:
        return lambda *xs: (fn(*xs),)

    return lower_pointwise


LOWERINGS.update({name: _pointwise(fn) for name, fn in {
    "relu": torch.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh, "erf": torch.erf,
    "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt, "neg": torch.neg,
    "reciprocal": torch.reciprocal, "add": torch.add, "sub": torch.sub, "mul": torch.mul,
    "pow": torch.pow, "smul": torch.mul,
}.items()})


@lowers("identity", "dropout")
def _identity(ctx: LowerContext, attrs: Attrs, ins: Types, outs: Types) -> Fn:
    return lambda x: (x,)


@lowers("gelu")
def _gelu(ctx: LowerContext, attrs: Attrs, ins: Types, outs: Types) -> Fn:
    approximate = attrs["approximate"]
    return lambda x: (F.gelu(x, approximate=approximate),)


@lowers("leaky_relu")
def _leaky_relu(ctx: LowerContext, attrs: Attrs, ins: Types, outs: Types) -> Fn:
    alpha = attrs["alpha"]
    return lambda x: (F.leaky_relu(x, alpha),)


@lowers("clip")
def _clip(ctx: LowerContext, attrs: Attrs, ins: Types, outs: Types) -> Fn:
    # Bounds converted to the tensor's dtype as the numpy reference does (an integer tensor
    # clipped at -0.5 is clipped at 0).
    dtype = np.dtype(ins[0].dtype) if ins[0].dtype != "bfloat16" else np.dtype("float32")
    lo = None if attrs["min"] is None else np.array(attrs["min"], dtype).item()
    hi = None if attrs["max"] is None else np.array(attrs["max"], dtype).item()
    if lo is None and hi is None:
        return lambda x: (x,)
    return lambda x: (torch.clamp(x, lo, hi),)


@lowers("cast")
def _cast(ctx: LowerContext, attrs: Attrs, ins: Types, outs: Types) -> Fn:
    dtype = torch_dtype(attrs["to"])
    return lambda x: (x.to(dtype),)


@lowers("div")
def _div(ctx: LowerContext, attrs: Attrs, ins: Types, outs: Types) -> Fn:
    if is_float(ins[0]):
        return lambda a, b: (torch.div(a, b),)
    return lambda a, b: (torch.div(a, b, rounding_mode="trunc"),)  # ONNX integer division


# ---- linear algebra and convolution ------------------------------------------------------

@lowers("matmul")
def _matmul(ctx: LowerContext, attrs: Attrs, ins: Types, outs: Types) -> Fn:
    act = _activation(attrs["activation"])
    return lambda a, b: (act(torch.matmul(a, b)),)


def _symmetric(pads: tuple[int, int, int, int]) -> tuple[int, int] | None:
    t, left, b, r = pads
    return (t, left) if (t, left) == (b, r) else None


@lowers("conv2d")
def _conv2d(ctx: LowerContext, attrs: Attrs, ins: Types, outs: Types) -> Fn:
    x, w = ins[0], ins[1]
    groups = x.shape[1] // w.shape[1]
    stride, dilation = tuple(attrs["stride"]), tuple(attrs["dilation"])
    pads = resolve_pads(attrs["padding"], x.shape[2:], w.shape[2:], stride, dilation)
    sym = _symmetric(pads)
    activation = attrs["activation"]
    fused = getattr(ctx, "fused_conv_relu", None)
    if activation == "relu" and fused is not None and sym is not None:
        # cuDNN's fused convolution + bias + relu: one kernel instead of two.
        def conv_relu(x_, w_, b_=None):
            return (fused(x_, w_, b_, stride, sym, dilation, groups),)

        return conv_relu
    act = _activation(activation)
    if sym is not None:
        def conv(x_, w_, b_=None):
            return (act(F.conv2d(x_, w_, b_, stride, sym, dilation, groups)),)
        return conv
    t, left, b, r = pads

    def conv_padded(x_, w_, b_=None):
        return (act(F.conv2d(F.pad(x_, (left, r, t, b)), w_, b_, stride, 0, dilation,
                             groups)),)
    return conv_padded


@lowers("enlarge")
def _enlarge(ctx: LowerContext, attrs: Attrs, ins: Types, outs: Types) -> Fn:
    kh, kw = attrs["kernel"]
    ph, pw = (kh - ins[0].shape[2]) // 2, (kw - ins[0].shape[3]) // 2
    return lambda w: (F.pad(w, (pw, pw, ph, ph)),)


# ---- pooling ------------------------------------------------------------------------------

def _pool_pads(attrs: Attrs, x: TensorType) -> tuple[tuple[int, int, int, int], bool]:
    """The pads, and whether torch's built-in (symmetric, at most half the kernel) padding
    expresses them."""
    pads = resolve_pads(attrs["padding"], x.shape[2:], attrs["kernel"], attrs["stride"])
    sym = _symmetric(pads)
    k = attrs["kernel"]
    builtin = sym is not None and sym[0] <= k[0] // 2 and sym[1] <= k[1] // 2
    return pads, builtin


@lowers("max_pool2d")
def _max_pool(ctx: LowerContext, attrs: Attrs, ins: Types, outs: Types) -> Fn:
    k, s = tuple(attrs["kernel"]), tuple(attrs["stride"])
    pads, builtin = _pool_pads(attrs, ins[0])
    if builtin:
        p = (pads[0], pads[1])
        return lambda x: (F.max_pool2d(x, k, s, p),)
    t, left, b, r = pads
    low = -math.inf if is_float(ins[0]) else int(np.iinfo(np.dtype(ins[0].dtype)).min)
    return lambda x: (F.max_pool2d(F.pad(x, (left, r, t, b), value=low), k, s),)


@lowers("avg_pool2d")
def _avg_pool(ctx: LowerContext, attrs: Attrs, ins: Types, outs: Types) -> Fn:
    k, s = tuple(attrs["kernel"]), tuple(attrs["stride"])
    include = bool(attrs["count_include_pad"])
    pads, builtin = _pool_pads(attrs, ins[0])
    if builtin:
        p = (pads[0], pads[1])
        return lambda x: (F.avg_pool2d(x, k, s, p, count_include_pad=include),)
    t, left, b, r = pads
    if include or not any(pads):
        return lambda x: (F.avg_pool2d(F.pad(x, (left, r, t, b)), k, s),)
    # Padded cells do not count: rescale the zero-padded average by kernel area / real cells.
    h, w = ins[0].shape[2:]
    ones = np.pad(np.ones((h, w)), ((t, b), (left, r)))
    ho, wo = outs[0].shape[2:]
    counts = np.array([[ones[i * s[0]:i * s[0] + k[0], j * s[1]:j * s[1] + k[1]].sum()
                        for j in range(wo)] for i in range(ho)])
    scale = ctx.const((k[0] * k[1] / counts).astype(ins[0].dtype).reshape(1, 1, ho, wo))
    return lambda x: (F.avg_pool2d(F.pad(x, (left, r, t, b)), k, s) * scale,)


@lowers("global_avg_pool")
def _global_avg_pool(ctx: LowerContext, attrs: Attrs, ins: Types, outs: Types) -> Fn:
    dims = tuple(range(2, ins[0].rank))
    return lambda x: (torch.mean(x, dim=dims, keepdim=True),)


# ---- data movement --------------------------------------------------------------------------

@lowers("concat")
def _concat(ctx: LowerContext, attrs: Attrs, ins: Types, outs: Types) -> Fn:
    axis = attrs["axis"]
    return lambda *xs: (torch.cat(xs, axis),)


@lowers("split")
def _split(ctx: LowerContext, attrs: Attrs, ins: Types, outs: Types) -> Fn:
    sizes, axis, n = list(attrs["sizes"]), attrs["axis"], len(attrs["sizes"])

    def split(x):
        parts = torch.split(x, sizes, axis)  # views
        return tuple(parts[i] for i in range(n))  # indexed: a traced split is not iterable

    return split


@lowers("transpose")
def _transpose(ctx: LowerContext, attrs: Attrs, ins: Types, outs: Types) -> Fn:
    perm = tuple(attrs["perm"])
    return lambda x: (x.permute(perm),)


@lowers("reshape", "flatten", "squeeze", "unsqueeze")
def _reshape(ctx: LowerContext, attrs: Attrs, ins: Types, outs: Types) -> Fn:
    shape = tuple(outs[0].shape)
    return lambda x: (x.reshape(shape),)  # a view whenever the strides allow one


@lowers("slice")
def _slice(ctx: LowerContext, attrs: Attrs, ins: Types, outs: Types) -> Fn:
    rank = ins[0].rank
    forward = [slice(None)] * rank
    backward: list[tuple[int, Any]] = []
    for a, s, e, st in zip(attrs["axes"], attrs["starts"], attrs["ends"], attrs["steps"]):
        if st > 0:
            forward[a] = slice(s, e, st)
        else:  # torch has no negative steps: gather the indices instead
            idx = np.arange(ins[0].shape[a])[slice(s, e if e >= 0 else None, st)]
            backward.append((a, ctx.const(idx.astype(np.int64))))
    key = tuple(forward)

    def slice_(x):
        y = x[key]
        for axis, index in backward:
            y = torch.index_select(y, axis, index)
        return (y,)

    return slice_


@lowers("pad")
def _pad(ctx: LowerContext, attrs: Attrs, ins: Types, outs: Types) -> Fn:
    pads, rank, mode = attrs["pads"], ins[0].rank, attrs["mode"]
    if mode == "constant":
        flat: list[int] = []
        for axis in reversed(range(rank)):  # torch lists the last axis first
            flat += [pads[axis], pads[axis + rank]]
        value = attrs["value"]
        if not is_float(ins[0]):
            value = int(value)
        return lambda x: (F.pad(x, flat, value=value),)
    # reflect / edge: crop what is negative, then gather each padded axis with the indices
    # numpy's own pad computes (exact for every rank and pad width).
    shape = ins[0].shape
    crop = tuple(slice(max(-pads[i], 0), shape[i] - max(-pads[i + rank], 0)) for i in range(rank))
    np_mode = "reflect" if mode == "reflect" else "edge"
    gathers = []
    for axis in range(rank):
        before, after = max(pads[axis], 0), max(pads[axis + rank], 0)
        if before or after:
            n = len(range(*crop[axis].indices(shape[axis])))
            idx = np.pad(np.arange(n), (before, after), mode=np_mode).astype(np.int64)
            gathers.append((axis, ctx.const(idx)))

    def pad(x):
        y = x[crop]
        for axis, index in gathers:
            y = torch.index_select(y, axis, index)
        return (y,)

    return pad


# ---- reductions and normalizations ---------------------------------------------------------

def _make_reduce(kind: str) -> LowerFn:
    def lower_reduce(ctx: LowerContext, attrs: Attrs, ins: Types, outs: Types) -> Fn:
        axes, keep = tuple(attrs["axes"]), bool(attrs["keepdims"])
        if not axes:
            return lambda x: (x,)
        if kind == "max":
            return lambda x: (torch.amax(x, dim=axes, keepdim=keep),)
        if kind == "sum":
            return lambda x: (torch.sum(x, dim=axes, keepdim=keep, dtype=x.dtype),)
        if is_float(ins[0]):
            return lambda x: (torch.mean(x, dim=axes, keepdim=keep),)
        dtype = torch_dtype(ins[0].dtype)  # the reference averages integers in float64
        return lambda x: (torch.mean(x.double(), dim=axes, keepdim=keep).to(dtype),)

    return lower_reduce


for _kind in ("sum", "mean", "max"):
    LOWERINGS[f"reduce_{_kind}"] = _make_reduce(_kind)


@lowers("softmax")
def _softmax(ctx: LowerContext, attrs: Attrs, ins: Types, outs: Types) -> Fn:
    axis = attrs["axis"]
    return lambda x: (torch.softmax(x, axis),)


@lowers("layer_norm")
def _layer_norm(ctx: LowerContext, attrs: Attrs, ins: Types, outs: Types) -> Fn:
    norm_shape = tuple(ins[0].shape[attrs["axis"]:])
    eps = attrs["epsilon"]
    # torch wants scale and shift of exactly the normalized shape; ours may broadcast to it.
    fit = [t.shape != norm_shape for t in ins[1:]]

    def layer_norm(x, scale, bias=None):
        if fit[0]:
            scale = scale.expand(norm_shape).contiguous()
        if bias is not None and fit[1]:
            bias = bias.expand(norm_shape).contiguous()
        return (F.layer_norm(x, norm_shape, scale, bias, eps),)

    return layer_norm


@lowers("batch_norm")
def _batch_norm(ctx: LowerContext, attrs: Attrs, ins: Types, outs: Types) -> Fn:
    eps = attrs["epsilon"]
    return lambda x, scale, bias, mean, var: (
        F.batch_norm(x, mean, var, scale, bias, False, 0.0, eps),)


# ---- opaque: onnxruntime on the host ---------------------------------------------------------

@lowers("opaque")
def _opaque(ctx: LowerContext, attrs: Attrs, ins: Types, outs: Types) -> Fn:
    if ctx.device.type != "cpu":
        raise NoLoweringError(
            f"graphsub's torch backend cannot run the ONNX op {attrs['op_type']!r} on "
            f"{ctx.device.type}: it is not one of graphsub's operators, and only on the CPU does "
            "the torch backend run such ops through onnxruntime. Use --target ort-cuda or "
            "torch-cpu for this model")
    from graphsub.ops import get_op

    evaluate = get_op("opaque").evaluate
    n = len(outs)

    def run_in_onnxruntime(*xs):
        arrays = [x.detach().contiguous().numpy() for x in xs]
        return tuple(torch.from_numpy(np.array(y)) for y in evaluate(attrs, arrays))

    def opaque(*xs):
        res = ctx.leaf(run_in_onnxruntime, *xs)
        return tuple(res[i] for i in range(n))

    return opaque


def lowered_ops() -> Sequence[str]:
    return sorted(LOWERINGS)
