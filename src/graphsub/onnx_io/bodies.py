"""Control-flow bodies as models of their own: what import types If, Loop and Scan nodes with,
and what the search of bodies (graphsub.pipeline.bodies) searches.

A body is a graph whose inputs are its formal inputs (typed from its node's inputs: a Loop's
carried values, a Scan's states and one slice of each scanned input) and the outer values it
captures. Imported by graphsub like any model, its output types are the node's output types
over the model's sizes, where onnxruntime's symbolic inference of control flow fails (it
asserts on bodies whose outputs declare no shape).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from graphsub.errors import GraphsubError, ModelLoadError
from graphsub.tensors.symbolic import Dim, dim_text, size_symbol
from graphsub.tensors.onnx_types import value_info as typed_value_info
from graphsub.tensors.types import TensorType
from graphsub.ops.control_flow import captured_names


def attr_int(node: onnx.NodeProto, name: str, default: int) -> int:
    return next((a.i for a in node.attribute if a.name == name), default)


def attr_ints(node: onnx.NodeProto, name: str) -> list[int] | None:
    return next((list(a.ints) for a in node.attribute if a.name == name), None)


def bodies(node: onnx.NodeProto) -> list[tuple[str, onnx.GraphProto]]:
    """The node's bodies, each with the name of its attribute (`branches[1]` for a GRAPHS)."""
    found = []
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            found.append((attr.name, attr.g))
        elif attr.type == onnx.AttributeProto.GRAPHS:
            found += [(f"{attr.name}[{k}]", g) for k, g in enumerate(attr.graphs)]
    return found


def formal_types(node: onnx.NodeProto, attr: str, in_types: Mapping[str, TensorType]
                 ) -> list[TensorType] | None:
    """The types of a body's formal inputs, from the node's inputs by name; None where they
    are not known before it runs (an op graphsub does not know the bodies of)."""
    if node.op_type == "If":
        return []
    maybe = [in_types.get(n) if n else None for n in node.input]
    inputs = [t for t in maybe if t is not None]
    if node.op_type == "Loop" and attr == "body":
        carried = [t for t in maybe[2:] if t is not None]
        if len(carried) != len(maybe[2:]):
            return None
        return [TensorType((), "int64"), TensorType((), "bool"), *carried]
    if node.op_type == "Scan" and attr == "body":
        scans = attr_int(node, "num_scan_inputs", 0)
        if len(inputs) != len(maybe) or not scans:
            return None
        states, scanned = inputs[:len(inputs) - scans], inputs[len(inputs) - scans:]
        axes = attr_ints(node, "scan_input_axes") or [0] * scans
        slices = []
        for t, axis in zip(scanned, axes):
            axis = axis + t.rank if axis < 0 else axis
            slices.append(TensorType(t.shape[:axis] + t.shape[axis + 1:], t.dtype))
        return [*states, *slices]
    return None


def body_reads(body: onnx.GraphProto) -> tuple[str, ...]:
    """The outer values a body reads."""
    holder = onnx.NodeProto()
    attr = holder.attribute.add()
    attr.name, attr.type = "body", onnx.AttributeProto.GRAPH
    attr.g.CopyFrom(body)
    return captured_names(holder)


class Placeholders:
    """Size expressions written as dim_params a model of its own reads back: a plain size
    symbol keeps its name (so that the shape profile still binds it); any other expression
    (`2*seq`) stands in as a fresh name, put back by `restore`."""

    def __init__(self) -> None:
        self.names: dict[Any, str] = {}

    def dims(self, t: TensorType) -> list[int | str]:
        return [d if isinstance(d, int) else dim_text(d) if d.is_Symbol
                else self.names.setdefault(d, f"graphsub_size{len(self.names)}") for d in t.shape]

    def restore(self, t: TensorType) -> TensorType:
        if t.is_static or not self.names:
            return t
        back = {size_symbol(name): expr for expr, name in self.names.items()}
        return TensorType(tuple(d if isinstance(d, int) else d.xreplace(back) for d in t.shape),
                          t.dtype)


def standalone_model(body: onnx.GraphProto, formal: Sequence[TensorType],
                     captured: Mapping[str, TensorType], inside: Mapping[str, onnx.TensorProto],
                     opsets: Sequence[tuple[str, int]], sizes: Placeholders) -> onnx.ModelProto:
    """The body as a model: formal inputs, then the captured values it reads (those in
    `inside`, outer weights, as initializers instead)."""
    def value_info(name: str, t: TensorType) -> onnx.ValueInfoProto:
        return typed_value_info(name, t, None if t.is_opaque else sizes.dims(t))

    reads = set(body_reads(body))
    inputs = [value_info(i.name, t) for i, t in zip(body.input, formal)]
    inputs += [value_info(n, t) for n, t in captured.items() if n in reads and n not in inside]
    graph = helper.make_graph(list(body.node), body.name or "body", inputs, list(body.output),
                              initializer=[*body.initializer,
                                           *(t for n, t in inside.items() if n in reads)],
                              sparse_initializer=list(body.sparse_initializer))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    model.ir_version = 8
    return model


#: Imports a model (onnx_io.importer.load, which calls this module: it passes itself).
Loader = Callable[[onnx.ModelProto], Any]


def _body_output_types(node: onnx.NodeProto, attr: str, body: onnx.GraphProto,
                       in_types: Mapping[str, TensorType], constants: Mapping[str, np.ndarray],
                       opsets: Sequence[tuple[str, int]], load: Loader
                       ) -> list[TensorType] | None:
    formal = formal_types(node, attr, in_types)
    if formal is None or len(formal) != len(body.input):
        return None
    sizes = Placeholders()
    inside = {n: numpy_helper.from_array(np.asarray(constants[n]), n)
              for n in body_reads(body) if n in constants}
    model = standalone_model(body, formal, in_types, inside, opsets, sizes)
    try:
        graph = load(model)
    except GraphsubError as exc:
        if RANKS_DIFFER in str(exc):  # a definite refusal inside: say it, not a vaguer one
            raise ModelLoadError(f"{exc} (inside {node.op_type} node {node.name!r} {attr})"
                                 ) from None
        return None
    return [sizes.restore(graph.type_of(v)) for v in graph.outputs]


#: What the refusal of an If whose branches differ says (kept when it is nested).
RANKS_DIFFER = "compute values of different types"


def _same(a: Sequence[TensorType], b: Sequence[TensorType]) -> bool:
    return len(a) == len(b) and all(x == y for x, y in zip(a, b))


def _stacked(t: TensorType, axis: int, length: Dim) -> TensorType:
    axis = axis + t.rank + 1 if axis < 0 else axis
    return TensorType(t.shape[:axis] + (length,) + t.shape[axis:], t.dtype)


def output_types(node: onnx.NodeProto, in_types: Mapping[str, TensorType],
                 constants: Mapping[str, np.ndarray], opsets: Sequence[tuple[str, int]],
                 load: Loader) -> list[TensorType] | None:
    """The output types of an If, Loop or Scan node over the model's sizes, from its bodies
    imported by graphsub; None where they cannot be told before it runs (branches of other
    shapes, carried values that change shape, a trip count that is data)."""
    found = bodies(node)
    per_body = [_body_output_types(node, attr, body, in_types, constants, opsets, load)
                for attr, body in found]
    if node.op_type == "If":
        # A branch that cannot run at these shapes (a model's 8 kHz branch given 16 kHz
        # frames) fails there in the model too: the types are those of the branches that run.
        typed = [t for t in per_body if t is not None]
        if not typed:
            return None
        for other in typed[1:]:
            if not _same(typed[0], other):
                raise ModelLoadError(
                    f"the branches of If node {node.name!r} {RANKS_DIFFER} "
                    f"({', '.join(map(str, typed[0]))} against {', '.join(map(str, other))}), "
                    "which its condition picks as the model runs (a squeeze when a size is 1, "
                    "say); give concrete sizes with --input-shape NAME=1x128 so that the "
                    "condition is known")
        return typed[0]
    outs = per_body[0] if len(per_body) == 1 else None
    if outs is None:
        return None
    if node.op_type == "Loop":
        carried = [in_types[n] for n in node.input[2:]]
        body_carried, scan_outs = outs[1:1 + len(carried)], outs[1 + len(carried):]
        trip = constants.get(node.input[0]) if node.input and node.input[0] else None
        if not _same(carried, body_carried) or (scan_outs and trip is None):
            return None
        count = int(trip) if trip is not None else 0  # (no scan outputs where it is None)
        return [*carried, *(_stacked(t, 0, count) for t in scan_outs)]
    if node.op_type == "Scan":
        scans = attr_int(node, "num_scan_inputs", 0)
        states = [in_types[n] for n in node.input[:len(node.input) - scans]]
        first = in_types[node.input[len(node.input) - scans]]
        in_axis = (attr_ints(node, "scan_input_axes") or [0])[0]
        length = first.shape[in_axis]
        out_axes = attr_ints(node, "scan_output_axes") or [0] * (len(outs) - len(states))
        if not _same(states, outs[:len(states)]):
            return None
        return [*states, *(_stacked(t, a, length)
                           for t, a in zip(outs[len(states):], out_axes))]
    return None
