"""Export a Graph as a standard ONNX model.

Only ai.onnx ops are written (opaque nodes keep whatever domain they came with). Weight-only
subgraphs are evaluated once and written as initializers (TASO section 7.3), graph input and
output names and order are kept, the result passes `onnx.checker` with full checking, and
files are written atomically so a failure never leaves a partial model behind.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from graphsub.errors import ExportError
from graphsub.ir.graph import Graph, Value
from graphsub.ops import get_op
from graphsub.runtime.ort import make_model
from graphsub.runtime.reference import materialized_weights

#: The opset written for graphs that did not come from an ONNX file.
DEFAULT_OPSET = 17
MIN_OPSET, MAX_OPSET = 13, 23


class ExportContext:
    """What an operator's export function writes into: nodes, constants and fresh names."""

    def __init__(self, opset: int) -> None:
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.domains: dict[str, int] = {}
        self._used: set[str] = set()
        self._const_names: dict[bytes, str] = {}

    def reserve(self, name: str) -> str:
        if name in self._used:
            raise ExportError(f"value name {name!r} is used twice")
        self._used.add(name)
        return name

    def fresh(self, hint: str) -> str:
        base = "".join(c if c.isalnum() or c in "_./:" else "_" for c in hint) or "v"
        name, k = base, 1
        while name in self._used:
            name = f"{base}_{k}"
            k += 1
        self._used.add(name)
        return name

    def emit(self, op_type: str, inputs: Sequence[str], outputs: Sequence[str],
             **attrs: Any) -> None:
        self.nodes.append(helper.make_node(op_type, list(inputs), list(outputs),
                                           name=self.fresh(f"{op_type}_n"), **attrs))

    def emit_proto(self, node: onnx.NodeProto, inputs: Sequence[str], outputs: Sequence[str],
                   opsets: Sequence[tuple[str, int]]) -> None:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        del copy.input[:]
        copy.input.extend(inputs)
        del copy.output[:]
        copy.output.extend(outputs)
        copy.name = self.fresh(node.name or f"{node.op_type}_n")
        for domain, version in opsets:
            if domain not in ("", "ai.onnx"):
                self.domains[domain] = version
        self.nodes.append(copy)

    def const(self, array: np.ndarray, hint: str = "const") -> str:
        """An initializer holding `array` (small constants are shared by content)."""
        arr = np.asarray(array)
        key = None
        if arr.size <= 64:
            key = arr.dtype.str.encode() + str(arr.shape).encode() + arr.tobytes()
            if key in self._const_names:
                return self._const_names[key]
        name = self.fresh(hint)
        self.add_initializer(name, arr)
        if key is not None:
            self._const_names[key] = name
        return name

    def add_initializer(self, name: str, array: np.ndarray) -> None:
        self.initializers.append(numpy_helper.from_array(np.asarray(array, order="C"), name))


def _value_info(name: str, t) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(
        name, helper.np_dtype_to_tensor_dtype(np.dtype(t.dtype)), list(t.shape))


def check_onnx(model: onnx.ModelProto | bytes) -> None:
    """Run onnx.checker with full checking (shape inference included); raise ExportError."""
    try:
        onnx.checker.check_model(model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise ExportError(f"the exported model does not pass the ONNX checker: {exc}") from None
    except ValueError as exc:  # larger than protobuf's 2 GiB limit
        raise ExportError(f"cannot check the exported model: {exc}") from None


def to_onnx(graph: Graph, opset: int | None = None, model_name: str = "graphsub",
            check: bool = True) -> onnx.ModelProto:
    """The graph as an ONNX ModelProto, checked by onnx.checker unless `check` is False."""
    opset = opset or graph.meta.get("opset") or DEFAULT_OPSET
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise ExportError(f"cannot export at opset {opset}: graphsub writes opsets "
                          f"{MIN_OPSET} to {MAX_OPSET}")
    ctx = ExportContext(opset)
    order = graph.topo_order()
    weight_only = graph.weight_only()

    # The weight-only values computation or outputs read directly become initializers.
    folded = materialized_weights(graph)
    needed = {v.node for v in folded}

    names: dict[Value, str] = {}
    for nid in graph.inputs:
        names[Value(nid, 0)] = ctx.reserve(graph[nid].attrs["name"])
    for out_name in graph.output_names:
        if out_name not in names.values():
            ctx.reserve(out_name)
    # A computed value that is exactly one graph output takes the output's name directly.
    output_count: dict[Value, int] = {}
    for v in graph.outputs:
        output_count[v] = output_count.get(v, 0) + 1
    for v, name in zip(graph.outputs, graph.output_names):
        if (output_count[v] == 1 and v.node not in weight_only and graph[v.node].op != "input"
                and v not in names):
            names[v] = name

    for nid in order:
        if nid not in needed:
            continue
        node = graph[nid]
        for i in range(len(node.outputs)):
            v = Value(nid, i)
            names[v] = ctx.fresh(node.name or f"w{nid}" + (f"_{i}" if i else ""))
            ctx.add_initializer(names[v], folded[v])

    for nid in order:
        node = graph[nid]
        if node.op == "input" or nid in weight_only:
            continue
        outs = []
        for i in range(len(node.outputs)):
            v = Value(nid, i)
            if v not in names:
                names[v] = ctx.fresh(node.name if node.name and len(node.outputs) == 1
                                     else f"{node.op}_{nid}" + (f"_{i}" if i else ""))
            outs.append(names[v])
        ins = [names[v] for v in node.inputs]
        get_op(node.op).export(ctx, node.attrs, ins, outs, graph.input_types(nid))

    for v, name in zip(graph.outputs, graph.output_names):
        if names[v] != name:
            ctx.emit("Identity", [names[v]], [name])

    onnx_graph = helper.make_graph(
        ctx.nodes, model_name,
        [_value_info(graph[i].attrs["name"], graph[i].type) for i in graph.inputs],
        [_value_info(name, graph.type_of(v)) for v, name in zip(graph.outputs, graph.output_names)],
        initializer=ctx.initializers)
    model = make_model(onnx_graph, [("", opset), *sorted(ctx.domains.items())])
    if check:
        check_onnx(model)
    return model


def write_atomic(data: bytes, path: str | os.PathLike[str]) -> Path:
    """Write bytes to path through a temporary file in the same folder and a rename, so the
    path holds either the old content or the complete new one, never a partial file. The file
    gets the permissions a plain write would give it: an existing file's, or the umask's for
    a new one (the temporary file is private until then)."""
    target = Path(path)
    if target.parent and not target.parent.exists():
        raise ExportError(f"cannot write {target}: folder {target.parent} does not exist")
    mode = target.stat().st_mode & 0o7777 if target.exists() else 0o666 & ~_umask()
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent or ".")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return target


def _umask() -> int:
    """The process's umask (reading it means setting it; it is put back at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def to_onnx_bytes(graph: Graph, opset: int | None = None, model_name: str = "graphsub") -> bytes:
    """The serialized, checked ONNX model (checked on the bytes, so large models are
    serialized once rather than twice)."""
    model = to_onnx(graph, opset, model_name=model_name, check=False)
    try:
        data = model.SerializeToString()
    except ValueError as exc:
        raise ExportError(f"the model is too large for a single ONNX file: {exc}") from None
    check_onnx(data)
    return data


def save(graph: Graph, path: str | os.PathLike[str], opset: int | None = None) -> Path:
    """Export the graph and write it atomically to `path`."""
    return write_atomic(to_onnx_bytes(graph, opset, model_name=Path(path).stem), path)
