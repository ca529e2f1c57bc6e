"""ONNX types of graphsub's values, both ways: a tensor's or an opaque value's ValueInfo, the
type graphsub gives an ONNX type it does not model (a sequence, a map, an optional, a tensor
of strings or of another element type graphsub has no arithmetic for), and made-up values of
such a type for runs that need inputs (probing, verification).

Opaque values are carried, never computed with: only opaque nodes, which onnxruntime runs,
read or make them (graphsub.tensors.types.TensorType.opaque)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper

from graphsub.tensors.symbolic import dim_text
from graphsub.tensors.types import SUPPORTED_DTYPES, TensorType

#: The words a made-up tensor of strings holds.
_WORDS = np.array(["graphsub", "Monday", "tensor", "ONNX", "opaque", "value"], dtype=object)


def modelled(type_proto: onnx.TypeProto) -> bool:
    """Whether graphsub models values of this type: a tensor of a numeric or boolean type."""
    if type_proto.WhichOneof("value") != "tensor_type":
        return False
    elem = type_proto.tensor_type.elem_type
    if not elem:
        return True  # an unknown element type: left to the caller's inference
    try:
        return str(helper.tensor_dtype_to_np_dtype(elem)) in SUPPORTED_DTYPES
    except (KeyError, TypeError, ValueError):
        return False


def opaque_type(type_proto: onnx.TypeProto) -> TensorType | None:
    """The opaque type of a value graphsub does not model; None for a tensor it does."""
    return None if modelled(type_proto) else TensorType.opaque(type_proto.SerializeToString())


def array_type(array: Any) -> TensorType:
    """The type of a value as onnxruntime hands it back: a tensor's, or an opaque one (a
    sequence of arrays, a tensor of strings) built from what the value shows."""
    if isinstance(array, np.ndarray) and str(array.dtype) in SUPPORTED_DTYPES:
        return TensorType(tuple(array.shape), str(array.dtype))
    return TensorType.opaque(_proto_of(array).SerializeToString())


def _proto_of(value: Any) -> onnx.TypeProto:
    if isinstance(value, (list, tuple)):
        elem = _proto_of(value[0]) if value else helper.make_tensor_type_proto(
            onnx.TensorProto.FLOAT, None)
        return helper.make_sequence_type_proto(elem)
    if isinstance(value, dict):
        key = next(iter(value), "")
        key_type = helper.np_dtype_to_tensor_dtype(np.asarray(key).dtype) \
            if not isinstance(key, str) else onnx.TensorProto.STRING
        return helper.make_map_type_proto(key_type, _proto_of(next(iter(value.values()),
                                                                   np.float32(0))))
    array = np.asarray(value)
    if array.dtype == object or array.dtype.kind in "SU":
        return helper.make_tensor_type_proto(onnx.TensorProto.STRING, list(array.shape))
    return helper.make_tensor_type_proto(helper.np_dtype_to_tensor_dtype(array.dtype),
                                         list(array.shape))


def value_info(name: str, t: TensorType, dims: Any = None) -> onnx.ValueInfoProto:
    """The ValueInfo of a value of type `t` named `name`: its own ONNX type where it is
    opaque; a tensor's with `dims` (numbers, dim_param names, None) or `t`'s dimensions (a
    size expression written as a dim_param: `2*seq`)."""
    if t.is_opaque:
        proto = onnx.TypeProto()
        proto.ParseFromString(t.onnx_type)
        return helper.make_value_info(name, proto)
    if dims is None:
        dims = [d if type(d) is int else dim_text(d) for d in t.shape]
    return helper.make_tensor_value_info(
        name, helper.np_dtype_to_tensor_dtype(np.dtype(t.dtype)), dims)


def made_up_value(t: TensorType, rng: np.random.Generator) -> Any:
    """A value of an opaque type for a run that needs one: a sequence of two tensors, an
    optional holding its element, a map of one entry, a tensor of words. Open dimensions
    are 2."""
    proto = onnx.TypeProto()
    proto.ParseFromString(t.onnx_type)
    return _made_up(proto, rng)


def _made_up(proto: onnx.TypeProto, rng: np.random.Generator) -> Any:
    kind = proto.WhichOneof("value")
    if kind == "sequence_type":
        return [_made_up(proto.sequence_type.elem_type, rng) for _ in range(2)]
    if kind == "optional_type":
        return _made_up(proto.optional_type.elem_type, rng)
    if kind == "map_type":
        key = "graphsub" if proto.map_type.key_type == onnx.TensorProto.STRING else 1
        return {key: _made_up(proto.map_type.value_type, rng)}
    tt = proto.tensor_type
    shape = tuple(d.dim_value if d.HasField("dim_value") else 2 for d in tt.shape.dim)
    if tt.elem_type == onnx.TensorProto.STRING:
        return rng.choice(_WORDS, size=shape).astype(object)
    dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type)
    if dtype.kind == "f" or str(dtype).startswith(("float", "bfloat")):
        return np.asarray(rng.standard_normal(shape)).astype(dtype)
    return np.asarray(rng.integers(0, 2, shape)).astype(dtype)
