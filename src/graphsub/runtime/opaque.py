"""Opaque nodes run by onnxruntime: each distinct node and input types gets a one-node model
and session, kept for reuse (a model's opaque Shape or Gather runs on every evaluation)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from onnx import helper

from graphsub.tensors.onnx_types import array_type, value_info
from graphsub.tensors.types import Attrs, TensorType
from graphsub.ops import opaque
from graphsub.runtime.ort_sessions import (bfloat16_through_float32, make_model, make_session,
                                  with_bfloat16)


@lru_cache(maxsize=256)
def _session(node_bytes: bytes, domain_opsets: tuple[tuple[str, int], ...],
             in_types: tuple[TensorType, ...], out_types: tuple[TensorType, ...],
             slots: tuple[int, ...], captures: tuple[str, ...]
             ) -> tuple[Any, list[str], list[str], tuple[frozenset[str], frozenset[str]]]:
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

    outs = [n for n in out_names if n]
    graph = helper.make_graph([node], "opaque",
                              [value_info(n, t) for n, t in zip(in_names, in_types)],
                              [value_info(n, t) for n, t in zip(outs, out_types)])
    bridged = bfloat16_through_float32(graph)
    model = make_model(graph, domain_opsets)
    return (make_session(model.SerializeToString(), threads=1, optimize=False), in_names, outs,
            bridged)


def evaluate_opaque(attrs: Attrs, xs: Sequence[Any]) -> tuple[Any, ...]:
    """The node run by onnxruntime on these inputs: arrays, and for the opaque values it
    reads (sequences as lists, optionals, maps, strings) values of the types it declares."""
    declared = attrs["opaque_inputs"] or (b"",) * len(xs)
    in_types = tuple(TensorType.opaque(t) if t else array_type(x) for x, t in zip(xs, declared))
    sess, names, outs, (bf16_in, bf16_out) = _session(
        attrs["onnx_node"], attrs["opsets"], in_types, attrs["output_types"],
        attrs["input_slots"], attrs["captures"])
    return tuple(with_bfloat16(sess.run, outs, dict(zip(names, xs)), bf16_in, bf16_out))


opaque.set_evaluator(evaluate_opaque)
