"""Opaque nodes: ONNX ops graphsub does not model.

An opaque node keeps its ONNX NodeProto, takes its output types from ONNX shape inference at
import, is evaluated by onnxruntime, is exported unchanged and is never rewritten. This is what
lets graphsub import any real model while optimizing the parts it understands. A node with
bodies (If, Loop, Scan) also takes the outer values its bodies read as inputs after its own
(`captures` names them as the bodies do: graphsub.ops.control_flow).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np

from graphsub.errors import GraphsubError, NoLoweringError
from graphsub.tensors.types import Attrs
from graphsub.ops.control_flow import defined_names, rename_captures
from graphsub.ops.base import (AttrSpec, Category, OpDef, TorchFn, TorchLowering, Types, is_float,
                               register)

from graphsub.ops.contexts import OpExportContext

if TYPE_CHECKING:
    import onnx


def node_proto(node_bytes: bytes) -> onnx.NodeProto:
    """The node's ONNX NodeProto, as imported."""
    import onnx

    node = onnx.NodeProto()
    node.ParseFromString(node_bytes)
    return node


@lru_cache(maxsize=512)
def body_names(node_bytes: bytes) -> frozenset[str]:
    """The value names assigned inside the node's bodies (none for a node without): every
    export asks it of every opaque node, so it is parsed once per node."""
    return frozenset(defined_names(node_proto(node_bytes)))


OpaqueEvaluator = Callable[[Attrs, Sequence[np.ndarray]], tuple[np.ndarray, ...]]

#: Runs one opaque node; graphsub.runtime registers onnxruntime here when it is imported (the
#: operators sit below the runtime that evaluates graphs of them).
_evaluator: OpaqueEvaluator | None = None


def set_evaluator(evaluator: OpaqueEvaluator) -> None:
    global _evaluator
    _evaluator = evaluator


def _eval(attrs: Attrs, xs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    if _evaluator is None:
        raise GraphsubError(f"an opaque {attrs['op_type']} node is run by onnxruntime through "
                            "graphsub.runtime: evaluate the graph with graphsub.runtime.evaluate")
    return _evaluator(attrs, xs)


def _export(ctx: OpExportContext, attrs: Attrs, ins: list[str], outs: list[str],
            types: Types) -> None:
    node = node_proto(attrs["onnx_node"])
    names = [""] * len(node.input)
    slots = attrs["input_slots"]
    for pos, slot in enumerate(slots):
        names[slot] = ins[pos]
    captures = attrs["captures"]
    if captures:
        rename_captures(node, dict(zip(captures, ins[len(slots):])))
    out_iter = iter(outs)
    out_names = [next(out_iter) if o else "" for o in node.output]
    ctx.emit_proto(node, names, out_names, attrs["opsets"])


def _infer(attrs: Attrs, ins: Types) -> Types:
    return tuple(attrs["output_types"])


#: Ops that turn quantized weights into floats (kept as they are: see ops.is_foldable), in
#: the forms graphsub leaves opaque (blocked, 4-bit, float8, onnxruntime's own).
DEQUANTIZATIONS = frozenset({"DequantizeLinear", "com.microsoft.DequantizeLinear",
                             "com.microsoft.DequantizeBFP", "com.microsoft.DequantizeWithOrder"})
#: Ops that turn floats into quantized values, in the forms graphsub leaves opaque.
QUANTIZATIONS = frozenset({"QuantizeLinear", "DynamicQuantizeLinear",
                           "com.microsoft.QuantizeLinear"})


def is_dequantization(attrs: Attrs) -> bool:
    return attrs["op_type"] in DEQUANTIZATIONS


def is_quantization(attrs: Attrs) -> bool:
    return attrs["op_type"] in QUANTIZATIONS


def is_foldable(attrs: Attrs) -> bool:
    """Whether the node over constants may be computed once at export: not where onnxruntime
    has no kernel for it here (an Equal over bfloat16), which only the model's runtime can
    run."""
    return bool(attrs.get("foldable", True)) and is_deterministic(attrs)


def is_deterministic(attrs: Attrs) -> bool:
    node = node_proto(attrs["onnx_node"])
    return not node.op_type.startswith("Random") and node.op_type not in ("Bernoulli",)


def _native(t: TorchLowering, attrs: Attrs, ins: Types, outs: Types) -> TorchFn | None:
    """The ONNX op as torch code, for the ops exported transformers leave opaque (embedding
    Gathers, boolean mask arithmetic, the NaN guard after a masked softmax): the same values
    onnxruntime computes, without a trip to the host. None: onnxruntime runs it."""
    torch, op, n_in = t.torch, attrs["op_type"], len(ins)
    if tuple(attrs["input_slots"]) != tuple(range(n_in)) or len(outs) != 1:
        return None  # an optional input left out, or a second output
    out = outs[0]
    unary = {"IsNaN": torch.isnan, "Not": torch.logical_not, "Abs": torch.abs,
             "Sign": torch.sign, "Floor": torch.floor, "Ceil": torch.ceil}
    binary = {"And": torch.logical_and, "Or": torch.logical_or, "Xor": torch.logical_xor,
              "Equal": torch.eq, "Less": torch.lt, "LessOrEqual": torch.le,
              "Greater": torch.gt, "GreaterOrEqual": torch.ge}
    if op in unary and n_in == 1:
        if op in ("Floor", "Ceil") and not is_float(ins[0]):
            return None
        fn = unary[op]
        return lambda x: (fn(x),)
    if op in binary and n_in == 2 and ins[0].dtype == ins[1].dtype:
        if op in ("And", "Or", "Xor") and ins[0].dtype != "bool":
            return None
        fn2 = binary[op]
        return lambda a, b: (fn2(a, b),)
    if op == "Where" and n_in == 3 and ins[0].dtype == "bool" and ins[1].dtype == ins[2].dtype:
        return lambda c, a, b: (torch.where(c, a, b),)
    if op == "Expand" and n_in == 2:
        shape = out.shape
        return lambda x, _shape: (torch.broadcast_to(x, shape).contiguous(),)
    node = node_proto(attrs["onnx_node"])
    if op == "Gather" and n_in == 2 and ins[1].dtype in ("int32", "int64"):
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        axis = axis + ins[0].rank if axis < 0 else axis
        lead = (slice(None),) * axis
        # Indexing with a tensor is Gather: the index's shape replaces the axis (a scalar
        # index drops it), and negative indices count from the end.
        return lambda x, i: (x[lead + (i,)],)
    if op == "GatherND" and n_in == 2 and ins[1].dtype == "int64" and ins[1].rank >= 1:
        if any(a.name == "batch_dims" and a.i for a in node.attribute):
            return None
        k = ins[1].shape[-1]
        if not 1 <= k <= ins[0].rank:
            return None
        return lambda x, i: (x[tuple(i[..., j] for j in range(k))],)
    return None


def _torch(t: TorchLowering, attrs: Attrs, ins: Types, outs: Types) -> TorchFn:
    """onnxruntime on the host, called outside the traced program, unless the op is one
    `_native` writes in torch."""
    if any(x.is_opaque for x in (*ins, *outs)):
        raise NoLoweringError(
            f"graphsub's torch backend cannot run the ONNX op {attrs['op_type']!r}: it reads or "
            f"makes a value torch has no tensor for (a sequence, map, optional or strings). "
            f"Use --target ort-cpu or ort-cuda for this model")
    native = _native(t, attrs, ins, outs)
    if native is not None:
        return native
    if t.device.type != "cpu":
        raise NoLoweringError(
            f"graphsub's torch backend cannot run the ONNX op {attrs['op_type']!r} on "
            f"{t.device.type}: it is not one of graphsub's operators, and only on the CPU does "
            "the torch backend run such ops through onnxruntime. Use --target ort-cuda or "
            "torch-cpu for this model")
    torch, n = t.torch, len(outs)

    def run_in_onnxruntime(*xs: Any) -> tuple[Any, ...]:
        arrays = [x.detach().contiguous().numpy() for x in xs]
        return tuple(torch.from_numpy(np.array(y)) for y in _eval(attrs, arrays))

    def opaque(*xs: Any) -> tuple[Any, ...]:
        res = t.leaf(run_in_onnxruntime, *xs)
        return tuple(res[i] for i in range(n))

    return opaque


register(OpDef(
    name="opaque", inputs=(0, None), torch=_torch, category=Category.OPAQUE,
    attrs=(AttrSpec("onnx_node", convert=bytes), AttrSpec("opsets", convert=tuple),
           AttrSpec("output_types", convert=tuple), AttrSpec("input_slots", convert=tuple),
           AttrSpec("op_type", convert=str), AttrSpec("captures", (), convert=tuple),
           AttrSpec("opaque_inputs", (), convert=tuple), AttrSpec("foldable", True, bool)),
    infer=_infer, evaluate=_eval, export=_export,
    doc="An ONNX op graphsub does not model; kept, evaluated and exported as it was. "
        "opaque_inputs: for each input, the ONNX type of an opaque value it reads (a "
        "sequence, an optional, strings), empty for a tensor.",
))
