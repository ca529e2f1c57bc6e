"""Random inputs for models and graphs, reproducible from a seed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphsub.errors import GraphsubError
from graphsub.ir.graph import Graph
from graphsub.tensors.onnx_types import made_up_value
from graphsub.tensors.types import TensorType

InputSpec = tuple[str, TensorType]


@dataclass(frozen=True, slots=True)
class GivenInput(TensorType):
    """The type of an input the user gave a value for (`--input-value sr=16000`): a sample
    rate, a mode flag or a length that picks a model's branch, which random data would get
    wrong. It is fed as given wherever graphsub runs the model."""

    value: Any = field(default=None, compare=False, hash=False)

    def bound(self, binding: Mapping[str, int]) -> TensorType:
        return self


def graph_input_specs(graph: Graph, binding: Mapping[str, int] | None = None
                      ) -> list[InputSpec]:
    """The graph's inputs and their types; with symbolic sizes, at `binding`'s values; the
    inputs given values (graph.facts.input_values) as GivenInput."""
    given = graph.facts.input_values
    specs: list[InputSpec] = []
    for i in graph.inputs:
        name, t = graph[i].attrs["name"], graph[i].type
        if name in given:
            value = np.asarray(given[name])
            specs.append((name, GivenInput(value.shape, str(value.dtype), value=value)))
        else:
            specs.append((name, t.bound(binding) if binding else t))
    return specs


def given_values(graph: Graph, values: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Values for the graph's inputs, each in its input's type and shape: from text
    (`16000`, `1,2,3`: the command line's), a number or an array; a clear error for an
    unknown input or a value that does not fit."""
    types = {graph[i].attrs["name"]: graph[i].type for i in graph.inputs}
    found = {}
    for name, text in values.items():
        if name not in types:
            raise GraphsubError(f"--input-value names {name!r}, which is not an input of the "
                                f"model (its inputs: {', '.join(types)})")
        t = types[name]
        if not t.is_static:
            raise GraphsubError(f"--input-value {name}: the input has symbolic sizes {t}; fix "
                                f"them with --input-shape first")
        try:
            flat = np.array([float(v) for v in text.split(",")], dtype=np.float64) \
                if isinstance(text, str) else np.asarray(text)
            value = flat.astype(t.dtype).reshape(t.shape)
        except (TypeError, ValueError):
            raise GraphsubError(f"--input-value {name}={text}: expected {t.numel} comma-"
                                f"separated number(s) for an input of type {t}") from None
        found[name] = value
    return found


def random_array(t: TensorType, rng: np.random.Generator) -> Any:
    """Standard-normal floats; small non-negative integers (valid as indices into any
    non-empty axis of size >= 2); random booleans."""
    if isinstance(t, GivenInput):
        return t.value.copy()
    if t.is_opaque:  # a sequence, map, optional or strings: a made-up value of its type
        return made_up_value(t, rng)
    # np.asarray: a scalar input is a 0-d array, which onnxruntime takes (numpy scalars not).
    if t.dtype.startswith(("float", "bfloat")):
        return np.asarray(rng.standard_normal(t.shape).astype(t.dtype))
    if t.dtype == "bool":
        return np.asarray(rng.random(t.shape) < 0.5)
    return np.asarray(rng.integers(0, 2, t.shape).astype(t.dtype))


def random_feeds(specs: Sequence[InputSpec], seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: random_array(t, rng) for name, t in specs}
