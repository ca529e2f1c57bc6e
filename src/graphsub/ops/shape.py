"""Data-movement operators: concat, split, transpose, reshape, flatten, squeeze, unsqueeze,
slice and pad.

Size-valued attributes (a reshape's target, a split's sizes, a slice's bounds) are numbers or
size expressions (graphsub.tensors.symbolic): ONNX shape inputs computed from the model's shapes
are evaluated at import into expressions, and written back as computations of the shapes
(`OpExportContext.sizes`), so a model with a dynamic batch keeps it."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from graphsub.errors import ShapeError
from graphsub.tensors.types import Attrs, TensorType
from graphsub.ops.base import (AXES_TRIES, AXIS_TRIES, AtenBuilder, AtenCall, AttrSpec, Category,
                               ExportFn, OpDef, Shape, TorchFn, TorchLowering, Types, aten_importer,
                               broadcast_shapes, broadcasts_to, choice, f32, ints, is_float,
                               norm_axis, onnx_importer, register, same_dim, same_dtype,
                               size_dims)
from graphsub.tensors.symbolic import (Dim, at_most, ceildiv, floordiv, is_negative,
                                  is_symbolic, product)

from graphsub.ops.contexts import OpExportContext, OpImportContext
from graphsub.tensors.values import Value

if TYPE_CHECKING:
    import onnx
    import sympy


def _torch_reshape(t: TorchLowering, attrs: Attrs, ins: Types, outs: Types) -> TorchFn:
    """Every alias operator in torch: a reshape to the output's shape, a view whenever the
    strides allow one."""
    shape = tuple(outs[0].shape)
    return lambda x: (x.reshape(shape),)


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
        if t.rank != len(first) or any(not same_dim(a, b) for i, (a, b)
                                       in enumerate(zip(first, t.shape)) if i != axis):
            shapes = ", ".join(str(t.shape) for t in ins)
            raise ShapeError(f"concat: shapes {shapes} differ outside axis {axis}")
    size = sum(t.shape[axis] for t in ins)
    return (TensorType(first[:axis] + (size,) + first[axis + 1:], dtype),)


def _concat_torch(t: TorchLowering, attrs: Attrs, ins: Types, outs: Types) -> TorchFn:
    axis, cat = attrs["axis"], t.torch.cat
    return lambda *xs: (cat(xs, axis),)


register(OpDef(
    name="concat", inputs=(1, None), attrs=(AttrSpec("axis", convert=int, tries=AXIS_TRIES),),
    category=Category.LAYOUT,
    infer=_concat_infer, torch=_concat_torch,
    evaluate=lambda attrs, xs: (np.concatenate(xs, axis=attrs["axis"]),),
    export=lambda ctx, attrs, ins, outs, types: ctx.emit("Concat", ins, outs,
                                                         axis=attrs["axis"]),
    canonicalize=lambda v, ins: _axis_canon(v, ins, "concat"),
    doc="Concatenation of n tensors along one axis.",
))


def _split_infer(attrs: Attrs, ins: Types) -> Types:
    x = ins[0]
    axis, sizes = attrs["axis"], attrs["sizes"]
    if (not sizes or not same_dim(sum(sizes), x.shape[axis])
            or any(type(s) is int and s < 0 for s in sizes)):
        raise ShapeError(f"split: sizes {sizes} do not add up to dimension {axis} of {x.shape}")
    return tuple(TensorType(x.shape[:axis] + (s,) + x.shape[axis + 1:], x.dtype) for s in sizes)


def _split_eval(attrs: Attrs, xs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    cuts = np.cumsum(attrs["sizes"])[:-1]
    return tuple(np.split(xs[0], cuts, axis=attrs["axis"]))


def _split_export(ctx: OpExportContext, attrs: Attrs, ins: list[str], outs: list[str],
                  types: Types) -> None:
    ctx.emit("Split", [ins[0], ctx.sizes(attrs["sizes"])], outs, axis=attrs["axis"])


def _split_torch(t: TorchLowering, attrs: Attrs, ins: Types, outs: Types) -> TorchFn:
    sizes, axis, n = list(attrs["sizes"]), attrs["axis"], len(attrs["sizes"])
    split_ = t.torch.split

    def split(x: Any) -> tuple[Any, ...]:
        parts = split_(x, sizes, axis)  # views
        return tuple(parts[i] for i in range(n))  # indexed: a traced split is not iterable

    return split


def _halves(in_shapes: Sequence[Shape], attrs: Mapping[str, Any]) -> tuple[tuple[int, ...]]:
    """For the rule check: the split axis cut in two halves (one part where it is shorter)."""
    n = in_shapes[0][attrs.get("axis", 0)] if in_shapes[0] else 0
    return ((n // 2, n - n // 2) if n >= 2 else (n,),)


register(OpDef(
    name="split", inputs=(1, 1), view="strided", torch=_split_torch, category=Category.LAYOUT,
    attrs=(AttrSpec("axis", convert=int, tries=AXIS_TRIES),
           AttrSpec("sizes", convert=size_dims, tries=_halves)),
    infer=_split_infer, evaluate=_split_eval, export=_split_export,
    canonicalize=lambda v, ins: _axis_canon(v, ins, "split"),
    doc="Split into len(sizes) outputs along one axis, with explicit sizes.",
))


@onnx_importer("Concat")
def _import_concat(ctx: OpImportContext, node: onnx.NodeProto) -> list[Value]:
    return ctx.add("concat", ctx.inputs(node), axis=ctx.attr(node, "axis"))


@onnx_importer("Split")
def _import_split(ctx: OpImportContext, node: onnx.NodeProto) -> list[Value] | None:
    x = ctx.inputs(node)[0]
    t = ctx.type_of(x)
    axis = norm_axis(ctx.attr(node, "axis", 0), t.rank, "Split")
    sizes: Sequence[Dim] | None
    if len(node.input) > 1 and node.input[1]:
        sizes = ctx.sizes_of(node.input[1])
        if sizes is None:
            return None
    elif ctx.attr(node, "split", None) is not None:
        sizes = list(ctx.attr(node, "split"))
    else:
        n = ctx.attr(node, "num_outputs", len(node.output))
        length = t.shape[axis]
        if is_symbolic(length):
            if n != 1:  # the last part's size depends on the length's remainder
                return None
            sizes = [length]
        else:
            chunk = -(-length // n)
            sizes = [min(chunk, length - i * chunk) for i in range(n)]
    return ctx.add("split", [x], axis=axis, sizes=sizes)


# ---- transpose --------------------------------------------------------------------------------

def _transpose_infer(attrs: Attrs, ins: Types) -> Types:
    x, perm = ins[0], attrs["perm"]
    if sorted(perm) != list(range(x.rank)):
        raise ShapeError(f"transpose: {perm} is not a permutation of the {x.rank} axes of {x.shape}")
    return (TensorType(tuple(x.shape[p] for p in perm), x.dtype),)


def _transpose_torch(t: TorchLowering, attrs: Attrs, ins: Types, outs: Types) -> TorchFn:
    perm = tuple(attrs["perm"])
    return lambda x: (x.permute(perm),)


def _permutations(in_shapes: Sequence[Shape], attrs: Mapping[str, Any]
                  ) -> tuple[tuple[int, ...], ...]:
    """For the rule check: the axes reversed (a permutation of every rank), the last two
    swapped, the first two swapped and a rotation: a rule right only for one kind of
    permutation (an involution, one that fixes the leading axes) differs at another."""
    rank = len(in_shapes[0])
    axes = list(range(rank))
    found = [tuple(reversed(axes))]
    if rank >= 2:
        found += [tuple(axes[:-2] + [rank - 1, rank - 2]), tuple([1, 0] + axes[2:]),
                  tuple(axes[1:] + axes[:1])]
    return tuple(dict.fromkeys(found))


register(OpDef(
    name="transpose", inputs=(1, 1), view="strided", category=Category.LAYOUT,
    attrs=(AttrSpec("perm", convert=ints, tries=_permutations),),
    infer=_transpose_infer, torch=_transpose_torch,
    evaluate=lambda attrs, xs: (np.asarray(np.transpose(xs[0], attrs["perm"]), order="C"),),
    export=lambda ctx, attrs, ins, outs, types: (
        ctx.emit("Transpose", ins, outs, perm=list(attrs["perm"])) if attrs["perm"]
        else ctx.emit("Identity", ins, outs)),
    canonicalize=lambda v, ins: {**v, "perm": tuple(p % max(ins[0].rank, 1) for p in v["perm"])}
    if ins else v,
))


@onnx_importer("Transpose")
def _import_transpose(ctx: OpImportContext, node: onnx.NodeProto) -> list[Value]:
    x = ctx.inputs(node)[0]
    rank = ctx.type_of(x).rank
    perm = ctx.attr(node, "perm", tuple(reversed(range(rank))))
    return ctx.add("transpose", [x], perm=perm)


# ---- reshape, flatten, squeeze, unsqueeze ----------------------------------------------------

def _reshape_infer(attrs: Attrs, ins: Types) -> Types:
    x, shape = ins[0], attrs["shape"]
    if not same_dim(product(shape), x.numel) or any(type(d) is int and d < 0 for d in shape):
        raise ShapeError(f"reshape: cannot reshape {x.shape} ({x.numel} elements) to {shape}")
    return (TensorType(shape, x.dtype),)


def _export_reshape(ctx: OpExportContext, attrs: Attrs, ins: list[str], outs: list[str],
                    types: Types) -> None:
    ctx.emit("Reshape", [ins[0], ctx.reshape_target(types[0].shape, attrs["shape"])], outs)


def _reshapes(in_shapes: Sequence[Shape], attrs: Mapping[str, Any]) -> tuple[Shape, ...]:
    """For the rule check: flatten, insert or drop a dimension of size 1 (what reshapes
    around batch-1 models do), so that rules about unit reshapes have examples; and the same
    rank with the sizes reversed, which moves elements across the last axis (a rule right
    only for reshapes that keep it differs there)."""
    shape = in_shapes[0]
    found = [(math.prod(shape),), (1,) + shape, tuple(d for d in shape if d != 1)]
    if len(shape) >= 2 and shape[::-1] != shape:
        found.append(tuple(shape[::-1]))
    return tuple(dict.fromkeys(found))


register(OpDef(
    name="reshape", inputs=(1, 1), view="alias", category=Category.LAYOUT,
    attrs=(AttrSpec("shape", convert=size_dims, tries=_reshapes),),
    infer=_reshape_infer, torch=_torch_reshape,
    evaluate=lambda attrs, xs: (xs[0].reshape(attrs["shape"]),),
    export=_export_reshape,
    doc="Reshape to a shape of sizes (ONNX's 0 and -1 are resolved at import).",
))


def resolve_reshape(src: tuple[Dim, ...], target: Sequence[Dim], allowzero: bool
                    ) -> tuple[Dim, ...]:
    """ONNX Reshape's target with its 0 (copy the input's dimension) and -1 (what is left)
    written out, for numbers and size expressions alike."""
    out = [src[i] if (type(d) is int and d == 0 and not allowzero) else d
           for i, d in enumerate(target)]
    holes = [i for i, d in enumerate(out) if type(d) is int and d == -1]
    if holes:
        known = product(d for i, d in enumerate(out) if i != holes[0])
        out[holes[0]] = floordiv(product(src), known) if known != 0 else 0
    return tuple(out)


@onnx_importer("Reshape")
def _import_reshape(ctx: OpImportContext, node: onnx.NodeProto) -> list[Value] | None:
    x = ctx.inputs(node)[0]
    target = ctx.sizes_of(node.input[1])
    if target is None:
        return None
    shape = resolve_reshape(ctx.type_of(x).shape, target, bool(ctx.attr(node, "allowzero", 0)))
    return ctx.add("reshape", [x], shape=shape)


def _flatten_infer(attrs: Attrs, ins: Types) -> Types:
    x, axis = ins[0], attrs["axis"]
    return (TensorType((product(x.shape[:axis]), product(x.shape[axis:])), x.dtype),)


def _flatten_canon(values: dict[str, Any], ins: Types) -> dict[str, Any]:
    rank = ins[0].rank
    if not -rank <= values["axis"] <= rank:
        raise ShapeError(f"flatten: axis {values['axis']} is out of range for rank {rank}")
    # ONNX counts a negative axis from the back over the rank (not rank + 1): -1 on (2, 3, 4)
    # flattens to (6, 4).
    values["axis"] = values["axis"] + rank if values["axis"] < 0 else values["axis"]
    return values


register(OpDef(
    name="flatten", inputs=(1, 1), view="alias", category=Category.LAYOUT,
    attrs=(AttrSpec("axis", 1, int, tries=AXIS_TRIES),),
    infer=_flatten_infer, torch=_torch_reshape,
    evaluate=lambda attrs, xs: (xs[0].reshape(_flatten_infer(
        attrs, (TensorType(xs[0].shape, str(xs[0].dtype)),))[0].shape),),
    export=lambda ctx, attrs, ins, outs, types: ctx.emit("Flatten", ins, outs,
                                                         axis=attrs["axis"]),
    canonicalize=_flatten_canon,
))


@onnx_importer("Flatten")
def _import_flatten(ctx: OpImportContext, node: onnx.NodeProto) -> list[Value]:
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


def _axes_export(onnx_type: str) -> ExportFn:
    def export(ctx: OpExportContext, attrs: Attrs, ins: list[str], outs: list[str],
               types: Types) -> None:
        ctx.emit(onnx_type, [ins[0], ctx.const(np.array(attrs["axes"], dtype=np.int64))], outs)

    return export


register(OpDef(
    name="squeeze", inputs=(1, 1), view="alias", category=Category.LAYOUT,
    attrs=(AttrSpec("axes", None, ints, tries=AXES_TRIES),),
    infer=_squeeze_infer, torch=_torch_reshape,
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
    name="unsqueeze", inputs=(1, 1), view="alias", category=Category.LAYOUT,
    attrs=(AttrSpec("axes", convert=ints, tries=AXES_TRIES),),
    infer=_unsqueeze_infer, torch=_torch_reshape,
    evaluate=lambda attrs, xs: (np.expand_dims(xs[0], attrs["axes"]),),
    export=_axes_export("Unsqueeze"), canonicalize=_unsqueeze_canon,
))


# ---- expand ----------------------------------------------------------------------------------

def _expand_infer(attrs: Attrs, ins: Types) -> Types:
    x, shape = ins[0], attrs["shape"]
    if not broadcasts_to(x.shape, shape):
        raise ShapeError(f"expand: {x.shape} does not broadcast to {shape}")
    return (TensorType(tuple(shape), x.dtype),)


def _torch_expand(t: TorchLowering, attrs: Attrs, ins: Types, outs: Types) -> TorchFn:
    """A view with stride 0 along the broadcast axes: no data moves until an operator that
    needs contiguous memory copies it (grouped-query attention's copies of the keys)."""
    shape = tuple(outs[0].shape)
    return lambda x: (x.expand(shape),)


def _expansions(in_shapes: Sequence[Shape], attrs: Mapping[str, Any]) -> tuple[Shape, ...]:
    """For the rule check: each axis of size 1 widened to 3, and a new leading axis."""
    shape = in_shapes[0]
    return (tuple(3 if d == 1 else d for d in shape), (2,) + tuple(shape))


register(OpDef(
    name="expand", inputs=(1, 1), view="strided", category=Category.LAYOUT,
    attrs=(AttrSpec("shape", convert=size_dims, tries=_expansions),),
    infer=_expand_infer, torch=_torch_expand,
    evaluate=lambda attrs, xs: (np.ascontiguousarray(np.broadcast_to(xs[0], attrs["shape"])),),
    export=lambda ctx, attrs, ins, outs, types: ctx.emit(
        "Expand", [ins[0], ctx.sizes(list(attrs["shape"]))], outs),
    doc="Broadcast to a shape (ONNX Expand, torch's expand): axes of size 1 repeated, new "
        "leading axes added.",
))


@onnx_importer("Expand")
def _import_expand(ctx: OpImportContext, node: onnx.NodeProto) -> list[Value] | None:
    """Expand with a shape known at import (numbers or size expressions); its output is the
    broadcast of the input's shape and the given one, as ONNX defines it."""
    x = ctx.inputs(node)[0]
    target = ctx.sizes_of(node.input[1])
    if target is None:
        return None
    shape = broadcast_shapes((ctx.type_of(x).shape, tuple(target)))
    if shape is None:
        return None
    return ctx.add("expand", [x], shape=shape)


def _axes_input(ctx: OpImportContext, node: onnx.NodeProto, attr_name: str = "axes"
                ) -> list[int] | None | bool:
    """Axes given as the second input (opset 13+) or as an attribute (older). False when the
    input is computed at run time (unsupported)."""
    if len(node.input) > 1 and node.input[1]:
        axes = ctx.constant(node.input[1])
        return False if axes is None else [int(a) for a in np.atleast_1d(axes)]
    value = ctx.attr(node, attr_name, None)
    return None if value is None else list(value)


@onnx_importer("Squeeze")
def _import_squeeze(ctx: OpImportContext, node: onnx.NodeProto) -> list[Value] | None:
    axes = _axes_input(ctx, node)
    if axes is False:
        return None
    x = ctx.inputs(node)[0]
    if axes is None:  # every dimension of 1: a symbolic size is taken not to be 1, and the
        # model is then defined where it is at least 2 (at 1 it would lose a dimension):
        # seq from 2, or seq - 4 (a valid convolution's) from seq = 6
        axes = []
        for i, d in enumerate(ctx.type_of(x).shape):
            if type(d) is int:
                if d == 1:
                    axes.append(i)
                continue
            size: sympy.Expr = d
            (symbol, *more), offset = size.free_symbols, size - sum(size.free_symbols)
            if more or not offset.is_Integer:
                return None
            ctx.at_least(symbol.name, 2 - int(offset))
    return ctx.add("squeeze", [x], axes=axes)


@onnx_importer("Unsqueeze")
def _import_unsqueeze(ctx: OpImportContext, node: onnx.NodeProto) -> list[Value] | None:
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
    norm: dict[int, tuple[Dim, Dim, int]] = {}
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = norm_axis(a, x.rank, "slice")
        if a in norm:
            raise ShapeError(f"slice: axis {a} given twice")
        if st == 0:
            raise ShapeError("slice: step must not be 0")
        n = x.shape[a]
        if type(s) is int and type(e) is int and type(n) is int:
            s = s + n if s < 0 else s
            e = e + n if e < 0 else e
            if st > 0:
                s, e = min(max(s, 0), n), min(max(e, 0), n)
            else:
                s, e = min(max(s, 0), n - 1), min(max(e, -1), n - 1)
        elif st > 0:
            s, e = _clamp_symbolic(s, n, 0, n), _clamp_symbolic(e, n, 0, n)
        else:
            s, e = _clamp_symbolic(s, n, 0, n - 1), _clamp_symbolic(e, n, -1, n - 1)
        norm[a] = (s, e, st)
    order = sorted(norm)
    values.update(axes=tuple(order), starts=tuple(norm[a][0] for a in order),
                  ends=tuple(norm[a][1] for a in order), steps=tuple(norm[a][2] for a in order))
    return values


#: A slice bound this far out means "to the end" whatever the size (no dimension is this big).
_TO_THE_END = 2 ** 31


def _clamp_symbolic(bound: Dim, n: Dim, low: int, high: Dim) -> Dim:
    """A slice bound over a dimension of n where a size symbol is involved, as ONNX reads it:
    counted from the end when negative (n + bound), then clamped to [low, high] ([0, n]
    going forwards; backwards [0, n - 1] for the start, [-1, n - 1] for the end). Where it
    cannot be decided whether a bound lies inside, it is taken to: the importer records the
    sizes for which that holds as the symbol's range (a slice of a 512-row table by `seq`
    bounds `seq` by 512), and a rewrite only makes slices within the dimensions it splits."""
    if type(bound) is int and abs(bound) >= _TO_THE_END:  # INT64_MAX, INT64_MIN and kin
        return high if bound > 0 else low
    negative = is_negative(bound)
    if negative is None:
        raise ShapeError(f"slice: cannot tell whether the bound {bound} counts from the end")
    if negative:
        bound = n + bound
    if at_most(bound, low):
        return low
    return high if at_most(high, bound) else bound


def _slices(attrs: Attrs, rank: int) -> tuple[slice, ...]:
    sl = [slice(None)] * rank
    for a, s, e, st in zip(attrs["axes"], attrs["starts"], attrs["ends"], attrs["steps"]):
        sl[a] = slice(s, e if e >= 0 else None, st)
    return tuple(sl)


def _slice_infer(attrs: Attrs, ins: Types) -> Types:
    shape = list(ins[0].shape)
    for a, s, e, st in zip(attrs["axes"], attrs["starts"], attrs["ends"], attrs["steps"]):
        if type(s) is int and type(e) is int:
            shape[a] = len(range(s, e, st))
        else:
            first, last, step = (s, e, st) if st > 0 else (e, s, -st)
            if at_most(last, first):
                shape[a] = 0
            elif at_most(first, last):
                shape[a] = ceildiv(last - first, step)
            else:
                raise ShapeError(f"slice: cannot tell whether {s}..{e} is empty")
    return (TensorType(tuple(shape), ins[0].dtype),)


def _from_the_end(bound: Dim, n: Dim) -> Dim:
    """A symbolic bound n + c (c < 0) as ONNX counts it, c: the same index wherever it lies in
    the dimension, and ONNX's own clamping where it does not. Written as n + c, a bound that
    is -1 at some size (a backwards slice's end s - 3 at s = 2, "through index 0") would
    be read as the last index there (campaign 30000, seed 30844)."""
    if type(bound) is int or type(n) is int:
        return bound
    offset: sympy.Expr = bound - n
    return int(offset) if offset.is_Integer and offset < 0 else bound


def _slice_export(ctx: OpExportContext, attrs: Attrs, ins: list[str], outs: list[str],
                  types: Types) -> None:
    shape = types[0].shape
    # An end of -1 with a negative step means "through index 0"; ONNX reads -1 as the last
    # index, so say it with a value that clamps to before the start instead.
    ends = [_from_the_end(e, shape[a]) if type(e) is not int or e >= 0 else -shape[a] - 1
            for a, e in zip(attrs["axes"], attrs["ends"])]
    starts = [_from_the_end(s, shape[a]) for a, s in zip(attrs["axes"], attrs["starts"])]
    bounds = [ctx.sizes(starts), ctx.sizes(ends)]
    steps = [ctx.const(np.array(v, dtype=np.int64)) for v in (attrs["axes"], attrs["steps"])]
    ctx.emit("Slice", [ins[0], *bounds, *steps], outs)


def _index_then_gather(t: TorchLowering, key: tuple[slice, ...],
                       gathers: list[tuple[int, Any]]) -> TorchFn:
    """x[key] (a view), then an index_select along each (axis, indices) of `gathers`: what
    basic indexing cannot express (negative steps, reflected pads) as gathers of indices
    computed when the program is built."""
    index_select = t.torch.index_select

    def index_then_gather(x: Any) -> tuple[Any, ...]:
        y = x[key]
        for axis, index in gathers:
            y = index_select(y, axis, index)
        return (y,)

    return index_then_gather


def _slice_torch(t: TorchLowering, attrs: Attrs, ins: Types, outs: Types) -> TorchFn:
    rank = ins[0].rank
    forward = [slice(None)] * rank
    backward: list[tuple[int, Any]] = []
    for a, s, e, st in zip(attrs["axes"], attrs["starts"], attrs["ends"], attrs["steps"]):
        if st > 0:
            forward[a] = slice(s, e, st)
        else:  # torch has no negative steps: gather the indices instead
            idx = np.arange(ins[0].shape[a])[slice(s, e if e >= 0 else None, st)]
            backward.append((a, t.const(idx.astype(np.int64))))
    return _index_then_gather(t, tuple(forward), backward)


def _step_tries(shapes: Sequence[Shape], attrs: Mapping[str, Any]) -> tuple[Any, ...]:
    """Steps of one, of two and of minus one along the axes drawn (every other element, and
    backwards: a slice that is right only for steps of one differs there)."""
    axes = attrs.get("axes")
    count = len(axes) if axes is not None else len(shapes[0]) if shapes else 1
    return (None, (2,) * count, (-1,) * count)


register(OpDef(
    name="slice", inputs=(1, 1), view="strided", torch=_slice_torch, category=Category.LAYOUT,
    attrs=(AttrSpec("starts", convert=size_dims, tries=((0,), (1,), (-1,))),
           AttrSpec("ends", convert=size_dims, tries=((3,), (-1,), (-2 ** 31,))),
           AttrSpec("axes", None, ints, tries=AXES_TRIES), AttrSpec("steps", None, ints, tries=_step_tries)),
    infer=_slice_infer,
    evaluate=lambda attrs, xs: (np.asarray(xs[0][_slices(attrs, xs[0].ndim)], order="C"),),
    export=_slice_export, canonicalize=_slice_canon,
    doc="Strided slice along some axes; bounds are clamped at construction as ONNX does.",
))


@onnx_importer("Slice")
def _import_slice(ctx: OpImportContext, node: onnx.NodeProto) -> list[Value] | None:
    consts: list[Any] = []
    for i in range(1, 5):
        if len(node.input) > i and node.input[i]:
            c = ctx.sizes_of(node.input[i])
            if c is None:
                return None
            consts.append(list(c))
        else:
            consts.append(None)
    starts, ends, axes, steps = consts
    if any(is_symbolic(v) for v in list(axes or []) + list(steps or [])):
        return None
    # ONNX uses INT64 extremes for "to the end"; clamp to something our ints hold comfortably.
    big = 2 ** 62
    ends = [max(min(e, big), -big) if type(e) is int else e for e in ends]
    starts = [max(min(s, big), -big) if type(s) is int else s for s in starts]
    x = ctx.inputs(node)[0]
    ctx.bound_by_slice(ctx.type_of(x).shape, starts, ends, axes)
    return ctx.add("slice", [x], starts=starts, ends=ends, axes=axes, steps=steps)


# ---- pad ---------------------------------------------------------------------------------------

def _pad_tries(shapes: Sequence[Shape], attrs: Mapping[str, Any]) -> tuple[Any, ...]:
    """One element before and after every axis, and two after the last only."""
    rank = len(shapes[0]) if shapes else 1
    return ((1,) * (2 * rank), (0,) * (2 * rank - 1) + (2,))


def _pad_infer(attrs: Attrs, ins: Types) -> Types:
    x, pads = ins[0], attrs["pads"]
    if len(pads) != 2 * x.rank:
        raise ShapeError(f"pad: needs {2 * x.rank} pad values for rank {x.rank}, got {len(pads)}")
    shape = tuple(d + pads[i] + pads[i + x.rank] for i, d in enumerate(x.shape))
    if any(is_negative(d) is not False for d in shape):
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


def _pad_export(ctx: OpExportContext, attrs: Attrs, ins: list[str], outs: list[str],
                types: Types) -> None:
    pads = ctx.const(np.array(attrs["pads"], dtype=np.int64))
    inputs = [ins[0], pads]
    if attrs["mode"] == "constant" and attrs["value"] != 0:
        inputs.append(ctx.const(np.array(attrs["value"], dtype=types[0].dtype)))
    ctx.emit("Pad", inputs, outs, mode=attrs["mode"])


def _pad_torch(t: TorchLowering, attrs: Attrs, ins: Types, outs: Types) -> TorchFn:
    pads, rank, mode = attrs["pads"], ins[0].rank, attrs["mode"]
    if not any(pads):  # exported models pad windows by nothing: no kernel, no copy
        return lambda x: (x.contiguous(),)
    if mode == "constant":
        flat: list[int] = []
        for axis in reversed(range(rank)):  # torch lists the last axis first
            flat += [pads[axis], pads[axis + rank]]
        value = attrs["value"]
        if not is_float(ins[0]):
            value = int(value)
        return lambda x: (t.F.pad(x, flat, value=value),)
    # reflect / edge: crop what is negative, then gather each padded axis with the indices
    # numpy's own pad computes (exact for every rank and pad width).
    shape = ins[0].shape
    crop = tuple(slice(max(-pads[i], 0), shape[i] - max(-pads[i + rank], 0)) for i in range(rank))
    np_mode: Literal["reflect", "edge"] = "reflect" if mode == "reflect" else "edge"
    gathers = []
    for axis in range(rank):
        before, after = max(pads[axis], 0), max(pads[axis + rank], 0)
        if before or after:
            n = len(range(*crop[axis].indices(shape[axis])))
            idx = np.pad(np.arange(n), (before, after), mode=np_mode).astype(np.int64)
            gathers.append((axis, t.const(idx)))
    return _index_then_gather(t, crop, gathers)


register(OpDef(
    name="pad", inputs=(1, 1), torch=_pad_torch, category=Category.LAYOUT,
    attrs=(AttrSpec("pads", convert=ints, tries=_pad_tries),
           AttrSpec("mode", "constant", choice("constant", "reflect", "edge"),
                    tries=("constant", "reflect", "edge")),
           AttrSpec("value", 0.0, f32, tries=(0.0, 1.5))),
    infer=_pad_infer, evaluate=_pad_eval, export=_pad_export,
    doc="Pad (or crop, with negative pads) every axis; pads are (begin..., end...) as in ONNX.",
))


@onnx_importer("Pad")
def _import_pad(ctx: OpImportContext, node: onnx.NodeProto) -> list[Value] | None:
    x = ctx.inputs(node)[0]
    rank = ctx.type_of(x).rank
    given = ctx.constant(node.input[1]) if len(node.input) > 1 else None
    if given is None:
        return None
    pads = [int(p) for p in given]
    value = 0.0
    if len(node.input) > 2 and node.input[2]:
        c = ctx.constant(node.input[2])
        if c is None:
            return None
        value = float(c)
    if len(node.input) > 3 and node.input[3]:
        given_axes = ctx.constant(node.input[3])
        if given_axes is None:
            return None
        full = [0] * (2 * rank)
        axes = [norm_axis(int(a), rank, "Pad") for a in given_axes]
        for i, a in enumerate(axes):
            full[a], full[a + rank] = pads[i], pads[i + len(axes)]
        pads = full
    mode = ctx.attr(node, "mode", "constant")
    if mode not in ("constant", "reflect", "edge"):
        return None
    return ctx.add("pad", [x], pads=pads, mode=mode, value=value)


# ---- ATen import (torch.compile) -----------------------------------------------------------

def _same_numel(n: AtenCall) -> str | None:
    """A view that keeps the element count is a reshape."""
    source = n.shape_of(n.args["self"])
    if source is None or not same_dim(product(source), product(n.out_shape())):
        return "a view that changes the number of elements"
    return None


@aten_importer("view.default", "view_copy.default", "_unsafe_view.default", "reshape.default",
               "squeeze_copy.dim", "squeeze_copy.dims", "unsqueeze_copy.default", "squeeze.dim",
               "unsqueeze.default", "flatten.using_ints", check=_same_numel)
def _aten_reshape(c: AtenBuilder, n: AtenCall) -> object:
    return c.op("reshape", c.value(n.args["self"]), shape=n.out_shape())


def _expand_check(n: AtenCall) -> str | None:
    source = n.shape_of(n.args["self"])
    if source is None or not broadcasts_to(source, n.out_shape()):
        return "an expand to a shape its input does not broadcast to"
    return None


@aten_importer("expand_copy.default", "expand.default", check=_expand_check)
def _aten_expand(c: AtenBuilder, n: AtenCall) -> object:
    """An expand that keeps the element count is a reshape (adds or keeps axes of size 1);
    one that broadcasts is an expand."""
    x = c.value(n.args["self"])
    shape = n.out_shape()
    if same_dim(product(c.shape(x)), product(shape)):
        return c.op("reshape", x, shape=shape)
    return c.op("expand", x, shape=shape)


@aten_importer("t.default", "t_copy.default")
def _aten_t(c: AtenBuilder, n: AtenCall) -> object:
    x = c.value(n.args["self"])
    return x if len(c.shape(x)) < 2 else c.op("transpose", x, perm=(1, 0))


@aten_importer("permute.default", "permute_copy.default")
def _aten_permute(c: AtenBuilder, n: AtenCall) -> object:
    return c.op("transpose", c.value(n.args["self"]), perm=tuple(n.args["dims"]))


@aten_importer("transpose.int", "transpose_copy.int")
def _aten_transpose(c: AtenBuilder, n: AtenCall) -> object:
    x = c.value(n.args["self"])
    rank = len(c.shape(x))
    perm = list(range(rank))
    d0, d1 = n.args["dim0"] % rank, n.args["dim1"] % rank
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return c.op("transpose", x, perm=tuple(perm))


@aten_importer("cat.default")
def _aten_cat(c: AtenBuilder, n: AtenCall) -> object:
    """torch.cat skips 1-D tensors of size 0 whatever `dim` says (an empty key/value cache
    concatenated with the new keys, in Llama's attention): so does the import."""
    parts = [c.value(t) for t in n.args["tensors"]]
    kept = [p for p in parts if c.shape(p) != (0,)] or parts[:1]
    if len(kept) == 1:
        return c.op("identity", kept[0])
    return c.op("concat", *kept, axis=n.args.get("dim", 0))


@aten_importer("split.Tensor", "split_copy.Tensor", "split_with_sizes.default",
               "split_with_sizes_copy.default")
def _aten_split(c: AtenBuilder, n: AtenCall) -> object:
    a = n.args
    x = c.value(a["self"])
    dim = a.get("dim", 0) % len(c.shape(x))
    size = c.shape(x)[dim]
    if "split_sizes" in a:
        sizes = list(a["split_sizes"])
    else:
        step = a["split_size"]
        sizes = [min(step, size - i) for i in range(0, size, step)] if step else [size]
    outs = c.op("split", x, axis=dim, sizes=sizes)
    return outs if isinstance(outs, tuple) else (outs,)


@aten_importer("slice.Tensor", "slice_copy.Tensor")
def _aten_slice(c: AtenBuilder, n: AtenCall) -> object:
    a = n.args
    x = c.value(a["self"])
    big = 2 ** 62
    start = a.get("start") if a.get("start") is not None else 0
    end = a.get("end") if a.get("end") is not None else big

    def clamped(i: Any) -> Any:  # a size expression (dynamic sizes) is in range already
        return max(min(i, big), -big) if isinstance(i, int) else i

    return c.op("slice", x, starts=[clamped(start)], ends=[clamped(end)],
                axes=[a.get("dim", 0)], steps=[a.get("step", 1)])


@aten_importer("select.int", "select_copy.int")
def _aten_select(c: AtenBuilder, n: AtenCall) -> object:
    x = c.value(n.args["self"])
    dim = n.args["dim"] % len(c.shape(x))
    index = n.args["index"] % c.shape(x)[dim]
    part = c.op("slice", x, starts=[index], ends=[index + 1], axes=[dim], steps=[1])
    return c.op("reshape", part, shape=n.out_shape())


@aten_importer("constant_pad_nd.default")
def _aten_pad(c: AtenBuilder, n: AtenCall) -> object:
    x = c.value(n.args["self"])
    rank = len(c.shape(x))
    flat = list(n.args["pad"])  # (last axis before, after, second to last before, after, ...)
    begin, end = [0] * rank, [0] * rank
    for k in range(len(flat) // 2):
        begin[rank - 1 - k], end[rank - 1 - k] = flat[2 * k], flat[2 * k + 1]
    return c.op("pad", x, pads=begin + end, value=float(n.args.get("value", 0.0)))
