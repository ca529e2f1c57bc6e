"""A generated kernel: a connected, convex group of elementwise, reduction and layout
primitives that a code generator compiles into one kernel (Korch's generated kernels; TVM in
the fission paper and Korch, inductor here).

The operator carries its group as data (`body`), so that one definition serves everywhere:
shape inference and numpy semantics replay the primitives; ONNX export writes them out as
standard operators (a model file never depends on the code generator); the torch lowering
compiles them with inductor into one kernel, once per body and input types (inductor's cache
keeps it across runs).

    body = (nodes, outputs)
    nodes: ((op, attrs, (ref, ...)), ...)   in topological order
    ref:   ("in", i) the i-th input  |  ("node", j, k) output k of node j
    outputs: (ref, ...)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from graphsub.errors import ShapeError
from graphsub.tensors.types import Attrs, TensorType
from graphsub.ops.base import (AttrSpec, Category, OpDef, TorchFn, TorchLowering, Types, get_op,
                               register)

from graphsub.ops.contexts import OpExportContext

Ref = tuple[Any, ...]
Body = tuple[tuple[tuple[str, Attrs, tuple[Ref, ...]], ...], tuple[Ref, ...]]


def _get(ref: Ref, inputs: Sequence[Any], values: list[Sequence[Any]]) -> Any:
    return inputs[ref[1]] if ref[0] == "in" else values[ref[1]][ref[2]]


def _replay(body: Body, inputs: Sequence[Any], types: Sequence[TensorType],
            apply: Callable[[str, Attrs, list[Any], tuple[TensorType, ...]], Sequence[Any]]
            ) -> tuple[list[Any], list[TensorType]]:
    """Run the body's nodes in order, `apply` computing each node's values from its
    arguments' values and types; the outputs' values and types."""
    nodes, outputs = body
    values: list[Sequence[Any]] = []
    node_types: list[Sequence[TensorType]] = []
    for op, attrs, refs in nodes:
        arg_types = tuple(_get(r, types, node_types) for r in refs)
        node_types.append(get_op(op).infer(attrs, arg_types))
        values.append(apply(op, attrs, [_get(r, inputs, values) for r in refs], arg_types))
    return ([_get(r, inputs, values) for r in outputs],
            [_get(r, types, node_types) for r in outputs])


def _infer(attrs: Attrs, ins: Types) -> Types:
    body: Body = attrs["body"]
    try:
        _, types = _replay(body, list(ins), list(ins),
                           lambda op, a, args, t: get_op(op).infer(a, t))
    except (IndexError, KeyError, TypeError) as exc:
        raise ShapeError(f"fused: the body does not fit its {len(ins)} inputs ({exc})") from None
    return tuple(types)


def _evaluate(attrs: Attrs, xs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    types = [TensorType(tuple(x.shape), str(x.dtype)) for x in xs]
    values, _ = _replay(attrs["body"], list(xs), types,
                        lambda op, a, args, t: get_op(op).evaluate(a, args))
    return tuple(values)


def _export(ctx: OpExportContext, attrs: Attrs, ins: list[str], outs: list[str],
            types: Types) -> None:
    """The primitives, written out one ONNX operator each (a standard model)."""
    body: Body = attrs["body"]
    final = {ref[1:]: name for ref, name in zip(body[1], outs) if ref[0] == "node"}

    def emit(op: str, a: Attrs, args: list[str], arg_types: tuple[TensorType, ...]) -> list[str]:
        j = len(emitted)
        count = len(get_op(op).infer(a, arg_types))
        names = [final.get((j, k)) or ctx.fresh("fused") for k in range(count)]
        get_op(op).export(ctx, a, args, names, arg_types)
        emitted.append(names)
        return names

    emitted: list[list[str]] = []
    values, _ = _replay(body, ins, list(types), emit)
    for ref, name, value in zip(body[1], outs, values):
        if ref[0] == "in" or value != name:  # an input passed through, or an output twice
            ctx.emit("Identity", [value], [name])


def _torch(t: TorchLowering, attrs: Attrs, ins: Types, outs: Types) -> TorchFn:
    """The primitives' own lowerings composed, compiled by the code generator as one kernel."""
    body: Body = attrs["body"]
    nodes, outputs = body
    lowered: list[TorchFn] = []

    def build(op: str, a: Attrs, args: list[Any], arg_types: tuple[TensorType, ...]) -> list[Any]:
        out_types = get_op(op).infer(a, arg_types)
        lower = get_op(op).torch
        assert lower is not None  # a generated kernel's primitives all have lowerings
        lowered.append(lower(t, a, arg_types, out_types))
        return [None] * len(out_types)

    _replay(body, [None] * len(ins), list(ins), build)

    def run(*xs: Any) -> tuple[Any, ...]:
        values: list[Sequence[Any]] = []
        for (_, _, refs), fn in zip(nodes, lowered):
            values.append(fn(*(_get(r, xs, values) for r in refs)))
        return tuple(_get(r, xs, values) for r in outputs)

    return t.generated(run, ins, outs)


def _flops(attrs: Attrs, ins: Types, outs: Types) -> int:
    total = 0

    def count(op: str, a: Attrs, args: list[Any], arg_types: tuple[TensorType, ...]) -> list[Any]:
        nonlocal total
        out_types = get_op(op).infer(a, arg_types)
        total += get_op(op).flops(a, arg_types, out_types)
        return [None] * len(out_types)

    _replay(attrs["body"], [None] * len(ins), list(ins), count)
    return total


def body_of(nodes: Sequence[tuple[str, Attrs, Sequence[Ref]]], outputs: Sequence[Ref]) -> Body:
    """A body in canonical form (tuples throughout)."""
    return (tuple((op, attrs, tuple(tuple(r) for r in refs)) for op, attrs, refs in nodes),
            tuple(tuple(r) for r in outputs))


register(OpDef(
    name="fused", inputs=(1, None), attrs=(AttrSpec("body", convert=tuple),),
    category=Category.GENERATED,
    infer=_infer, evaluate=_evaluate, export=_export, torch=_torch, flops=_flops,
    doc="A group of primitives compiled as one generated kernel (graphsub.fission); exported "
        "as the primitives.",
))
