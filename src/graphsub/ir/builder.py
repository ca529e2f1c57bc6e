"""A small builder API for writing graphs by hand (the zoo and the tests use it).

    b = GraphBuilder(seed=0)
    x = b.input("x", (1, 3, 224, 224))
    y = b.conv2d(x, b.he_weight((64, 3, 7, 7)), stride=2, padding="same", activation="relu")
    b.output(y, "y")
    graph = b.build()

Every operator of the registry is available as a method of the same name; shapes are inferred
(and checked) as each node is added, so a mistake fails at the line that made it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from graphsub.errors import GraphsubError
from graphsub.ir.facts import NO_FACTS, GraphFacts
from graphsub.ir.graph import Graph, Node, Value, make_node
from graphsub.tensors.types import Constant, TensorType
from graphsub.ops import all_ops


class GraphBuilder:
    def __init__(self, seed: int = 0) -> None:
        self._nodes: dict[int, Node] = {}
        self._inputs: list[int] = []
        self._outputs: list[Value] = []
        self._output_names: list[str] = []
        self.rng = np.random.default_rng(seed)

    def _add(self, node: Node) -> Value | tuple[Value, ...]:
        nid = len(self._nodes)
        self._nodes[nid] = node
        outs = tuple(Value(nid, i) for i in range(len(node.outputs)))
        return outs[0] if len(outs) == 1 else outs

    def node(self, node_id: int) -> Node:
        return self._nodes[node_id]

    def type_of(self, value: Value) -> TensorType:
        return self._nodes[value.node].outputs[value.index]

    def shape(self, value: Value) -> tuple[int, ...]:
        return self.type_of(value).shape

    def input(self, name: str, shape: Sequence[int], dtype: str = "float32") -> Value:
        if any(self._nodes[i].attrs["name"] == name for i in self._inputs):
            raise GraphsubError(f"graph input {name!r} defined twice")
        node = make_node("input", (), (), {"name": name, "shape": tuple(shape), "dtype": dtype})
        value = self._add(node)
        assert isinstance(value, Value)
        self._inputs.append(value.node)
        return value

    def weight(self, array: np.ndarray | Any, name: str = "") -> Value:
        arr = np.asarray(array)
        if arr.dtype == np.float64:
            arr = arr.astype(np.float32)
        value = self._add(make_node("weight", (), (), {"value": Constant(arr)}, name))
        assert isinstance(value, Value)
        return value

    def he_weight(self, shape: Sequence[int], fan_in: int | None = None, name: str = "") -> Value:
        """A random weight scaled so activations keep unit variance through deep stacks
        (He initialization; fan-in is every dimension but the first unless given)."""
        fan = fan_in if fan_in is not None else max(1, math.prod(shape[1:]))
        data = self.rng.standard_normal(tuple(shape), dtype=np.float32) * np.float32(
            math.sqrt(2.0 / fan))
        return self.weight(data, name)

    def uniform_weight(self, shape: Sequence[int], low: float = -0.1, high: float = 0.1,
                       name: str = "") -> Value:
        return self.weight(self.rng.uniform(low, high, tuple(shape)).astype(np.float32), name)

    def op(self, op: str, *inputs: Value, name: str = "", **attrs: Any) -> Any:
        """Add an operator node; returns its value, or a tuple of values for multi-output ops."""
        for v in inputs:
            if not isinstance(v, Value) or v.node not in self._nodes:
                raise GraphsubError(f"{op}: input {v!r} is not a value of this builder")
        node = make_node(op, inputs, [self.type_of(v) for v in inputs], attrs, name)
        return self._add(node)

    def __getattr__(self, op: str) -> Callable[..., Any]:
        if op.startswith("_"):
            raise AttributeError(op)
        if op not in all_ops():
            raise AttributeError(f"GraphBuilder has no method or operator {op!r}")
        return lambda *inputs, **attrs: self.op(op, *inputs, **attrs)

    def output(self, value: Value, name: str | None = None) -> None:
        name = name or f"output_{len(self._outputs)}"
        if name in self._output_names:
            raise GraphsubError(f"graph output {name!r} defined twice")
        self._outputs.append(value)
        self._output_names.append(name)

    def build(self, facts: GraphFacts = NO_FACTS) -> Graph:
        if not self._outputs:
            raise GraphsubError("graph has no outputs: call output() before build()")
        return Graph(self._nodes, self._inputs, self._outputs, self._output_names, facts).dce()
