"""Rotary positional embedding (RoPE): ONNX RotaryEmbedding of opset 23, which torch's dynamo
exporter and onnxscript write for Llama-style models.

Each head of the input is rotated pairwise by angles that depend on the token's position: the
pairs are the two halves of the head's first `rotary_embedding_dim` entries (or, with
`interleaved`, neighbouring entries), the rest of the head passes through, and the angles'
cosines and sines arrive as caches, gathered by `position_ids` when given. A 4-D input is
(batch, heads, sequence, head), a 3-D one (batch, sequence, heads * head) with `num_heads`.

Below opset 23 it is written as the primitives of ONNX's own definition (Gather, Unsqueeze,
Slice, Mul, Sub, Add, Concat, Reshape). Fission keeps it whole (`Category.OPAQUE`): its gather
by position is no primitive.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from graphsub.errors import GraphsubError, ShapeError
from graphsub.tensors.symbolic import is_symbolic
from graphsub.tensors.types import Attrs, TensorType
from graphsub.ops.base import (AttrSpec, Category, OpDef, OperandRole, Shape, TorchFn,
                               TorchLowering, Types, is_float, onnx_importer, register, same_dtype)

from graphsub.ops.contexts import OpExportContext, OpImportContext
from graphsub.tensors.values import Value

if TYPE_CHECKING:
    import onnx


@dataclass(frozen=True)
class _Heads:
    """The input seen as heads: a 4-D input as it is, a 3-D one as (batch, sequence, heads,
    head); the caches, (batch, sequence, rotary / 2) once gathered, gain an axis of one head
    at `axis` to broadcast against it."""

    shape: Shape
    axis: int
    head: int
    rotary: int
    batch: int
    sequence: int


def _heads(attrs: Mapping[str, Any], x: TensorType) -> _Heads:
    if x.rank in (3, 4) and is_symbolic(x.shape[-1]):
        raise ShapeError(f"rotary_embedding: the rotated axis must have a fixed size, got "
                         f"{x.shape[-1]}")
    if x.rank == 4:
        batch, _, sequence, head = x.shape
        shape, axis = x.shape, 1
    elif x.rank == 3:
        heads = attrs["num_heads"]
        if heads <= 0 or x.shape[2] % heads:
            raise ShapeError(f"rotary_embedding: a 3-D input needs num_heads dividing its hidden "
                             f"size {x.shape[2]}, got {heads}")
        batch, sequence, hidden = x.shape
        head = hidden // heads
        shape, axis = (batch, sequence, heads, head), 2
    else:
        raise ShapeError(f"rotary_embedding: the input must be 3-D or 4-D, got {x.shape}")
    return _Heads(shape, axis, head, attrs["rotary_embedding_dim"] or head, batch, sequence)


def _canonicalize(values: dict[str, Any], ins: Types) -> dict[str, Any]:
    """The rotated size made explicit (0 means the whole head) and the head count dropped
    where the input's shape gives it (4-D), so that equal computations look equal."""
    heads = _heads(values, ins[0])
    values["rotary_embedding_dim"] = heads.rotary
    if ins[0].rank == 4:
        values["num_heads"] = 0
    return values


def _infer(attrs: Attrs, ins: Types) -> Types:
    x, cos, sin = ins[:3]
    if not is_float(x):
        raise ShapeError(f"rotary_embedding: needs a floating-point input, got {x.dtype}")
    same_dtype("rotary_embedding", (x, cos, sin))
    h = _heads(attrs, x)
    if h.rotary % 2 or not 0 < h.rotary <= h.head:
        raise ShapeError(f"rotary_embedding: rotary_embedding_dim {h.rotary} must be even and "
                         f"at most the head size {h.head}")
    half = h.rotary // 2
    if len(ins) == 4:
        positions = ins[3]
        if positions.dtype != "int64" or positions.shape != (h.batch, h.sequence):
            raise ShapeError(f"rotary_embedding: position_ids must be int64 of shape "
                             f"{(h.batch, h.sequence)}, got {positions}")
        if cos.rank != 2 or cos.shape[1] != half:
            raise ShapeError(f"rotary_embedding: with position_ids the caches are (positions, "
                             f"{half}), got {cos.shape}")
    elif cos.shape != (h.batch, h.sequence, half):
        raise ShapeError(f"rotary_embedding: without position_ids the caches are "
                         f"{(h.batch, h.sequence, half)}, got {cos.shape}")
    if sin.shape != cos.shape:
        raise ShapeError(f"rotary_embedding: the caches differ in shape: {cos.shape} and "
                         f"{sin.shape}")
    return (x,)


Join = Callable[[Sequence[Any], int], Any]


def _rotate(heads: Any, cos: Any, sin: Any, h: _Heads, interleaved: bool, join: Join,
            stack: Join) -> Any:
    """The rotation of `heads` (shaped `h.shape`) by caches shaped to broadcast against them,
    in numpy or in torch (`join` concatenates, `stack` stacks along an axis); shapes come from
    `h`, never from the arrays, so that torch traces it."""
    r = h.rotary
    rot = heads[..., :r]
    if interleaved:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
    else:
        x1, x2 = rot[..., :r // 2], rot[..., r // 2:]
    real, imag = cos * x1 - sin * x2, sin * x1 + cos * x2
    if interleaved:
        rotated = stack((real, imag), -1).reshape(h.shape[:-1] + (r,))
    else:
        rotated = join((real, imag), -1)
    return join((rotated, heads[..., r:]), -1) if r < h.head else rotated


def _evaluate(attrs: Attrs, xs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    x = xs[0]
    h = _heads(attrs, TensorType(x.shape, str(x.dtype)))
    cos, sin = xs[1].astype(np.float64), xs[2].astype(np.float64)
    if len(xs) == 4:
        positions = xs[3]
        if positions.size and not 0 <= positions.min() <= positions.max() < len(cos):
            raise GraphsubError(f"rotary_embedding: position ids run from {positions.min()} to "
                                f"{positions.max()}, outside the caches' {len(cos)} positions")
        cos, sin = cos[positions], sin[positions]
    y = _rotate(x.astype(np.float64).reshape(h.shape), np.expand_dims(cos, h.axis),
                np.expand_dims(sin, h.axis), h, attrs["interleaved"], np.concatenate, np.stack)
    return (y.reshape(x.shape).astype(x.dtype),)


def _torch(t: TorchLowering, attrs: Attrs, ins: Types, outs: Types) -> TorchFn:
    h = _heads(attrs, ins[0])
    out_shape, interleaved = outs[0].shape, attrs["interleaved"]
    torch, embedding = t.torch, t.F.embedding

    def rotate(x: Any, cos: Any, sin: Any) -> tuple[Any, ...]:
        y = _rotate(x.reshape(h.shape), cos.unsqueeze(h.axis), sin.unsqueeze(h.axis), h,
                    interleaved, torch.cat, torch.stack)
        return (y.reshape(out_shape),)

    if len(ins) == 4:
        return lambda x, cos, sin, positions: rotate(x, embedding(positions, cos),
                                                     embedding(positions, sin))
    return rotate


def _export(ctx: OpExportContext, attrs: Attrs, ins: list[str], outs: list[str],
            types: Types) -> None:
    h = _heads(attrs, types[0])
    if ctx.opset >= 23:
        given = {"num_heads": attrs["num_heads"]} if attrs["num_heads"] else {}
        if h.rotary < h.head:
            given["rotary_embedding_dim"] = h.rotary
        ctx.emit("RotaryEmbedding", ins, outs, interleaved=int(attrs["interleaved"]), **given)
        return
    _export_primitives(ctx, attrs, h, ins, outs, types[0])


def _export_primitives(ctx: OpExportContext, attrs: Attrs, h: _Heads, ins: list[str], outs: list[str],
                       x_type: TensorType) -> None:
    """ONNX's definition of RotaryEmbedding in the operators of earlier opsets. The last node
    writes the output; `last(cond)` names it where `cond` says the node is the last."""
    r, half, partial, flat = h.rotary, h.rotary // 2, h.rotary < h.head, x_type.rank == 3

    def last(cond: bool) -> str | None:
        return outs[0] if cond else None

    def ints(values: Sequence[int]) -> str:
        return ctx.const(np.array(values, np.int64))

    def emit(op_type: str, inputs: list[str], out: str | None = None, **kw: Any) -> str:
        name = out or ctx.fresh("rope")
        ctx.emit(op_type, inputs, [name], **kw)
        return name

    def last_axis(value: str, start: int, end: int, step: int = 1) -> str:
        return emit("Slice", [value, ints([start]), ints([end]), ints([-1]), ints([step])])

    cos, sin = ins[1], ins[2]
    if len(ins) == 4:
        cos, sin = (emit("Gather", [c, ins[3]], axis=0) for c in (cos, sin))
    cos, sin = (emit("Unsqueeze", [c, ints([h.axis])]) for c in (cos, sin))
    heads = emit("Reshape", [ins[0], ints(h.shape)]) if flat else ins[0]
    rot = last_axis(heads, 0, r) if partial else heads
    if attrs["interleaved"]:
        x1, x2 = last_axis(rot, 0, r, 2), last_axis(rot, 1, r, 2)
    else:
        x1, x2 = last_axis(rot, 0, half), last_axis(rot, half, r)
    real = emit("Sub", [emit("Mul", [cos, x1]), emit("Mul", [sin, x2])])
    imag = emit("Add", [emit("Mul", [sin, x1]), emit("Mul", [cos, x2])])
    done = not partial and not flat
    if attrs["interleaved"]:
        pairs = emit("Concat", [emit("Unsqueeze", [v, ints([-1])]) for v in (real, imag)],
                     axis=-1)
        rotated = emit("Reshape", [pairs, ints(h.shape[:-1] + (r,))], last(done))
    else:
        rotated = emit("Concat", [real, imag], last(done), axis=-1)
    if partial:
        rotated = emit("Concat", [rotated, last_axis(heads, r, h.head)], last(not flat),
                       axis=-1)
    if flat:
        emit("Reshape", [rotated, ints(x_type.shape)], outs[0])


def _flops(attrs: Attrs, ins: Types, outs: Types) -> int:
    """Four products and two sums per rotated pair."""
    h = _heads(attrs, ins[0])
    return 3 * ins[0].numel // h.head * h.rotary


def _bytes(attrs: Attrs, ins: Types, outs: Types) -> int:
    """The input and output, and of the caches the rows gathered (one per token)."""
    h = _heads(attrs, ins[0])
    rows = 2 * h.batch * h.sequence * (h.rotary // 2) * ins[1].itemsize
    return ins[0].nbytes + outs[0].nbytes + rows + sum(t.nbytes for t in ins[3:])


register(OpDef(
    name="rotary_embedding", inputs=(3, 4), category=Category.OPAQUE,
    attrs=(AttrSpec("interleaved", False, bool, tries=(False, True)),
           AttrSpec("rotary_embedding_dim", 0, int), AttrSpec("num_heads", 0, int)),
    canonicalize=_canonicalize, infer=_infer, evaluate=_evaluate, export=_export,
    flops=_flops, bytes=_bytes, torch=_torch,
    # For the rule check: 4-D heads (batch 1, 2 heads, 3 tokens, 4 wide) and caches of the
    # tokens' angles that fit them; position ids are integers, which the check does not draw.
    roles=(OperandRole(shapes=((1, 2, 3, 4),)), OperandRole(shapes=((1, 3, 2),)),
           OperandRole(shapes=((1, 3, 2),))),
    doc="Rotary positional embedding of a head's pairs by the token's angles (ONNX "
        "RotaryEmbedding, opset 23; primitives before).",
))


@onnx_importer("RotaryEmbedding")
def _import_rotary_embedding(ctx: OpImportContext, node: onnx.NodeProto) -> list[Value]:
    return ctx.add("rotary_embedding", ctx.inputs(node),
                   interleaved=bool(ctx.attr(node, "interleaved", 0)),
                   rotary_embedding_dim=ctx.attr(node, "rotary_embedding_dim", 0),
                   num_heads=ctx.attr(node, "num_heads", 0))
