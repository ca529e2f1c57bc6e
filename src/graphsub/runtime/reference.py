"""The numpy reference evaluator: runs a Graph with each operator's reference semantics."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from graphsub.errors import GraphsubError
from graphsub.ir.graph import Graph, Value
from graphsub.ops import get_op


def evaluate(graph: Graph, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Evaluate the graph on named inputs; returns the outputs by name.

    Intermediate values are dropped as soon as their last reader has run, so large models
    evaluate in bounded memory.
    """
    values: dict[Value, np.ndarray] = {}
    missing = [n for n in graph.input_names if n not in feeds]
    if missing:
        raise GraphsubError(f"no value given for graph input(s): {', '.join(missing)}")
    remaining: dict[int, int] = {nid: len(users) for nid, users in graph.users().items()}
    for v in graph.outputs:
        remaining[v.node] = remaining.get(v.node, 0) + 1
    for nid in graph.topo_order():
        node = graph[nid]
        if node.op == "input":
            arr = np.asarray(feeds[node.attrs["name"]])
            if arr.shape != node.type.shape or str(arr.dtype) != node.type.dtype:
                raise GraphsubError(f"input {node.attrs['name']!r}: expected {node.type}, got "
                                    f"{arr.dtype}[{'x'.join(map(str, arr.shape))}]")
            outs: tuple[np.ndarray, ...] = (arr,)
        else:
            args = [values[v] for v in node.inputs]
            outs = get_op(node.op).evaluate(node.attrs, args)
            for v in set(node.inputs):
                remaining[v.node] -= node.inputs.count(v)
                if remaining[v.node] <= 0:
                    for i in range(len(graph[v.node].outputs)):
                        values.pop(Value(v.node, i), None)
        for i, out in enumerate(outs):
            values[Value(nid, i)] = out
    return {name: values[v] for name, v in zip(graph.output_names, graph.outputs)}
