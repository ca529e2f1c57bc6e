"""Scaled dot-product attention as one operator: ONNX Attention (opset 23), torch's
scaled_dot_product_attention.

Inputs q (..., Hq, Sq, D), k (..., Hkv, Skv, D), v (..., Hkv, Skv, Dv) of rank 3 or 4, and an
optional mask: boolean (True: the key takes part) or added to the scores, broadcasting to
(..., Hq, Sq, Skv). Grouped-query attention when Hq is a multiple of Hkv: query head h reads
key/value head h // (Hq / Hkv), as both libraries do. `causal` masks the keys after each
query (upper-left aligned, as both libraries align it). A query whose every key is masked
gives zeros, as both libraries give (not the NaN a softmax of -inf's would).

It is one library call on every target from opset 23 on, and the fused form of the
attention primitives operator fission produces (graphsub.fission).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from graphsub.errors import ShapeError
from graphsub.tensors.symbolic import bind_all, evaluate_size, is_static
from graphsub.tensors.types import Attrs, TensorType
from graphsub.ops.base import (AtenBuilder, AtenCall, AtenImportFn, AttrSpec, Category, OpDef,
                               TorchFn, TorchLowering, Types, aten_importer, broadcasts_to,
                               onnx_importer, register, is_float, size_dims)
from graphsub.ops.source import size_binding, size_sources

from graphsub.ops.contexts import OpExportContext, OpImportContext
from graphsub.tensors.values import Value

if TYPE_CHECKING:
    import onnx


def _check(attrs: Attrs, ins: Types) -> None:
    q, k, v = ins[:3]
    if not 3 <= q.rank <= 4 or k.rank != q.rank or v.rank != q.rank:
        raise ShapeError(f"attention: q, k and v must all have rank 3 or 4, got {q.shape}, "
                         f"{k.shape}, {v.shape}")
    if not is_float(q) or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ShapeError(f"attention: q, k and v must share a float dtype, got {q.dtype}, "
                         f"{k.dtype}, {v.dtype}")
    if q.shape[:-3] != k.shape[:-3] or k.shape[:-3] != v.shape[:-3]:
        raise ShapeError(f"attention: batch sizes differ: {q.shape}, {k.shape}, {v.shape}")
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2] or k.shape[-3] != v.shape[-3]:
        raise ShapeError(f"attention: q {q.shape}, k {k.shape} and v {v.shape} do not fit "
                         "(q and k share the head size, k and v the keys and the heads)")
    if q.shape[-3] % k.shape[-3]:
        raise ShapeError(f"attention: {q.shape[-3]} query heads are not a multiple of "
                         f"{k.shape[-3]} key/value heads")
    if len(ins) > 3:
        m = ins[3]
        scores = q.shape[:-1] + (k.shape[-2],)
        if not broadcasts_to(m.shape, scores) or not (m.dtype == "bool" or m.dtype == q.dtype):
            raise ShapeError(f"attention: the mask {m} must be bool or {q.dtype} and "
                             f"broadcast to the scores {scores}")


def _infer(attrs: Attrs, ins: Types) -> Types:
    _check(attrs, ins)
    q, _, v = ins[:3]
    return (TensorType(q.shape[:-1] + (v.shape[-1],), q.dtype),)


def _canon(values: dict[str, Any], ins: Types) -> dict[str, Any]:
    if values["scale"] is None:  # the libraries' default, written out: equal things look equal
        values["scale"] = float(np.float32(1.0 / math.sqrt(ins[0].shape[-1])))
    return values


def causal_mask(queries: int, keys: int) -> np.ndarray:
    """True where query i may read key j (j <= i), upper-left aligned."""
    return np.tril(np.ones((queries, keys), dtype=bool))


# ---- the causal mask as a tensor -------------------------------------------------------------
# What a model builds from positions at a symbolic length (frontends.fx_position_masks proves
# it): a mask of `shape` that keeps key j for query i where j <= i over its last two axes,
# the same for every leading index. Boolean, or added to the scores (0 kept, `fill` masked).
# Like `sizes`, it reads its size symbols from the shapes of its inputs (`sources`), so one
# program computes it at every length.

def _mask_sizes(attrs: Attrs, xs: Sequence[Any]) -> tuple[int, ...]:
    if is_static(attrs["shape"]):  # (a bound graph's: its sources are read no more)
        return tuple(int(d) for d in attrs["shape"])
    binding = size_binding(attrs["sources"], xs)
    return tuple(int(d) for d in bind_all(attrs["shape"], binding))


def _mask_of(keep: np.ndarray, attrs: Attrs) -> np.ndarray:
    if attrs["dtype"] == "bool":
        return keep
    return np.where(keep, 0.0, attrs["fill"]).astype(attrs["dtype"])


def _causal_mask_infer(attrs: Attrs, ins: Types) -> Types:
    if len(attrs["shape"]) < 2:
        raise ShapeError(f"causal_mask: a mask has two axes at least, got {attrs['shape']}")
    if attrs["dtype"] != "bool" and not attrs["dtype"].startswith(("float", "bfloat")):
        raise ShapeError(f"causal_mask: a mask is bool or a float, not {attrs['dtype']}")
    for name, index, axis in attrs["sources"]:
        if index >= len(ins) or axis >= ins[index].rank:
            raise ShapeError(f"causal_mask: symbol {name} has no source at input {index}, "
                             f"axis {axis}")
    return (TensorType(attrs["shape"], attrs["dtype"]),)


def _causal_mask_evaluate(attrs: Attrs, xs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    shape = _mask_sizes(attrs, xs)
    keep = np.broadcast_to(causal_mask(*shape[-2:]), shape)
    return (_mask_of(keep, attrs),)


def _causal_mask_torch(t: TorchLowering, attrs: Attrs, ins: Types, outs: Types) -> TorchFn:
    """A constant at fixed sizes; else built from the inputs' sizes (SymInts while torch
    traces the program)."""
    if is_static(attrs["shape"]):
        fixed = t.const(_causal_mask_evaluate(attrs, [])[0])
        return lambda *xs: (fixed,)
    torch, dtype = t.torch, t.dtype(attrs["dtype"])

    def mask(*xs: Any) -> tuple[Any, ...]:
        binding = size_binding(attrs["sources"], xs)
        shape = [evaluate_size(d, binding) for d in attrs["shape"]]
        keep = torch.ones(shape[-2:], dtype=torch.bool, device=t.device).tril()
        if attrs["dtype"] != "bool":
            keep = torch.where(keep, torch.zeros((), dtype=dtype, device=t.device),
                               torch.full((), attrs["fill"], dtype=dtype, device=t.device))
        return (keep.expand(shape),)

    return mask


def _causal_mask_export(ctx: OpExportContext, attrs: Attrs, ins: list[str], outs: list[str],
                        types: Types) -> None:
    shape = attrs["shape"]
    ones, keep = ctx.fresh("causal_ones"), ctx.fresh("causal_keep")
    from onnx import numpy_helper

    ctx.emit("ConstantOfShape", [ctx.sizes(shape[-2:])], [ones],
             value=numpy_helper.from_array(np.ones(1, dtype=bool)))
    ctx.emit("Trilu", [ones], [keep], upper=0)
    if attrs["dtype"] != "bool":
        additive = ctx.fresh("causal_additive")
        ctx.emit("Where", [keep, ctx.const(np.array(0.0, dtype=attrs["dtype"])),
                           ctx.const(np.array(attrs["fill"], dtype=attrs["dtype"]))], [additive])
        keep = additive
    ctx.emit("Expand", [keep, ctx.sizes(shape)], outs)


register(OpDef(
    name="causal_mask", inputs=(0, None), category=Category.OPAQUE,
    attrs=(AttrSpec("shape", convert=size_dims), AttrSpec("dtype", "bool", str),
           AttrSpec("fill", float("-inf"), float), AttrSpec("sources", (), size_sources)),
    infer=_causal_mask_infer, evaluate=_causal_mask_evaluate, export=_causal_mask_export,
    torch=_causal_mask_torch, bytes=lambda attrs, ins, outs: outs[0].nbytes,
    doc="A causal mask (key j kept for query i where j <= i), boolean or additive (`fill` "
        "above the diagonal), its sizes read from its inputs' shapes.",
))


def _evaluate(attrs: Attrs, xs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    q, k, v = (x.astype(np.float64) for x in xs[:3])
    group = q.shape[-3] // k.shape[-3]
    k, v = np.repeat(k, group, axis=-3), np.repeat(v, group, axis=-3)
    scores = (q @ np.swapaxes(k, -1, -2)) * attrs["scale"]
    keep = np.ones(scores.shape, dtype=bool)
    if attrs["causal"]:
        keep &= causal_mask(*scores.shape[-2:])
    if len(xs) > 3:
        if xs[3].dtype == bool:
            keep &= xs[3]
        else:
            scores = scores + xs[3]
    scores = np.where(keep, scores, -np.inf)
    top = scores.max(axis=-1, keepdims=True)
    empty = ~np.isfinite(top)  # every key masked: zeros, as the libraries give
    e = np.exp(scores - np.where(empty, 0.0, top))
    weights = np.where(empty, 0.0, e / np.where(empty, 1.0, e.sum(axis=-1, keepdims=True)))
    return ((weights @ v).astype(xs[0].dtype),)


def _export(ctx: OpExportContext, attrs: Attrs, ins: list[str], outs: list[str],
            types: Types) -> None:
    q = types[0]
    if ctx.opset >= 23:
        if q.rank == 4:
            ctx.emit("Attention", ins, outs, scale=attrs["scale"], is_causal=int(attrs["causal"]))
            return
        # Rank 3 (heads, seq, size): ONNX reads a 3-D input as (batch, seq, hidden), so add a
        # batch axis of 1 around the operator.
        axis0 = ctx.const(np.array([0], dtype=np.int64))
        wide = []
        for name, t in zip(ins, types):
            if t.rank == 3:
                wide.append(ctx.fresh("attention"))
                ctx.emit("Unsqueeze", [name, axis0], [wide[-1]])
            else:
                wide.append(name)
        y = ctx.fresh("attention")
        ctx.emit("Attention", wide, [y], scale=attrs["scale"], is_causal=int(attrs["causal"]))
        ctx.emit("Squeeze", [y, axis0], outs)
        return
    _export_primitives(ctx, attrs, ins, outs, types)


def _export_primitives(ctx: OpExportContext, attrs: Attrs, ins: list[str], outs: list[str],
                       types: Types) -> None:
    """Before opset 23: grouped query heads folded into the query rows (query head h of group
    g reads key head h // g, so (Hkv, g * Sq) rows share one key matrix), scores, masks, a
    softmax, and a guard that turns the NaN rows of fully masked queries into zeros."""
    q, k, v = types[:3]
    group = q.shape[-3] // k.shape[-3]
    name = ctx.fresh
    query = ins[0]
    rows = q.shape[-2]
    if group > 1:
        query = name("attention")
        folded = q.shape[:-3] + (k.shape[-3], group * rows, q.shape[-1])
        ctx.emit("Reshape", [ins[0], ctx.const(np.array(folded, dtype=np.int64))], [query])
    perm = list(range(k.rank - 2)) + [k.rank - 1, k.rank - 2]
    k_t, raw, scores = name("attention"), name("attention"), name("attention")
    ctx.emit("Transpose", [ins[1]], [k_t], perm=perm)
    ctx.emit("MatMul", [query, k_t], [raw])
    ctx.emit("Mul", [raw, ctx.const(np.array(attrs["scale"], dtype=q.dtype))], [scores])
    keep = None
    if attrs["causal"]:
        keep = np.tile(causal_mask(rows, k.shape[-2]), (group, 1))
    if len(ins) > 3 and group > 1:
        raise ShapeError("attention: a mask with grouped query heads before opset 23 is not "
                         "supported; export at opset 23")
    if keep is not None:
        masked = name("attention")
        ctx.emit("Where", [ctx.const(keep), scores,
                           ctx.const(np.array(-np.inf, dtype=q.dtype))], [masked])
        scores = masked
    if len(ins) > 3:
        masked = name("attention")
        if types[3].dtype == "bool":
            ctx.emit("Where", [ins[3], scores, ctx.const(np.array(-np.inf, dtype=q.dtype))],
                     [masked])
        else:
            ctx.emit("Add", [scores, ins[3]], [masked])
        scores = masked
    weights = name("attention")
    ctx.emit("Softmax", [scores], [weights], axis=-1)
    if len(ins) > 3:
        nan, guarded = name("attention"), name("attention")
        ctx.emit("IsNaN", [weights], [nan])
        ctx.emit("Where", [nan, ctx.const(np.array(0.0, dtype=q.dtype)), weights], [guarded])
        weights = guarded
    if group == 1:
        ctx.emit("MatMul", [weights, ins[2]], outs)
        return
    y = name("attention")
    ctx.emit("MatMul", [weights, ins[2]], [y])
    out_shape = q.shape[:-1] + (v.shape[-1],)
    ctx.emit("Reshape", [y, ctx.const(np.array(out_shape, dtype=np.int64))], outs)


def _torch(t: TorchLowering, attrs: Attrs, ins: Types, outs: Types) -> TorchFn:
    """torch's scaled_dot_product_attention, called untraced (it looks at strides). Rank-3
    operands get a batch axis of 1 (a view): on the CPU torch runs 3-D attention by its slow
    reference path and 4-D by its flash kernel, which reads the last dimension as contiguous
    (and computes garbage from a view that is not), so such operands are copied first."""
    sdpa, scale, torch = t.F.scaled_dot_product_attention, attrs["scale"], t.torch
    gqa = ins[0].shape[-3] != ins[1].shape[-3]
    causal, wide, masked = attrs["causal"], ins[0].rank == 3, len(ins) > 3
    # On a GPU, grouped-query heads with a mask run only on torch's reference kernel (the
    # flash kernel takes no mask, the memory-efficient one no grouped heads), which writes
    # the scores out: there the key/value heads are repeated instead, a copy of k and v far
    # smaller than the scores.
    group = ins[0].shape[-3] // ins[1].shape[-3] if gqa else 1
    repeat = gqa and masked and getattr(t.device, "type", "cpu") == "cuda"
    gqa = gqa and not repeat
    # torch takes a mask or is_causal, not both: with a mask, the causal part joins it.
    extra = ([t.const(causal_mask(ins[0].shape[-2], ins[1].shape[-2])),
              t.const(np.array(-np.inf, dtype=ins[0].dtype))] if causal and masked else [])

    def operand(x: Any) -> Any:
        x = x if x.stride(-1) == 1 or x.shape[-1] == 1 else x.contiguous()
        return x.unsqueeze(0) if wide else x

    def attention(q: Any, k: Any, v: Any, m: Any = None, keep: Any = None,
                  floor: Any = None) -> Any:
        if m is not None:
            if keep is not None:
                m = m & keep if m.dtype == torch.bool else torch.where(keep, m, floor)
            if wide and m.dim() == 3:
                m = m.unsqueeze(0)
        if repeat:
            k, v = k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)
        y = sdpa(operand(q), operand(k), operand(v), attn_mask=m,
                 is_causal=causal and m is None, scale=scale, enable_gqa=gqa)
        return y.squeeze(0) if wide else y

    if masked:
        return lambda q, k, v, m: (t.leaf(attention, q, k, v, m, *extra),)
    return lambda q, k, v: (t.leaf(attention, q, k, v),)


def _flops(attrs: Attrs, ins: Types, outs: Types) -> int:
    q, k, v = ins[:3]
    return 2 * q.numel * k.shape[-2] + 2 * outs[0].numel * k.shape[-2] + 5 * (
        q.numel // q.shape[-1]) * k.shape[-2]


register(OpDef(
    name="attention", inputs=(3, 4), torch=_torch, category=Category.COARSE,
    attrs=(AttrSpec("scale", None, float, tries=(None, 0.25)),
           AttrSpec("causal", False, bool, tries=(False, True))),
    infer=_infer, evaluate=_evaluate, export=_export, canonicalize=_canon, flops=_flops,
    doc="softmax(q k^T * scale (masked)) v, grouped-query heads allowed (ONNX Attention, "
        "opset 23; primitives before).",
))


@onnx_importer("Attention")
def _import_attention(ctx: OpImportContext, node: onnx.NodeProto) -> list[Value] | None:
    """Attention with 4-D inputs and one output; 3-D inputs (batch, sequence, hidden, heads
    given as attributes), the key/value cache, soft-capping and the other outputs stay an
    opaque node."""
    if len(node.input) > 4 or any(ctx.is_used(o) for o in node.output[1:]):
        return None
    if ctx.attr(node, "softcap", 0.0) or ctx.attr(node, "qk_matmul_output_mode", 0):
        return None
    ins = ctx.inputs(node)
    if ctx.type_of(ins[0]).rank != 4:
        return None
    scale = ctx.attr(node, "scale", None)
    return ctx.add("attention", ins, scale=scale, causal=bool(ctx.attr(node, "is_causal", 0)))


def _aten_sdpa_check(n: AtenCall) -> str | None:
    if n.args.get("dropout_p", 0.0):
        return "attention with dropout"
    return None


def _aten_sdpa(mask: str | None, outputs: int) -> AtenImportFn:
    """The importer of one of torch's fused attention kernels: its first output is the
    attention; the others (the log-sum-exp, random state, sequence bookkeeping for the
    backward pass) are not modelled. `mask` names the kernel's mask argument (None: the
    kernel takes none)."""
    def importer(c: AtenBuilder, n: AtenCall) -> object:
        a = n.args
        ins = [c.value(a[name]) for name in ("query", "key", "value")]
        if mask is not None and a.get(mask) is not None:
            ins.append(c.value(a[mask]))
        y = c.op("attention", *ins, scale=a.get("scale"),
                 causal=bool(a.get("is_causal", False)))
        return (y,) + (None,) * (outputs - 1)

    return importer


#: torch's fused attention kernels as scaled_dot_product_attention dispatches to them (under
#: torch.compile the traced graph holds the kernel chosen for the example's device, dtype
#: and shapes): the CPU's flash kernel; on CUDA the flash kernel (no mask), the
#: memory-efficient one and cuDNN's (a mask as an additive bias). The reference (math) path
#: traces to products and `_safe_softmax`, which the attention rules read.
for _overload, _mask, _outputs in (
        ("_scaled_dot_product_flash_attention_for_cpu.default", "attn_mask", 2),
        ("_scaled_dot_product_flash_attention.default", None, 9),
        ("_scaled_dot_product_efficient_attention.default", "attn_bias", 4),
        ("_scaled_dot_product_cudnn_attention.default", "attn_bias", 9)):
    aten_importer(_overload, check=_aten_sdpa_check)(_aten_sdpa(_mask, _outputs))
