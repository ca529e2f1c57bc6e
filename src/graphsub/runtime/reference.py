"""The numpy reference evaluator: runs a Graph with each operator's reference semantics."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from graphsub.errors import GraphsubError
from graphsub.ir.binding import bind_graph, binding_of, is_symbolic_graph
from graphsub.ir.graph import Graph, Node, Value
from graphsub.ops import get_op
from graphsub.runtime import opaque  # noqa: F401  (onnxruntime evaluates opaque nodes)


def evaluate(graph: Graph, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Evaluate the graph on named inputs; returns the outputs by name.

    Intermediate values are dropped as soon as their last reader has run, so large models
    evaluate in bounded memory. A graph with symbolic sizes is evaluated at the sizes its
    inputs' shapes give.
    """
    values: dict[Value, np.ndarray] = {}
    missing = [n for n in graph.input_names if n not in feeds]
    if missing:
        raise GraphsubError(f"no value given for graph input(s): {', '.join(missing)}")
    if is_symbolic_graph(graph):
        graph = bind_graph(graph, binding_of(graph, {
            graph[i].attrs["name"]: np.shape(feeds[graph[i].attrs["name"]])
            for i in graph.inputs if not graph[i].type.is_opaque}))
    remaining: dict[int, int] = {nid: len(users) for nid, users in graph.users().items()}
    for v in graph.outputs:
        remaining[v.node] = remaining.get(v.node, 0) + 1
    for nid in graph.topo_order():
        node = graph[nid]
        outs: tuple[np.ndarray, ...]
        if node.op == "input" and node.type.is_opaque:
            outs = (feeds[node.attrs["name"]],)  # a sequence, optional or strings: as given
        elif node.op == "input":
            arr = np.asarray(feeds[node.attrs["name"]])
            if arr.shape != node.type.shape or str(arr.dtype) != node.type.dtype:
                raise GraphsubError(f"input {node.attrs['name']!r}: expected {node.type}, got "
                                    f"{arr.dtype}[{'x'.join(map(str, arr.shape))}]")
            outs = (arr,)
        else:
            args = [values[v] for v in node.inputs]
            outs = _evaluate_node(node, args)
            for v in set(node.inputs):
                remaining[v.node] -= node.inputs.count(v)
                if remaining[v.node] <= 0:
                    for i in range(len(graph[v.node].outputs)):
                        values.pop(Value(v.node, i), None)
        for i, out in enumerate(outs):
            values[Value(nid, i)] = out
    return {name: values[v] for name, v in zip(graph.output_names, graph.outputs)}


def _evaluate_node(node: Node, args: list[np.ndarray]) -> tuple[np.ndarray, ...]:
    """One operator's outputs. A graphsub operator over half precision (float16, bfloat16)
    computes in float32 and rounds its outputs to its type, as onnxruntime's CPU provider and
    torch's kernels do (their half-precision kernels accumulate in float32): numpy summing
    in float16 drifts by a few percent over a long reduction (found by the fuzzer). Opaque
    nodes are run by onnxruntime itself."""
    if node.op == "opaque" or not any(a.dtype in HALF_DTYPES for a in args):
        return get_op(node.op).evaluate(node.attrs, args)
    wide = [a.astype(np.float32) if a.dtype in HALF_DTYPES else a for a in args]
    outs = get_op(node.op).evaluate(node.attrs, wide)
    return tuple(np.asarray(o).astype(t.dtype) if t.dtype in HALF_PRECISIONS else o
                 for o, t in zip(outs, node.outputs))


#: The half-precision types, by name and as numpy dtypes.
HALF_PRECISIONS = frozenset({"float16", "bfloat16"})
HALF_DTYPES = frozenset(np.dtype(name) for name in HALF_PRECISIONS)


def materialized_weights(graph: Graph) -> dict[Value, np.ndarray]:
    """The constant tensors a backend must hold to run the graph: the weight-only values that
    computation or the outputs read directly, weights as they are and weight-only computations
    evaluated once (TASO section 7.3). Weight-only nodes read only by other weight-only nodes
    are not materialized."""
    weight_only = graph.weight_only()
    needed = {v.node for v in graph.outputs if v.node in weight_only}
    for nid in graph.topo_order():
        if nid not in weight_only:
            needed.update(v.node for v in graph[nid].inputs if v.node in weight_only)
    values: dict[Value, np.ndarray] = {}
    computed = sorted(n for n in needed if graph[n].op != "weight")
    if computed:
        nodes = {nid: graph[nid] for nid in weight_only}
        outputs = [Value(nid, i) for nid in computed for i in range(len(graph[nid].outputs))]
        sub = Graph(nodes, (), outputs, [f"v{i}" for i in range(len(outputs))], check=False)
        results = evaluate(sub, {})
        values.update({v: results[f"v{i}"] for i, v in enumerate(outputs)})
    for nid in needed:
        if graph[nid].op == "weight":
            values[Value(nid, 0)] = graph[nid].attrs["value"].array
    return values
