"""What an operator's ONNX export and import functions may call on the context they are given.

The contexts themselves (graphsub.onnx_io's `ExportContext`, which writes ONNX nodes, and
`ImportContext`, which builds the graph being imported) sit above the operators, which define
how each one is written and read. The operators therefore name the contexts by these
protocols, and the onnx_io classes declare that they implement them (mypy checks both sides),
so the operator layer never refers up, not even for a type.
"""

from __future__ import annotations

from collections.abc import Sequence, Set as AbstractSet
from typing import TYPE_CHECKING, Any, Protocol

from graphsub.tensors.symbolic import Dim
from graphsub.tensors.types import TensorType
from graphsub.tensors.values import Value

if TYPE_CHECKING:
    import numpy as np
    import onnx


class OpExportContext(Protocol):
    """The model being written: fresh names, nodes, initializers, sizes as tensors."""

    opset: int

    def reserve(self, name: str) -> str: ...

    def avoid(self, names: AbstractSet[str]) -> None: ...

    def fresh(self, hint: str) -> str: ...

    def emit(self, op_type: str, inputs: Sequence[str], outputs: Sequence[str],
             **attrs: Any) -> None: ...

    def emit_proto(self, node: onnx.NodeProto, inputs: Sequence[str], outputs: Sequence[str],
                   opsets: Sequence[tuple[str, int]]) -> None: ...

    def const(self, array: np.ndarray, hint: str = "const") -> str: ...

    def sizes(self, values: Sequence[Dim], out: str | None = None) -> str: ...

    def size(self, expr: Dim) -> str: ...

    def reshape_target(self, in_shape: Sequence[Dim], target: Sequence[Dim]) -> str: ...

    def emit_sizes(self, values: Sequence[Dim], shape: Sequence[int], dtype: str,
                   out: str) -> None: ...


class OpImportContext(Protocol):
    """The graph being imported: the values of ONNX names, constants, sizes read from
    integer inputs, and nodes added."""

    opset: int

    def is_used(self, name: str) -> bool: ...

    def type_of(self, value: Value) -> TensorType: ...

    def constant(self, name: str) -> np.ndarray | None: ...

    def sizes_of(self, name: str) -> tuple[Dim, ...] | None: ...

    def bound_by_slice(self, shape: Sequence[Dim], starts: Sequence[Dim], ends: Sequence[Dim],
                       axes: Sequence[int] | None) -> None: ...

    def at_least(self, name: str, low: int) -> None: ...

    def value(self, name: str) -> Value: ...

    def inputs(self, node: onnx.NodeProto) -> list[Value]: ...

    def attr(self, node: onnx.NodeProto, name: str, default: Any = ...) -> Any: ...

    def add(self, op: str, inputs: Sequence[Value], **attrs: Any) -> list[Value]: ...

    def weight(self, array: np.ndarray, name: str = "") -> Value: ...
