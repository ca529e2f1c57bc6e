"""A summary of what a graph contains and costs: what `graphsub info` prints."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from graphsub.ir.graph import Graph
from graphsub.ops import get_op


@dataclass(frozen=True)
class GraphSummary:
    nodes: int
    ops: dict[str, int]
    opaque_ops: dict[str, int]
    parameters: int
    parameter_bytes: int
    flops: int
    bytes_moved: int
    weight_only_nodes: int
    inputs: list[dict[str, Any]]
    outputs: list[dict[str, Any]]
    opset: int | None
    structural_hash: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(graph: Graph) -> GraphSummary:
    """Operator counts, parameters, FLOPs and bytes moved of the computation that runs at
    inference: weight-only nodes are folded at export, so they cost nothing and are counted
    separately."""
    weight_only = graph.weight_only()
    ops: Counter[str] = Counter()
    opaque: Counter[str] = Counter()
    params = param_bytes = flops = moved = 0
    folded = 0
    for nid in graph.topo_order():
        node = graph[nid]
        if node.op == "weight":
            params += node.type.numel
            param_bytes += node.type.nbytes
            continue
        if node.op == "input":
            continue
        if nid in weight_only:
            folded += 1
            continue
        ops[node.op] += 1
        if node.op == "opaque":
            opaque[node.attrs["op_type"]] += 1
        opdef = get_op(node.op)
        ins = graph.input_types(nid)
        flops += opdef.flops(node.attrs, ins, node.outputs)
        moved += opdef.bytes(node.attrs, ins, node.outputs)
    return GraphSummary(
        nodes=len(graph), ops=dict(ops.most_common()), opaque_ops=dict(opaque.most_common()),
        parameters=params, parameter_bytes=param_bytes, flops=flops, bytes_moved=moved,
        weight_only_nodes=folded,
        inputs=[{"name": graph[i].attrs["name"], "shape": list(graph[i].type.shape),
                 "dtype": graph[i].type.dtype} for i in graph.inputs],
        outputs=[{"name": n, "shape": list(graph.type_of(v).shape),
                  "dtype": graph.type_of(v).dtype}
                 for n, v in zip(graph.output_names, graph.outputs)],
        opset=graph.meta.get("opset"), structural_hash=graph.structural_hash())


def human(n: float, unit: str = "") -> str:
    """1234567 -> '1.23 M' (decimal prefixes)."""
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {prefix}{unit}"
    return f"{n:g} {unit}".rstrip()
