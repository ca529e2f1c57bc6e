"""A graph with symbolic sizes at one concrete binding of its symbols.

Everything that needs numbers (the numpy reference, operator timing, the analytic cost
counts, a static torch program) works on the bound graph, where every dimension and
size-valued attribute is an int and each `sizes` node is the constant it computes. The
search rewrites the symbolic graph; costs and checks look at it through its bindings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from graphsub.errors import GraphsubError, ShapeError
from graphsub.ir.graph import Graph, Node, make_node
from graphsub.tensors.symbolic import SymbolRange, bind, bind_all, is_symbolic
from graphsub.tensors.types import Attrs, Constant, TensorType


def is_symbolic_graph(graph: Graph) -> bool:
    """Whether some input of the graph has a symbolic dimension."""
    return any(not graph[i].type.is_static for i in graph.inputs)


def binding_of(graph: Graph, shapes: Mapping[str, Sequence[int]]) -> dict[str, int]:
    """The symbols' values that inputs of these concrete shapes give; an error naming the
    input where a shape does not fit (a wrong rank, a number that differs, a symbol that
    two inputs give different values)."""
    binding: dict[str, int] = {}
    for nid in graph.inputs:
        name, t = graph[nid].attrs["name"], graph[nid].type
        if name not in shapes:
            continue
        shape = tuple(int(d) for d in shapes[name])
        if len(shape) != t.rank:
            raise GraphsubError(f"input {name!r}: expected {t}, got a shape of rank {len(shape)}")
        for d, given in zip(t.shape, shape):
            if isinstance(d, int):
                if d != given:
                    raise GraphsubError(f"input {name!r}: expected {t}, got "
                                        f"{'x'.join(map(str, shape))}")
            elif d.is_Symbol:
                if binding.setdefault(d.name, given) != given:
                    raise GraphsubError(f"input {name!r}: size {d.name} is {given} here and "
                                        f"{binding[d.name]} in another input")
    return binding


def bind_graph(graph: Graph, binding: Mapping[str, int]) -> Graph:
    """The graph with each size symbol at the value `binding` gives it: the same node ids,
    every type and attribute concrete, every `sizes` node a weight."""
    if not is_symbolic_graph(graph):
        return graph
    nodes: dict[int, Node] = {}
    for nid in graph.topo_order():
        node = graph[nid]
        if node.op == "sizes":
            values = np.array(bind_all(node.attrs["values"], binding),
                              dtype=node.attrs["dtype"]).reshape(node.attrs["shape"])
            nodes[nid] = make_node("weight", (), (), {"value": Constant(values)}, node.name)
            continue
        try:  # canonical already: canonicalizing again is not the identity (a slice's end
            # of -1 going backwards means "through index 0", not "the last")
            attrs = Attrs({k: bound_value(v, binding) for k, v in node.attrs.items()})
        except ValueError as exc:  # a size negative at these sizes: not defined there
            raise ShapeError(f"{node.op} is not defined at {dict(binding)}: {exc}") from None
        in_types = [nodes[v.node].outputs[v.index] for v in node.inputs]
        nodes[nid] = make_node(node.op, node.inputs, in_types, attrs, node.name)
    return Graph(nodes, graph.inputs, graph.outputs, graph.output_names,
                 replace(graph.facts, symbols={}, output_dims={}))


#: How far `defined_ranges` looks for the smallest size a model is defined at.
_PROBE_LIMIT = 64


def defined_ranges(graph: Graph, ranges: Mapping[str, SymbolRange]) -> dict[str, SymbolRange]:
    """The ranges narrowed to the sizes the graph is defined at: a pooling window of 2 over
    `width` needs `width >= 2`, which no exporter writes down; the graph itself says so, by
    failing shape inference below it. Each symbol's smallest size is probed with the others
    at a size comfortably inside their ranges."""
    narrowed = dict(ranges)
    comfortable = {n: r.clamp(8) for n, r in ranges.items()}
    for name, r in ranges.items():
        top = r.high if r.high is not None else r.low + _PROBE_LIMIT
        for value in range(r.low, top + 1):
            try:
                bind_graph(graph, {**comfortable, name: value})
            except GraphsubError:
                continue
            narrowed[name] = r.narrowed(low=value)
            break
    return narrowed


def bound_value(value: Any, binding: Mapping[str, int]) -> Any:
    """An attribute value (a number, a size expression, a tuple, a type, nested attributes)
    with each size symbol at its value in `binding`."""
    if is_symbolic(value):
        return bind(value, binding)
    if isinstance(value, tuple):
        return tuple(bound_value(v, binding) for v in value)
    if isinstance(value, TensorType):
        return value.bound(binding)
    if isinstance(value, Attrs):
        return Attrs({k: bound_value(v, binding) for k, v in value.items()})
    return value


__all__ = ["bind_graph", "binding_of", "bound_value", "defined_ranges", "is_symbolic_graph"]
