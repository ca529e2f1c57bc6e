"""One operator application, the graph's vertex: below the graph itself, so that what is
derived from nodes (their digests, fingerprints, incremental facts) can name them without
importing the graph."""

from __future__ import annotations

from dataclasses import dataclass, field

from graphsub.tensors.types import Attrs, TensorType
from graphsub.tensors.values import Value


@dataclass(frozen=True, slots=True)
class Node:
    """One operator application. Immutable; its output types were inferred when it was made."""

    op: str
    attrs: Attrs
    inputs: tuple[Value, ...]
    outputs: tuple[TensorType, ...]
    #: A human-facing name (ONNX initializer or node name). Not part of equality or hashing.
    name: str = field(default="", compare=False)

    @property
    def type(self) -> TensorType:
        """The type of the first output (most ops have exactly one)."""
        return self.outputs[0]
