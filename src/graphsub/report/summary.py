"""A summary of what a graph contains and costs: what `graphsub info` prints."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from graphsub.ir.binding import bind_graph
from graphsub.ir.graph import Graph
from graphsub.tensors.symbolic import is_symbolic
from graphsub.ops import get_op
from graphsub.runtime.check_sizes import default_profile


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
    #: A graph with symbolic sizes: each symbol's range, and the FLOPs and bytes moved (given
    #: above as expressions of the sizes) at the default profile.
    symbols: dict[str, str] = field(default_factory=dict)
    at_profile: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for key in ("flops", "bytes_moved"):
            data[key] = data[key] if isinstance(data[key], int) else str(data[key])
        for io in ("inputs", "outputs"):
            for item in data[io]:
                item["shape"] = [d if isinstance(d, int) else str(d) for d in item["shape"]]
        return data


def operator_count(graph: Graph) -> int:
    """The operators that run at inference: every node but the inputs, the weights and what
    is computed from weights alone (folded at export). What `info`, `zoo export` and
    `optimize` all count, so that one model has one count."""
    weight_only = graph.weight_only()
    return sum(1 for nid, node in graph.nodes.items()
               if node.op not in ("input", "weight") and nid not in weight_only)


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
        opset=graph.facts.opset, structural_hash=graph.structural_hash(),
        **_at_profile(graph))


def _at_profile(graph: Graph) -> dict[str, Any]:
    """For a graph with symbolic sizes: the symbols' ranges, and its FLOPs and bytes moved at
    the default profile (runtime.check_sizes.default_profile)."""
    symbols = graph.facts.symbols
    if not symbols:
        return {}
    (shape,) = default_profile(symbols)
    bound = summarize(bind_graph(graph, shape.values))
    return {"symbols": {n: str(r) for n, r in symbols.items()},
            "at_profile": {"profile": str(shape), "flops": bound.flops,
                           "bytes_moved": bound.bytes_moved}}


def human(n: Any, unit: str = "") -> str:
    """1234567 -> '1.23 M' (decimal prefixes); an expression of sizes as it is written."""
    if is_symbolic(n):
        return f"{n} {unit}".rstrip()
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {prefix}{unit}"
    return f"{n:g} {unit}".rstrip()
