"""Value types of the IR: tensor types, constant tensors and immutable attribute maps.

Everything here is immutable and hashable, because nodes (and so graphs) are values that
searches share between many candidate graphs.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import ml_dtypes  # noqa: F401 - registers bfloat16 with numpy: np.dtype("bfloat16") works
import numpy as np

from graphsub.errors import GraphsubError
from graphsub.tensors.symbolic import Dim, bind_all, dim, is_static, product

#: dtypes the IR understands, by numpy name.
SUPPORTED_DTYPES = frozenset(
    {"float32", "float16", "float64", "bfloat16", "int8", "int16", "int32", "int64",
     "uint8", "uint16", "uint32", "uint64", "bool"}
)
#: The dtype of a value graphsub carries without modelling it: an ONNX sequence, map or
#: optional, or a tensor of strings (`TensorType.opaque`).
OPAQUE = "opaque"


@dataclass(frozen=True, slots=True)
class TensorType:
    """The shape and element type of one tensor.

    A dimension is an int, or a sympy expression over named sizes where the model leaves it
    open (`batch`, `seq + 1`: graphsub.tensors.symbolic); `is_static` says there is none.

    An opaque value (dtype OPAQUE: an ONNX sequence, map or optional, a tensor of strings)
    has no shape here; `onnx_type` holds its ONNX TypeProto, serialized, which is written back
    where the value is an input or output of a model. Only opaque nodes (run by onnxruntime)
    read or make one, so no rule and no cost of graphsub's ever looks into it.
    """

    shape: tuple[Dim, ...]
    dtype: str = "float32"
    onnx_type: bytes = b""

    def __post_init__(self) -> None:
        shape = self.shape
        if type(shape) is not tuple or not all(type(d) is int for d in shape):
            try:
                shape = tuple(dim(d) for d in shape)
            except (TypeError, ValueError):
                raise ValueError(f"tensor shape must be non-negative integers or size "
                                 f"expressions, got {self.shape}") from None
            object.__setattr__(self, "shape", shape)
        if any(type(d) is int and d < 0 for d in shape):
            raise ValueError(f"tensor shape must be non-negative integers or size "
                             f"expressions, got {self.shape}")
        if self.dtype == OPAQUE:
            if shape or not self.onnx_type:
                raise ValueError("an opaque value has no shape and keeps its ONNX type")
        elif self.dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"unsupported dtype {self.dtype!r}")

    @classmethod
    def opaque(cls, onnx_type: bytes) -> TensorType:
        """The type of a value graphsub carries as it is (see the class docstring)."""
        return cls((), OPAQUE, onnx_type)

    @property
    def is_opaque(self) -> bool:
        return self.dtype == OPAQUE

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_static(self) -> bool:
        """Whether every dimension is a number."""
        return is_static(self.shape)

    @property
    def numel(self) -> Dim:
        return product(self.shape) if not self.is_static else math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        """Bytes per element (none for an opaque value, which graphsub never prices by its
        size)."""
        return 0 if self.dtype == OPAQUE else np.dtype(self.dtype).itemsize

    @property
    def nbytes(self) -> Dim:
        return self.numel * self.itemsize

    def bound(self, binding: Mapping[str, int]) -> TensorType:
        """This type with each size symbol at the value `binding` gives it."""
        return self if self.is_static else TensorType(bind_all(self.shape, binding), self.dtype)

    def __str__(self) -> str:
        if self.dtype == OPAQUE:
            return f"opaque({onnx_type_text(self.onnx_type)})"
        dims = "x".join(str(d) if isinstance(d, int) else f"({d})" if len(str(d)) > 1
                        and not str(d).isidentifier() else str(d) for d in self.shape)
        return f"{self.dtype}[{dims or 'scalar'}]"


def onnx_type_text(onnx_type: bytes) -> str:
    """An ONNX TypeProto, serialized, in a few words: `seq(float)`, `optional(seq(int64))`,
    `map(string, float)`, `string[3x?]`."""
    import onnx

    proto = onnx.TypeProto()
    proto.ParseFromString(onnx_type)
    return _type_text(proto)


def _type_text(proto: Any) -> str:
    from onnx import helper

    kind = proto.WhichOneof("value")
    if kind == "tensor_type":
        elem = helper.tensor_dtype_to_string(proto.tensor_type.elem_type).removeprefix(
            "TensorProto.").lower()
        if not proto.tensor_type.HasField("shape"):
            return elem
        dims = "x".join(str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?")
                        for d in proto.tensor_type.shape.dim)
        return f"{elem}[{dims or 'scalar'}]"
    if kind == "sequence_type":
        return f"seq({_type_text(proto.sequence_type.elem_type)})"
    if kind == "optional_type":
        return f"optional({_type_text(proto.optional_type.elem_type)})"
    if kind == "map_type":
        key = helper.tensor_dtype_to_string(proto.map_type.key_type).removeprefix(
            "TensorProto.").lower()
        return f"map({key}, {_type_text(proto.map_type.value_type)})"
    return kind or "unknown"


class Constant:
    """An immutable tensor held by a weight node.

    Equality and hashing go by content (a digest computed once, on first use), so two graphs
    with equal weights hash equal whatever object holds the data.
    """

    __slots__ = ("_array", "_digest")

    def __init__(self, array: np.ndarray | Any) -> None:
        arr = np.asarray(array)
        if arr.flags.writeable or not arr.flags.c_contiguous:
            # Copy so that nobody holding the original can change a weight behind our back.
            arr = np.array(arr, copy=True, order="C")
            arr.flags.writeable = False
        self._array = arr
        self._digest: bytes | None = None

    @property
    def array(self) -> np.ndarray:
        return self._array

    @property
    def type(self) -> TensorType:
        return TensorType(tuple(self._array.shape), str(self._array.dtype))

    @property
    def digest(self) -> bytes:
        """A digest of the content; for a weight mapped from a model's data file, of where
        it lies there (hashing gigabytes of weights would read every page of them into
        memory: equal regions are equal weights, and distinct ones are taken as distinct)."""
        if self._digest is None:
            h = hashlib.blake2b(digest_size=16)
            h.update(f"{self._array.dtype.str}{self._array.shape}".encode())
            region = mapped_region(self._array)
            if region is not None:
                h.update(f"mapped:{region[0]}:{region[1]}".encode())
            elif self._array.size:
                # bytes, not the buffer as typed: numpy cannot export bfloat16's buffer
                h.update(np.ascontiguousarray(self._array).view(np.uint8).data)
            self._digest = h.digest()
        return self._digest

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Constant) and self.digest == other.digest

    def __hash__(self) -> int:
        return hash(self.digest)

    def all_equal(self, value: Any) -> bool:
        """Whether every element equals `value` (what rule conditions ask of weights)."""
        return bool(np.all(self._array == value))

    def uniform(self) -> float | None:
        """The one value every element has, or None (a scale or epsilon a rule reads)."""
        flat = self._array.reshape(-1)
        return float(flat[0]) if flat.size and bool(np.all(flat == flat[0])) else None

    def __repr__(self) -> str:
        return f"Constant({self.type}, {self.digest.hex()[:8]})"


def mapped_region(array: np.ndarray) -> tuple[str, int] | None:
    """(file, byte offset) of an array that views a memory-mapped file, or None."""
    root: np.memmap | None = None
    base: np.ndarray | None = array
    while isinstance(base, np.ndarray):
        if isinstance(base, np.memmap):
            root = base
        base = base.base
    if root is None or root.filename is None:
        return None
    start = array.__array_interface__["data"][0] - root.__array_interface__["data"][0]
    return root.filename, root.offset + start


class WeightDataUnavailable(GraphsubError):
    """A weight's values were asked for where only its stub is (a split search's worker)."""


class ConstantStub(Constant):
    """A Constant without its data: its digest (so it compares and hashes equal to the
    original), its type, and its one value when all elements are the same. A split search
    sends parts to worker processes that search but never read weight data; shipping BERT's
    weights to the workers and back took longer than the search."""

    __slots__ = ("_type", "_uniform")

    def __init__(self, original: Constant) -> None:
        arr = original.array
        # (a stub holds no data: its `array` raises rather than read this)
        self._array = None  # type: ignore[assignment]
        self._digest = original.digest
        self._type = original.type
        flat = arr.reshape(-1)
        self._uniform = flat[:1].copy() if flat.size and np.all(flat == flat[0]) else None

    @property
    def array(self) -> np.ndarray:
        raise WeightDataUnavailable("this weight's data stayed in the process that split the "
                                    "graph")

    @property
    def type(self) -> TensorType:
        return self._type

    def all_equal(self, value: Any) -> bool:
        return self._uniform is not None and bool(np.all(self._uniform == value))

    def uniform(self) -> float | None:
        return float(self._uniform[0]) if self._uniform is not None else None


class Attrs(Mapping[str, Any]):
    """An immutable, hashable attribute map with a canonical key order."""

    __slots__ = ("_items", "_dict", "_hash", "_key")

    def __init__(self, values: Mapping[str, Any] | None = None) -> None:
        items = tuple(sorted((values or {}).items()))
        self._items = items
        self._dict = dict(items)
        self._hash: int | None = None
        self._key: str | None = None  # canonical text, filled by ir.hashing

    def __getitem__(self, key: str) -> Any:
        return self._dict[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._dict)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(self._items)
        return self._hash

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Attrs):
            return self._items == other._items
        return isinstance(other, Mapping) and self._dict == dict(other)

    def items_sorted(self) -> tuple[tuple[str, Any], ...]:
        return self._items

    def replace(self, **changes: Any) -> Attrs:
        return Attrs({**self._dict, **changes})

    def __repr__(self) -> str:
        return "{" + ", ".join(f"{k}={v!r}" for k, v in self._items) + "}"


EMPTY_ATTRS = Attrs()
