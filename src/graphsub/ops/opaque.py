"""Opaque nodes: ONNX ops graphsub does not model.

An opaque node keeps its ONNX NodeProto, takes its output types from ONNX shape inference at
import, is evaluated by onnxruntime, is exported unchanged and is never rewritten. This is what
lets graphsub import any real model while optimizing the parts it understands.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from graphsub.ir.types import Attrs, TensorType
from graphsub.ops.base import AttrSpec, OpDef, Types, register


def _proto(node_bytes: bytes):
    import onnx

    node = onnx.NodeProto()
    node.ParseFromString(node_bytes)
    return node


@lru_cache(maxsize=256)
def _session(node_bytes: bytes, domain_opsets: tuple[tuple[str, int], ...],
             in_types: tuple[TensorType, ...], out_types: tuple[TensorType, ...],
             slots: tuple[int, ...]):
    from onnx import helper

    from graphsub.onnx_io.exporter import make_model
    from graphsub.runtime.ort import make_session

    node = _proto(node_bytes)
    in_names = [f"in{i}" for i in range(len(in_types))]
    names = [""] * len(node.input)
    for pos, slot in enumerate(slots):
        names[slot] = in_names[pos]
    out_names = [f"out{i}" if o else "" for i, o in enumerate(node.output)]
    del node.input[:]
    node.input.extend(names)
    del node.output[:]
    node.output.extend(out_names)

    def vi(name: str, t: TensorType):
        return helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(np.dtype(t.dtype)), list(t.shape))

    outs = [n for n in out_names if n]
    graph = helper.make_graph([node], "opaque", [vi(n, t) for n, t in zip(in_names, in_types)],
                              [vi(n, t) for n, t in zip(outs, out_types)])
    model = make_model(graph, domain_opsets)
    return make_session(model.SerializeToString(), threads=1, optimize=False), in_names


def _eval(attrs: Attrs, xs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    in_types = tuple(TensorType(x.shape, str(x.dtype)) for x in xs)
    sess, names = _session(attrs["onnx_node"], attrs["opsets"], in_types,
                           attrs["output_types"], attrs["input_slots"])
    return tuple(sess.run(None, dict(zip(names, xs))))


def _export(ctx, attrs: Attrs, ins: list[str], outs: list[str], types: Types) -> None:
    node = _proto(attrs["onnx_node"])
    names = [""] * len(node.input)
    for pos, slot in enumerate(attrs["input_slots"]):
        names[slot] = ins[pos]
    out_iter = iter(outs)
    out_names = [next(out_iter) if o else "" for o in node.output]
    ctx.emit_proto(node, names, out_names, attrs["opsets"])


def _infer(attrs: Attrs, ins: Types) -> Types:
    return tuple(attrs["output_types"])


def is_deterministic(attrs: Attrs) -> bool:
    node = _proto(attrs["onnx_node"])
    return not node.op_type.startswith("Random") and node.op_type not in ("Bernoulli",)


register(OpDef(
    name="opaque", inputs=(0, None),
    attrs=(AttrSpec("onnx_node", convert=bytes), AttrSpec("opsets", convert=tuple),
           AttrSpec("output_types", convert=tuple), AttrSpec("input_slots", convert=tuple),
           AttrSpec("op_type", convert=str)),
    infer=_infer, evaluate=_eval, export=_export,
    doc="An ONNX op graphsub does not model; kept, evaluated and exported as it was.",
))
