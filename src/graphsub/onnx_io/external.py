"""Models whose weights live outside their protobuf: ONNX external data.

One protobuf cannot exceed 2 GiB, so the large models people deploy (decoders of billions of
parameters) keep their weights in a data file beside the model. graphsub never copies such
weights into Python objects: a data file is memory-mapped once, each tensor is a read-only
view into that one mapping (`mapped_initializers`), the graph's weights are those views, and
onnxruntime sessions receive the same arrays by reference (`runtime.ort.DetachedModel`) rather
than a serialized copy per candidate. Written models get one data file of their own, aligned
so that onnxruntime can memory-map it in turn, and are written atomically with it
(`save_detached`).
"""

from __future__ import annotations

import os
import tempfile
import weakref
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from graphsub.errors import ExportError, ModelLoadError
from graphsub.ops.control_flow import all_graphs
from graphsub.onnx_io.files import atomic_file, write_atomic
from graphsub.progress import step
from graphsub.runtime.ort_sessions import DetachedModel, ModelData, file_mapping

#: Above this many bytes of weights graphsub keeps a model's weights apart from its protobuf
#: (in sessions and in the file it writes): protobuf's own limit is 2 GiB, and serializing
#: a gigabyte of weights per candidate costs more than the candidate's search.
EXTERNAL_DATA_BYTES = 1 << 30
#: Tensors at least this large go to the data file; smaller ones (shapes, scales) stay in the
#: protobuf, where shape inference can read them (the size onnx.save uses by default).
MIN_EXTERNAL_TENSOR = 1024
#: Offsets in a written data file are multiples of this, so that each tensor can be mapped.
ALIGNMENT = 4096
#: Weights graphsub computed for a detached model are moved to a mapped temporary file from
#: this many bytes on (`spilled`).
SPILL_BYTES = 64 << 20
#: The placeholder location of a detached tensor: its data is handed to onnxruntime in memory.
DETACHED_LOCATION = "graphsub-detached-weights"

#: The mappings some weight still views (a mapping closes with the last view of it).
_mappings: weakref.WeakValueDictionary[tuple[str, int, int], np.memmap] = \
    weakref.WeakValueDictionary()


def _file_mapping(path: Path) -> np.memmap:
    """One read-only mapping per data file (and version of it): tensors are views into it, so
    a weight read twice is mapped, and counted in memory, once."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    mapping = _mappings.get(key)
    if mapping is None:
        mapping = _mappings[key] = np.memmap(path, dtype=np.uint8, mode="r")
    return mapping


def is_external(tensor: onnx.TensorProto) -> bool:
    return tensor.data_location == onnx.TensorProto.EXTERNAL


def _external_info(tensor: onnx.TensorProto) -> dict[str, str]:
    return {e.key: e.value for e in tensor.external_data}


def mapped_tensor(tensor: onnx.TensorProto, base_dir: Path) -> np.ndarray:
    """An external tensor's values as a read-only view of its memory-mapped data file."""
    info = _external_info(tensor)
    location = info.get("location")
    if not location:
        raise ModelLoadError(f"initializer {tensor.name!r} is marked as external data but "
                             "names no data file")
    path = base_dir / location
    if not path.is_file():
        raise ModelLoadError(f"initializer {tensor.name!r} keeps its data in {location}, which "
                             f"is not in {base_dir}: keep the model's data file beside it")
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type))
    shape = tuple(tensor.dims)
    count = int(np.prod(shape, dtype=np.int64))
    offset = int(info.get("offset", 0))
    length = int(info["length"]) if "length" in info else count * dtype.itemsize
    mapping = _file_mapping(path)
    if length != count * dtype.itemsize or offset + length > mapping.size or dtype.hasobject:
        raise ModelLoadError(f"initializer {tensor.name!r}: {location} holds {length} bytes at "
                             f"offset {offset}, not the {count * dtype.itemsize} of a "
                             f"{dtype} tensor of shape {shape} (file of {mapping.size} bytes)")
    if tensor.data_type in _CONVERTED_TYPES:  # stored as bits numpy cannot view: read them
        from onnx.numpy_helper import to_array

        return to_array(tensor, str(base_dir))
    view = mapping[offset:offset + length]
    if offset % dtype.alignment:  # numpy computes on misaligned data, onnxruntime may not
        return np.array(view.view(dtype).reshape(shape))
    return view.view(dtype).reshape(shape)


#: Element types whose stored bits are not numpy's layout for the dtype onnx reads them as.
_CONVERTED_TYPES = {onnx.TensorProto.BFLOAT16, onnx.TensorProto.FLOAT8E4M3FN,
                    onnx.TensorProto.FLOAT8E4M3FNUZ, onnx.TensorProto.FLOAT8E5M2,
                    onnx.TensorProto.FLOAT8E5M2FNUZ, onnx.TensorProto.UINT4,
                    onnx.TensorProto.INT4, onnx.TensorProto.STRING}


def has_external_data(model: onnx.ModelProto) -> bool:
    return any(is_external(t) for g in all_graphs(model.graph) for t in g.initializer)


def mapped_initializers(model: onnx.ModelProto, base_dir: Path) -> dict[str, np.ndarray]:
    """The main graph's external initializers, by name, as views of their mapped files. Those
    of control-flow bodies (rare, and small) are read into the protobuf instead, which is what
    the body importer reads."""
    from onnx.external_data_helper import load_external_data_for_tensor

    mapped = {t.name: mapped_tensor(t, base_dir) for t in model.graph.initializer
              if is_external(t)}
    for body in list(all_graphs(model.graph))[1:]:
        for t in body.initializer:
            if is_external(t):
                load_external_data_for_tensor(t, str(base_dir))
                t.data_location = onnx.TensorProto.DEFAULT
                del t.external_data[:]
    return mapped


def stub(name: str, array: np.ndarray) -> onnx.TensorProto:
    """An initializer of the array's type whose data is held apart (DETACHED_LOCATION)."""
    tensor = onnx.TensorProto()
    tensor.name = name
    tensor.data_type = helper.np_dtype_to_tensor_dtype(array.dtype)
    tensor.dims.extend(array.shape)
    tensor.data_location = onnx.TensorProto.EXTERNAL
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", DETACHED_LOCATION
    return tensor


def detach(model: onnx.ModelProto | bytes) -> DetachedModel:
    """A model held in one protobuf with its large initializers moved apart (what
    --external-data writes for a model that would fit in one file)."""
    from onnx.numpy_helper import to_array

    if isinstance(model, (bytes, bytearray)):
        model = onnx.load_from_string(bytes(model))
    weights: dict[str, np.ndarray] = {}
    for k, tensor in enumerate(model.graph.initializer):
        if is_external(tensor) or _nbytes(tensor) < MIN_EXTERNAL_TENSOR:
            continue
        weights[tensor.name] = to_array(tensor)
        model.graph.initializer[k].CopyFrom(stub(tensor.name, weights[tensor.name]))
    return DetachedModel(model.SerializeToString(), weights)


def spilled(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The weights, those graphsub computed (a merged projection's weights: anonymous memory)
    moved into a temporary file and mapped from it, where together they reach SPILL_BYTES.

    A session packs the weights it is given and keeps them by reference; the pages of a
    mapped file it has read can be given back at once (runtime.ort._release_mapped_pages),
    those of a computed array cannot (a 16-layer TinyLlama-wide decoder with its projections
    merged computes 16 x (2048x2560 + 2048x11264) float32, 1.8 GB, that would otherwise stay
    in memory beside the session's packed copy). The file has no name: it lives as long as
    the mapping, and nothing is left behind however the run ends; where it cannot be written,
    the weights stay in memory."""
    computed = {name: a for name, a in weights.items() if file_mapping(a) is None}
    if sum(int(a.nbytes) for a in computed.values()) < SPILL_BYTES:
        return weights
    offsets: dict[str, int] = {}
    try:
        with tempfile.TemporaryFile(prefix="graphsub-weights-") as f:  # unlinked already
            for name, array in computed.items():
                f.write(b"\0" * (-f.tell() % ALIGNMENT))
                offsets[name] = f.tell()
                for chunk in _chunks(np.ascontiguousarray(array)):
                    f.write(chunk)
            f.flush()
            mapping = np.memmap(f, dtype=np.uint8, mode="r")
    except OSError:  # no room for them on disk: they stay in memory, as before
        return weights
    out = dict(weights)
    for name, array in computed.items():
        start = offsets[name]
        view = mapping[start:start + array.nbytes].view(array.dtype).reshape(array.shape)
        out[name] = view
    return out


def _nbytes(tensor: onnx.TensorProto) -> int:
    if tensor.HasField("raw_data"):
        return len(tensor.raw_data)
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type))
    return int(np.prod(tuple(tensor.dims), dtype=np.int64)) * dtype.itemsize


def skeleton(model: DetachedModel) -> onnx.ModelProto:
    """The detached model as onnx.checker can check it (see `without_external_data`)."""
    return without_external_data(onnx.load_from_string(model.proto))


def without_external_data(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of the model whose external initializers are graph inputs of their types: what
    onnx.checker and shape inference read without the data file they would otherwise look
    for in the current folder (they need a weight's type, never its values)."""
    skeleton = onnx.ModelProto()
    skeleton.CopyFrom(model)
    graph = skeleton.graph
    outside = [t for t in graph.initializer if is_external(t)]
    if not outside:
        return skeleton
    kept = [t for t in graph.initializer if not is_external(t)]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                       for t in outside)
    return skeleton


def data_file_name(path: Path) -> str:
    """The data file written beside a model at `path`: its name plus `.data`, as torch's
    exporter and onnx.save name it."""
    return path.name + ".data"


def save_detached(model: DetachedModel, path: str | os.PathLike[str]) -> Path:
    """Write the model and its data file (`<name>.data` beside it), each through a temporary
    file and a rename: the data file first, then the model, so that a failure leaves neither
    half-written (the model file names its data file only once both are complete)."""
    target = Path(path)
    if not target.parent.is_dir():
        raise ExportError(f"cannot write {target}: folder {target.parent} does not exist")
    proto = onnx.load_from_string(model.proto)
    location = data_file_name(target)
    with atomic_file(target.parent / location) as f, \
            step("write", sum(int(a.nbytes) for a in model.weights.values()) / 1e6,
                 "MB") as tracker:
        offset = 0
        for tensor in proto.graph.initializer:
            array = model.weights.get(tensor.name)
            if array is None:
                continue
            padding = -offset % ALIGNMENT
            f.write(b"\0" * padding)
            offset += padding
            data = np.ascontiguousarray(array)
            for chunk in _chunks(data):
                f.write(chunk)
                tracker.advance(len(chunk) / 1e6)
            _point_at(tensor, location, offset, data.nbytes)
            offset += data.nbytes
    return write_atomic(proto.SerializeToString(), target)


def write_model(model: ModelData, path: str | os.PathLike[str]) -> Path:
    """Write a model atomically: one file, or the model and its data file."""
    if isinstance(model, DetachedModel):
        return save_detached(model, path)
    return write_atomic(model, path)


def _chunks(array: np.ndarray, size: int = 64 << 20) -> Iterator[memoryview]:
    """The array's bytes in pieces, so that writing a mapped weight never copies it whole."""
    flat = array.reshape(-1).data.cast("B") if array.size else memoryview(b"")
    for start in range(0, len(flat), size):
        yield flat[start:start + size]


def _point_at(tensor: onnx.TensorProto, location: str, offset: int, length: int) -> None:
    del tensor.external_data[:]
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)),
                       ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value


__all__ = ["ALIGNMENT", "EXTERNAL_DATA_BYTES", "MIN_EXTERNAL_TENSOR", "data_file_name",
           "detach", "has_external_data", "mapped_initializers", "mapped_tensor",
           "save_detached", "skeleton", "stub", "without_external_data", "write_model"]
