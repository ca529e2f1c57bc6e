"""Matrix multiplication (batched, broadcasting, optional fused activation) and Gemm import."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from graphsub.errors import ShapeError
from graphsub.tensors.types import Attrs, TensorType
from graphsub.ops.base import (AtenBuilder, AtenCall, AttrSpec, Category, OpDef, OperandRole,
                               TorchFn, TorchLowering, Types, aten_importer, choice, onnx_importer,
                               Shape, broadcast_shapes, register, same_dim, same_dtype)
from graphsub.ops.elementwise import (ACTIVATION_TRIES, ACTIVATIONS, apply_activation,
                                      emit_with_activation, torch_activation)

from graphsub.ops.contexts import OpExportContext, OpImportContext
from graphsub.tensors.values import Value

if TYPE_CHECKING:
    import onnx


#: What the rule check draws for a product's operands: vectors, matrices, batches, and batches
#: that broadcast against a matrix or each other; on the right also columns, whose products
#: are the reductions of rows.
_OPERANDS = ((4,), (6,), (4, 4), (4, 6), (6, 4), (2, 4, 4), (1, 4, 6), (2, 6, 4), (3, 4, 5), (5, 3),
             (4, 4, 4))
_ROLES = (OperandRole(shapes=_OPERANDS), OperandRole(shapes=_OPERANDS + ((4, 1), (2, 4, 1))))


def matmul_shape(a: Shape, b: Shape) -> Shape:
    if not a or not b:
        raise ShapeError("matmul: inputs must have rank >= 1")
    a2 = (1,) + a if len(a) == 1 else a
    b2 = b + (1,) if len(b) == 1 else b
    if not same_dim(a2[-1], b2[-2]):
        raise ShapeError(f"matmul: inner dimensions differ: {a} @ {b}")
    batch = broadcast_shapes((a2[:-2], b2[:-2]))
    if batch is None:
        raise ShapeError(f"matmul: batch dimensions of {a} and {b} do not broadcast")
    out = batch + (a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return out


def _infer(attrs: Attrs, ins: Types) -> Types:
    return (TensorType(matmul_shape(ins[0].shape, ins[1].shape), same_dtype("matmul", ins)),)


def _flops(attrs: Attrs, ins: Types, outs: Types) -> int:
    k = ins[0].shape[-1]
    return 2 * outs[0].numel * k


def _export(ctx: OpExportContext, attrs: Attrs, ins: list[str], outs: list[str],
            types: Types) -> None:
    emit_with_activation(ctx, attrs["activation"],
                         lambda out: ctx.emit("MatMul", ins, [out]), outs[0])


def _torch(t: TorchLowering, attrs: Attrs, ins: Types, outs: Types) -> TorchFn:
    act, matmul = torch_activation(t, attrs["activation"]), t.torch.matmul
    return lambda a, b: (act(matmul(a, b)),)


register(OpDef(
    name="matmul", inputs=(2, 2), torch=_torch, category=Category.LINEAR, roles=_ROLES,
    attrs=(AttrSpec("activation", "none", choice(*ACTIVATIONS), tries=ACTIVATION_TRIES),),
    infer=_infer,
    evaluate=lambda attrs, xs: (apply_activation(attrs["activation"],
                                                 np.matmul(xs[0], xs[1]).astype(xs[0].dtype)),),
    export=_export, flops=_flops,
    doc="Batched matrix product with numpy broadcasting (ONNX MatMul; Gemm imports to it).",
))


@onnx_importer("MatMul")
def _import_matmul(ctx: OpImportContext, node: onnx.NodeProto) -> list[Value] | None:
    a, b = ctx.inputs(node)
    if ctx.type_of(a).dtype != ctx.type_of(b).dtype:
        return None
    return ctx.add("matmul", [a, b])


@onnx_importer("Gemm")
def _import_gemm(ctx: OpImportContext, node: onnx.NodeProto) -> list[Value]:
    """Y = alpha * A' B' + beta * C becomes transpose/matmul/smul/add nodes. Transposes and
    scalings of weights are weight-only, so they fold away again at export."""
    ins = ctx.inputs(node)
    a, b = ins[0], ins[1]
    dtype = ctx.type_of(a).dtype
    if ctx.attr(node, "transA", 0):
        (a,) = ctx.add("transpose", [a], perm=(1, 0))
    if ctx.attr(node, "transB", 0):
        (b,) = ctx.add("transpose", [b], perm=(1, 0))
    (y,) = ctx.add("matmul", [a, b])
    alpha = float(ctx.attr(node, "alpha", 1.0))
    if not math.isclose(alpha, 1.0):
        (y,) = ctx.add("smul", [y, ctx.weight(np.array(alpha, dtype))])
    if len(ins) > 2:
        c = ins[2]
        beta = float(ctx.attr(node, "beta", 1.0))
        if not math.isclose(beta, 1.0):
            (c,) = ctx.add("smul", [c, ctx.weight(np.array(beta, dtype))])
        (y,) = ctx.add("add", [y, c])
    return [y]


@aten_importer("mm.default", "bmm.default", "matmul.default")
def _aten_mm(c: AtenBuilder, n: AtenCall) -> object:
    a = n.args
    return c.op("matmul", c.value(a["self"]), c.value(a.get("mat2", a.get("other"))))


def _addmm_check(n: AtenCall) -> str | None:
    a = n.args
    return None if a.get("beta", 1) == 1 and a.get("alpha", 1) == 1 else "beta/alpha != 1"


@aten_importer("addmm.default", check=_addmm_check)
def _aten_addmm(c: AtenBuilder, n: AtenCall) -> object:
    y = c.op("matmul", c.value(n.args["mat1"]), c.value(n.args["mat2"]))
    return c.op("add", y, c.value(n.args["self"]))
