"""Opaque nodes run by onnxruntime: each distinct node and input types gets a one-node model
and session, kept for reuse (a model's opaque Shape or Gather runs on every evaluation)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np
from onnx import helper

from graphsub.tensors.symbolic import dim_text
from graphsub.tensors.types import Attrs, TensorType
from graphsub.ops import opaque
from graphsub.runtime.ort import make_model, make_session


@lru_cache(maxsize=256)
def _session(node_bytes: bytes, domain_opsets: tuple[tuple[str, int], ...],
             in_types: tuple[TensorType, ...], out_types: tuple[TensorType, ...],
             slots: tuple[int, ...], captures: tuple[str, ...]):
    node = opaque.node_proto(node_bytes)
    # A body reads its captured values by their own names; the node's inputs and outputs get
    # names no body uses.
    in_names = [f"_graphsub_in{i}" for i in range(len(slots))] + list(captures)
    names = [""] * len(node.input)
    for pos, slot in enumerate(slots):
        names[slot] = in_names[pos]
    out_names = [f"_graphsub_out{i}" if o else "" for i, o in enumerate(node.output)]
    del node.input[:]
    node.input.extend(names)
    del node.output[:]
    node.output.extend(out_names)

    def vi(name: str, t: TensorType):  # a size expression as a dim_param (`2*seq`)
        return helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(np.dtype(t.dtype)),
            [d if type(d) is int else dim_text(d) for d in t.shape])

    outs = [n for n in out_names if n]
    graph = helper.make_graph([node], "opaque", [vi(n, t) for n, t in zip(in_names, in_types)],
                              [vi(n, t) for n, t in zip(outs, out_types)])
    model = make_model(graph, domain_opsets)
    return make_session(model.SerializeToString(), threads=1, optimize=False), in_names


def evaluate_opaque(attrs: Attrs, xs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    in_types = tuple(TensorType(x.shape, str(x.dtype)) for x in xs)
    sess, names = _session(attrs["onnx_node"], attrs["opsets"], in_types,
                           attrs["output_types"], attrs["input_slots"], attrs["captures"])
    return tuple(sess.run(None, dict(zip(names, xs))))


opaque.set_evaluator(evaluate_opaque)
