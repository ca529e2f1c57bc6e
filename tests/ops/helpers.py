"""Run one operator through the numpy reference, onnxruntime and graphsub's torch backend
(on the CPU, and on a GPU where torch sees one), and compare."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import Any

import numpy as np

from graphsub.ir.builder import GraphBuilder
from graphsub.ir.graph import Graph, Value
from graphsub.onnx_io import to_onnx
from graphsub.runtime import evaluate, run
from graphsub.verdicts import diff_arrays


def torch_devices() -> list[str]:
    """The devices the torch backend is checked on: the CPU, and CUDA where present."""
    if importlib.util.find_spec("torch") is None:
        return []
    import torch

    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def run_on_torch(graph: Graph, feeds: dict[str, np.ndarray], device: str) -> dict[str, np.ndarray]:
    from graphsub.targets.torch import TorchProgram

    return TorchProgram(graph, device).run(feeds)


def check_op(op: str, inputs: Sequence[np.ndarray], attrs: dict[str, Any] | None = None,
             opset: int = 17, rtol: float = 1e-4, atol: float = 1e-5,
             weights: Sequence[int] = ()) -> list[np.ndarray]:
    """Build a one-op graph (inputs as graph inputs, except the positions in `weights`, which
    become weights), evaluate it with the reference, with onnxruntime and with the torch
    backend, assert agreement, and return the reference outputs."""
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
    results = {"onnxruntime": run(to_onnx(graph, opset=opset), feeds)}
    for device in torch_devices():
        results[f"torch-{device}"] = run_on_torch(graph, feeds, device)
    for runner, got in results.items():
        for name in ref:
            assert ref[name].shape == got[name].shape, (op, runner, name, ref[name].shape,
                                                        got[name].shape)
            assert ref[name].dtype == got[name].dtype, (op, runner, name, ref[name].dtype,
                                                        got[name].dtype)
            d = diff_arrays(name, got[name], ref[name], rtol, atol)
            assert d.ok, f"{op} {attrs} on {runner}: {d.describe()}"
    return [ref[f"y{i}"] for i in range(len(outs))]
