"""Random inputs for models and graphs, reproducible from a seed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from graphsub.ir.graph import Graph
from graphsub.ir.types import TensorType

InputSpec = tuple[str, TensorType]


def graph_input_specs(graph: Graph, binding: Mapping[str, int] | None = None
                      ) -> list[InputSpec]:
    """The graph's inputs and their types; with symbolic sizes, at `binding`'s values."""
    return [(graph[i].attrs["name"], graph[i].type.bound(binding) if binding else graph[i].type)
            for i in graph.inputs]


def random_array(t: TensorType, rng: np.random.Generator) -> np.ndarray:
    """Standard-normal floats; small non-negative integers (valid as indices into any
    non-empty axis of size >= 2); random booleans."""
    if t.dtype.startswith(("float", "bfloat")):
        return rng.standard_normal(t.shape).astype(t.dtype if t.dtype != "bfloat16" else "float32")
    if t.dtype == "bool":
        return rng.random(t.shape) < 0.5
    return rng.integers(0, 2, t.shape).astype(t.dtype)


def random_feeds(specs: Sequence[InputSpec], seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: random_array(t, rng) for name, t in specs}
