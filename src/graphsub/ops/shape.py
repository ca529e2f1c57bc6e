"""Data-movement operators: concat, split, transpose, reshape, flatten, squeeze, unsqueeze,
slice and pad. Shape-valued attributes are concrete (ONNX shape inputs are folded at import)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from graphsub.errors import ShapeError
from graphsub.ir.types import Attrs, TensorType
from graphsub.ops.base import (AttrSpec, OpDef, Types, choice, ints, norm_axis, onnx_importer,
                               register, same_dtype, f32)


def _no_flops(attrs: Attrs, ins: Types, outs: Types) -> int:
    return 0


def _axis_canon(values: dict[str, Any], ins: Types, op: str) -> dict[str, Any]:
    if ins and ins[0].rank == 0:
        raise ShapeError(f"{op}: inputs must have at least one dimension")
    if ins:
        values["axis"] = norm_axis(values["axis"], ins[0].rank, op)
    return values


# ---- concat / split ---------------------------------------------------------------------------

def _concat_infer(attrs: Attrs, ins: Types) -> Types:
    dtype = same_dtype("concat", ins)
    axis = attrs["axis"]
    first = ins[0].shape
    for t in ins[1:]:
        if t.rank != len(first) or any(a != b for i, (a, b) in enumerate(zip(first, t.shape))
                                       if i != axis):
            shapes = ", ".join(str(t.shape) for t in ins)
            raise ShapeError(f"concat: shapes {shapes} differ outside axis {axis}")
    size = sum(t.shape[axis] for t in ins)
    return (TensorType(first[:axis] + (size,) + first[axis + 1:], dtype),)


register(OpDef(
    name="concat", inputs=(1, None), attrs=(AttrSpec("axis", convert=int),),
    infer=_concat_infer,
    evaluate=lambda attrs, xs: (np.concatenate(xs, axis=attrs["axis"]),),
    export=lambda ctx, attrs, ins, outs, types: ctx.emit("Concat", ins, outs,
                                                         axis=attrs["axis"]),
    canonicalize=lambda v, ins: _axis_canon(v, ins, "concat"),
    doc="Concatenation of n tensors along one axis.",
))


def _split_infer(attrs: Attrs, ins: Types) -> Types:
    x = ins[0]
    axis, sizes = attrs["axis"], attrs["sizes"]
    if sum(sizes) != x.shape[axis] or min(sizes, default=0) < 0 or not sizes:
        raise ShapeError(f"split: sizes {sizes} do not add up to dimension {axis} of {x.shape}")
    return tuple(TensorType(x.shape[:axis] + (s,) + x.shape[axis + 1:], x.dtype) for s in sizes)


def _split_eval(attrs: Attrs, xs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    cuts = np.cumsum(attrs["sizes"])[:-1]
    return tuple(np.split(xs[0], cuts, axis=attrs["axis"]))


def _split_export(ctx, attrs: Attrs, ins: list[str], outs: list[str], types: Types) -> None:
    sizes = ctx.const(np.array(attrs["sizes"], dtype=np.int64))
    ctx.emit("Split", [ins[0], sizes], outs, axis=attrs["axis"])


register(OpDef(
    name="split", inputs=(1, 1), view="strided",
    attrs=(AttrSpec("axis", convert=int), AttrSpec("sizes", convert=ints)),
    infer=_split_infer, evaluate=_split_eval, export=_split_export,
    canonicalize=lambda v, ins: _axis_canon(v, ins, "split"),
    doc="Split into len(sizes) outputs along one axis, with explicit sizes.",
))


@onnx_importer("Concat")
def _import_concat(ctx, node):
    return ctx.add("concat", ctx.inputs(node), axis=ctx.attr(node, "axis"))


@onnx_importer("Split")
def _import_split(ctx, node):
    x = ctx.inputs(node)[0]
    t = ctx.type_of(x)
    axis = norm_axis(ctx.attr(node, "axis", 0), t.rank, "Split")
    if len(node.input) > 1 and node.input[1]:
        sizes = ctx.constant(node.input[1])
        if sizes is None:
            return None
        sizes = [int(s) for s in sizes]
    elif ctx.attr(node, "split", None) is not None:
        sizes = list(ctx.attr(node, "split"))
    else:
        n = ctx.attr(node, "num_outputs", len(node.output))
        chunk = -(-t.shape[axis] // n)
        sizes = [min(chunk, t.shape[axis] - i * chunk) for i in range(n)]
    return ctx.add("split", [x], axis=axis, sizes=sizes)


# ---- transpose --------------------------------------------------------------------------------

def _transpose_infer(attrs: Attrs, ins: Types) -> Types:
    x, perm = ins[0], attrs["perm"]
    if sorted(perm) != list(range(x.rank)):
        raise ShapeError(f"transpose: {perm} is not a permutation of the {x.rank} axes of {x.shape}")
    return (TensorType(tuple(x.shape[p] for p in perm), x.dtype),)


register(OpDef(
    name="transpose", inputs=(1, 1), view="strided", attrs=(AttrSpec("perm", convert=ints),),
    infer=_transpose_infer,
    evaluate=lambda attrs, xs: (np.asarray(np.transpose(xs[0], attrs["perm"]), order="C"),),
    export=lambda ctx, attrs, ins, outs, types: (
        ctx.emit("Transpose", ins, outs, perm=list(attrs["perm"])) if attrs["perm"]
        else ctx.emit("Identity", ins, outs)),
    canonicalize=lambda v, ins: {**v, "perm": tuple(p % max(ins[0].rank, 1) for p in v["perm"])}
    if ins else v,
))


@onnx_importer("Transpose")
def _import_transpose(ctx, node):
    x = ctx.inputs(node)[0]
    rank = ctx.type_of(x).rank
    perm = ctx.attr(node, "perm", tuple(reversed(range(rank))))
    return ctx.add("transpose", [x], perm=perm)


# ---- reshape, flatten, squeeze, unsqueeze ----------------------------------------------------

def _reshape_infer(attrs: Attrs, ins: Types) -> Types:
    x, shape = ins[0], attrs["shape"]
    if math.prod(shape) != x.numel or min(shape, default=0) < 0:
        raise ShapeError(f"reshape: cannot reshape {x.shape} ({x.numel} elements) to {shape}")
    return (TensorType(shape, x.dtype),)


def _export_reshape(ctx, attrs: Attrs, ins: list[str], outs: list[str], types: Types) -> None:
    ctx.emit("Reshape", [ins[0], ctx.const(np.array(attrs["shape"], dtype=np.int64))], outs)


register(OpDef(
    name="reshape", inputs=(1, 1), view="alias", attrs=(AttrSpec("shape", convert=ints),),
    infer=_reshape_infer,
    evaluate=lambda attrs, xs: (xs[0].reshape(attrs["shape"]),),
    export=_export_reshape,
    doc="Reshape to a concrete shape (ONNX's 0 and -1 are resolved at import).",
))


def resolve_reshape(src: tuple[int, ...], target: Sequence[int], allowzero: bool) -> tuple[int, ...]:
    out = [src[i] if (d == 0 and not allowzero) else int(d) for i, d in enumerate(target)]
    if -1 in out:
        known = math.prod(d for d in out if d != -1)
        out[out.index(-1)] = math.prod(src) // known if known else 0
    return tuple(out)


@onnx_importer("Reshape")
def _import_reshape(ctx, node):
    x = ctx.inputs(node)[0]
    target = ctx.constant(node.input[1])
    if target is None:
        return None
    shape = resolve_reshape(ctx.type_of(x).shape, target.tolist(),
                            bool(ctx.attr(node, "allowzero", 0)))
    return ctx.add("reshape", [x], shape=shape)


def _flatten_infer(attrs: Attrs, ins: Types) -> Types:
    x, axis = ins[0], attrs["axis"]
    return (TensorType((math.prod(x.shape[:axis]), math.prod(x.shape[axis:])), x.dtype),)


def _flatten_canon(values: dict[str, Any], ins: Types) -> dict[str, Any]:
    rank = ins[0].rank
    if not -rank <= values["axis"] <= rank:
        raise ShapeError(f"flatten: axis {values['axis']} is out of range for rank {rank}")
    # ONNX counts a negative axis from the back over the rank (not rank + 1): -1 on (2, 3, 4)
    # flattens to (6, 4).
    values["axis"] = values["axis"] + rank if values["axis"] < 0 else values["axis"]
    return values


register(OpDef(
    name="flatten", inputs=(1, 1), view="alias", attrs=(AttrSpec("axis", 1, int),),
    infer=_flatten_infer,
    evaluate=lambda attrs, xs: (xs[0].reshape(_flatten_infer(
        attrs, (TensorType(xs[0].shape, str(xs[0].dtype)),))[0].shape),),
    export=lambda ctx, attrs, ins, outs, types: ctx.emit("Flatten", ins, outs,
                                                         axis=attrs["axis"]),
    canonicalize=_flatten_canon,
))


@onnx_importer("Flatten")
def _import_flatten(ctx, node):
    return ctx.add("flatten", ctx.inputs(node), axis=ctx.attr(node, "axis", 1))


def _squeeze_canon(values: dict[str, Any], ins: Types) -> dict[str, Any]:
    x = ins[0]
    axes = values["axes"]
    if axes is None:
        axes = tuple(i for i, d in enumerate(x.shape) if d == 1)
    values["axes"] = tuple(sorted(norm_axis(a, x.rank, "squeeze") for a in axes))
    return values


def _squeeze_infer(attrs: Attrs, ins: Types) -> Types:
    x = ins[0]
    for a in attrs["axes"]:
        if x.shape[a] != 1:
            raise ShapeError(f"squeeze: dimension {a} of {x.shape} is not 1")
    return (TensorType(tuple(d for i, d in enumerate(x.shape) if i not in attrs["axes"]),
                       x.dtype),)


def _axes_export(onnx_type: str):
    def export(ctx, attrs: Attrs, ins: list[str], outs: list[str], types: Types) -> None:
        ctx.emit(onnx_type, [ins[0], ctx.const(np.array(attrs["axes"], dtype=np.int64))], outs)

    return export


register(OpDef(
    name="squeeze", inputs=(1, 1), view="alias", attrs=(AttrSpec("axes", None, ints),),
    infer=_squeeze_infer,
    evaluate=lambda attrs, xs: (np.squeeze(xs[0], axis=attrs["axes"]),),
    export=_axes_export("Squeeze"), canonicalize=_squeeze_canon,
    doc="Remove size-1 dimensions (all of them when axes is None).",
))


def _unsqueeze_canon(values: dict[str, Any], ins: Types) -> dict[str, Any]:
    rank = ins[0].rank + len(values["axes"])
    values["axes"] = tuple(sorted(norm_axis(a, rank, "unsqueeze") for a in values["axes"]))
    if len(set(values["axes"])) != len(values["axes"]):
        raise ShapeError(f"unsqueeze: repeated axes {values['axes']}")
    return values


def _unsqueeze_infer(attrs: Attrs, ins: Types) -> Types:
    shape = list(ins[0].shape)
    for a in attrs["axes"]:
        shape.insert(a, 1)
    return (TensorType(tuple(shape), ins[0].dtype),)


register(OpDef(
    name="unsqueeze", inputs=(1, 1), view="alias", attrs=(AttrSpec("axes", convert=ints),),
    infer=_unsqueeze_infer,
    evaluate=lambda attrs, xs: (np.expand_dims(xs[0], attrs["axes"]),),
    export=_axes_export("Unsqueeze"), canonicalize=_unsqueeze_canon,
))


def _axes_input(ctx, node, attr_name: str = "axes") -> list[int] | None | bool:
    """Axes given as the second input (opset 13+) or as an attribute (older). False when the
    input is computed at run time (unsupported)."""
    if len(node.input) > 1 and node.input[1]:
        axes = ctx.constant(node.input[1])
        return False if axes is None else [int(a) for a in np.atleast_1d(axes)]
    value = ctx.attr(node, attr_name, None)
    return None if value is None else list(value)


@onnx_importer("Squeeze")
def _import_squeeze(ctx, node):
    axes = _axes_input(ctx, node)
    if axes is False:
        return None
    return ctx.add("squeeze", ctx.inputs(node)[:1], axes=axes)


@onnx_importer("Unsqueeze")
def _import_unsqueeze(ctx, node):
    axes = _axes_input(ctx, node)
    if axes is False or axes is None:
        return None
    return ctx.add("unsqueeze", ctx.inputs(node)[:1], axes=axes)


# ---- slice ------------------------------------------------------------------------------------

def _slice_canon(values: dict[str, Any], ins: Types) -> dict[str, Any]:
    """Clamp starts/ends to the tensor and normalize axes, as ONNX Slice defines them."""
    x = ins[0]
    starts, ends = values["starts"], values["ends"]
    axes = values["axes"] if values["axes"] is not None else tuple(range(len(starts)))
    steps = values["steps"] if values["steps"] is not None else (1,) * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ShapeError("slice: starts, ends, axes and steps must have the same length")
    norm: dict[int, tuple[int, int, int]] = {}
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = norm_axis(a, x.rank, "slice")
        if a in norm:
            raise ShapeError(f"slice: axis {a} given twice")
        if st == 0:
            raise ShapeError("slice: step must not be 0")
        n = x.shape[a]
        s = s + n if s < 0 else s
        e = e + n if e < 0 else e
        if st > 0:
            s, e = min(max(s, 0), n), min(max(e, 0), n)
        else:
            s, e = min(max(s, 0), n - 1), min(max(e, -1), n - 1)
        norm[a] = (s, e, st)
    order = sorted(norm)
    values.update(axes=tuple(order), starts=tuple(norm[a][0] for a in order),
                  ends=tuple(norm[a][1] for a in order), steps=tuple(norm[a][2] for a in order))
    return values


def _slices(attrs: Attrs, rank: int) -> tuple[slice, ...]:
    sl = [slice(None)] * rank
    for a, s, e, st in zip(attrs["axes"], attrs["starts"], attrs["ends"], attrs["steps"]):
        sl[a] = slice(s, e if e >= 0 else None, st)
    return tuple(sl)


def _slice_infer(attrs: Attrs, ins: Types) -> Types:
    shape = list(ins[0].shape)
    for a, s, e, st in zip(attrs["axes"], attrs["starts"], attrs["ends"], attrs["steps"]):
        shape[a] = len(range(s, e, st))
    return (TensorType(tuple(shape), ins[0].dtype),)


def _slice_export(ctx, attrs: Attrs, ins: list[str], outs: list[str], types: Types) -> None:
    shape = types[0].shape
    # An end of -1 with a negative step means "through index 0"; ONNX reads -1 as the last
    # index, so say it with a value that clamps to before the start instead.
    ends = [e if e >= 0 else -shape[a] - 1 for a, e in zip(attrs["axes"], attrs["ends"])]
    consts = [ctx.const(np.array(v, dtype=np.int64))
              for v in (attrs["starts"], ends, attrs["axes"], attrs["steps"])]
    ctx.emit("Slice", [ins[0], *consts], outs)


register(OpDef(
    name="slice", inputs=(1, 1), view="strided",
    attrs=(AttrSpec("starts", convert=ints), AttrSpec("ends", convert=ints),
           AttrSpec("axes", None, ints), AttrSpec("steps", None, ints)),
    infer=_slice_infer,
    evaluate=lambda attrs, xs: (np.asarray(xs[0][_slices(attrs, xs[0].ndim)], order="C"),),
    export=_slice_export, canonicalize=_slice_canon,
    doc="Strided slice along some axes; bounds are clamped at construction as ONNX does.",
))


@onnx_importer("Slice")
def _import_slice(ctx, node):
    consts = []
    for i in range(1, 5):
        if len(node.input) > i and node.input[i]:
            c = ctx.constant(node.input[i])
            if c is None:
                return None
            consts.append([int(v) for v in np.atleast_1d(c)])
        else:
            consts.append(None)
    starts, ends, axes, steps = consts
    # ONNX uses INT64 extremes for "to the end"; clamp to something our ints hold comfortably.
    big = 2 ** 62
    ends = [max(min(e, big), -big) for e in ends]
    starts = [max(min(s, big), -big) for s in starts]
    return ctx.add("slice", ctx.inputs(node)[:1], starts=starts, ends=ends, axes=axes,
                   steps=steps)


# ---- pad ---------------------------------------------------------------------------------------

def _pad_infer(attrs: Attrs, ins: Types) -> Types:
    x, pads = ins[0], attrs["pads"]
    if len(pads) != 2 * x.rank:
        raise ShapeError(f"pad: needs {2 * x.rank} pad values for rank {x.rank}, got {len(pads)}")
    shape = tuple(d + pads[i] + pads[i + x.rank] for i, d in enumerate(x.shape))
    if min(shape, default=0) < 0:
        raise ShapeError(f"pad: pads {pads} make a negative dimension from {x.shape}")
    return (TensorType(shape, x.dtype),)


def _pad_eval(attrs: Attrs, xs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    x, pads = xs[0], attrs["pads"]
    r = x.ndim
    # Negative pads crop, as in ONNX: crop first, then pad what is positive.
    crop = tuple(slice(max(-pads[i], 0), x.shape[i] - max(-pads[i + r], 0)) for i in range(r))
    x = x[crop]
    width = tuple((max(pads[i], 0), max(pads[i + r], 0)) for i in range(r))
    if attrs["mode"] == "constant":
        return (np.pad(x, width, constant_values=np.array(attrs["value"], x.dtype)),)
    return (np.pad(x, width, mode="reflect" if attrs["mode"] == "reflect" else "edge"),)


def _pad_export(ctx, attrs: Attrs, ins: list[str], outs: list[str], types: Types) -> None:
    pads = ctx.const(np.array(attrs["pads"], dtype=np.int64))
    inputs = [ins[0], pads]
    if attrs["mode"] == "constant" and attrs["value"] != 0:
        inputs.append(ctx.const(np.array(attrs["value"], dtype=types[0].dtype)))
    ctx.emit("Pad", inputs, outs, mode=attrs["mode"])


register(OpDef(
    name="pad", inputs=(1, 1),
    attrs=(AttrSpec("pads", convert=ints), AttrSpec("mode", "constant",
                                                    choice("constant", "reflect", "edge")),
           AttrSpec("value", 0.0, f32)),
    infer=_pad_infer, evaluate=_pad_eval, export=_pad_export,
    doc="Pad (or crop, with negative pads) every axis; pads are (begin..., end...) as in ONNX.",
))


@onnx_importer("Pad")
def _import_pad(ctx, node):
    x = ctx.inputs(node)[0]
    rank = ctx.type_of(x).rank
    pads = ctx.constant(node.input[1]) if len(node.input) > 1 else None
    if pads is None:
        return None
    pads = [int(p) for p in pads]
    value = 0.0
    if len(node.input) > 2 and node.input[2]:
        c = ctx.constant(node.input[2])
        if c is None:
            return None
        value = float(c)
    if len(node.input) > 3 and node.input[3]:
        axes = ctx.constant(node.input[3])
        if axes is None:
            return None
        full = [0] * (2 * rank)
        axes = [norm_axis(int(a), rank, "Pad") for a in axes]
        for i, a in enumerate(axes):
            full[a], full[a + rank] = pads[i], pads[i + len(axes)]
        pads = full
    mode = ctx.attr(node, "mode", "constant")
    if mode not in ("constant", "reflect", "edge"):
        return None
    return ctx.add("pad", [x], pads=pads, mode=mode, value=value)
