"""Run one operator through the numpy reference and through onnxruntime, and compare."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from graphsub.ir.builder import GraphBuilder
from graphsub.ir.graph import Value
from graphsub.onnx_io import to_onnx
from graphsub.runtime import diff_arrays, evaluate, run


def check_op(op: str, inputs: Sequence[np.ndarray], attrs: dict[str, Any] | None = None,
             opset: int = 17, rtol: float = 1e-4, atol: float = 1e-5,
             weights: Sequence[int] = ()) -> list[np.ndarray]:
    """Build a one-op graph (inputs as graph inputs, except the positions in `weights`, which
    become weights), evaluate it with the reference and with onnxruntime, assert agreement,
    and return the reference outputs."""
    b = GraphBuilder()
    values = []
    feeds = {}
    for i, arr in enumerate(inputs):
        if i in weights:
            values.append(b.weight(arr))
        else:
            values.append(b.input(f"x{i}", arr.shape, str(arr.dtype)))
            feeds[f"x{i}"] = arr
    outs = b.op(op, *values, **(attrs or {}))
    outs = (outs,) if isinstance(outs, Value) else outs
    for i, v in enumerate(outs):
        b.output(v, f"y{i}")
    graph = b.build()
    ref = evaluate(graph, feeds)
    got = run(to_onnx(graph, opset=opset), feeds)
    for name in ref:
        assert ref[name].shape == got[name].shape, (op, name, ref[name].shape, got[name].shape)
        assert ref[name].dtype == got[name].dtype, (op, name, ref[name].dtype, got[name].dtype)
        d = diff_arrays(name, got[name], ref[name], rtol, atol)
        assert d.ok, f"{op} {attrs}: {d.describe()}"
    return [ref[f"y{i}"] for i in range(len(outs))]
