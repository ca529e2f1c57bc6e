"""onnxruntime sessions, runs, and onnxruntime models as timed runnables.

The timing protocol itself (interleaved rounds, medians, paired comparisons) is target-neutral
and lives in `runtime.timing`.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper

from graphsub.errors import GraphsubError
from graphsub.runtime.timing import Runnable, Timing, time_runnables, timed_calls


def _onnxruntime_errors() -> tuple[type[Exception], ...]:
    """The exception types onnxruntime raises (its own, which derive from Exception directly,
    and the Python ones its bindings raise for inputs of the wrong kind)."""
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    own = [v for v in vars(state).values()
           if isinstance(v, type) and issubclass(v, Exception) and v.__module__ == state.__name__]
    return (*own, RuntimeError, ValueError, TypeError)


#: What onnxruntime raises when a model or an input is one it cannot run: caught where a
#: failure to run means "not this candidate" or "fall back", never anything wider.
ORT_ERRORS = _onnxruntime_errors()


@dataclass(frozen=True, eq=False)
class DetachedModel:
    """An ONNX model whose large initializers are held apart from its protobuf: `proto` marks
    them as external data, `weights` holds their arrays by name (views of a memory-mapped
    data file, or arrays graphsub computed). Sessions receive the arrays by reference, so a
    model over protobuf's 2 GiB limit runs, and candidates sharing the original's weights
    share its memory instead of each serializing a copy (graphsub.onnx_io.external)."""

    proto: bytes
    weights: Mapping[str, np.ndarray]

    @property
    def nbytes(self) -> int:
        return len(self.proto) + sum(int(a.nbytes) for a in self.weights.values())


#: What graphsub hands onnxruntime as a model: its serialized protobuf, or a detached one.
ModelData = bytes | DetachedModel


def _as_bytes(model: Any) -> bytes | str:
    if isinstance(model, DetachedModel):
        return model.proto
    if isinstance(model, (bytes, bytearray)):
        return bytes(model)
    if isinstance(model, (str, Path)):
        return str(model)
    serialized: bytes = model.SerializeToString()
    return serialized


def make_model(graph: onnx.GraphProto, opsets: Sequence[tuple[str, int]]) -> onnx.ModelProto:
    """A ModelProto with the lowest IR version these opsets allow, so that onnxruntime builds
    older than the onnx package still read it; 4 at least, where initializers need not be
    listed among the graph's inputs (an opset-6 model graphsub keeps at its opset writes
    them as constants, not inputs)."""
    ids = [helper.make_opsetid(d, v) for d, v in opsets]
    model = helper.make_model(graph, opset_imports=ids, producer_name="graphsub")
    model.ir_version = max(4, helper.find_min_ir_version_for(ids, ignore_unknown=True))
    return model


#: onnxruntime custom-op libraries every session registers (`--custom-ops`).
_custom_op_libraries: list[str] = []


def use_custom_ops(paths: Sequence[str | os.PathLike[str]]) -> None:
    """Register these custom-op libraries (as SessionOptions.register_custom_ops_library) in
    every onnxruntime session graphsub makes from now on: a model with operators of another
    domain is then timed and checked where it runs. A library that does not load is a clear
    error, before any work."""
    import onnxruntime as ort

    for path in paths:
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise GraphsubError(f"--custom-ops {path}: no such file (give the path of an "
                                "onnxruntime custom-op library, a .so, .dylib or .dll)")
        try:
            ort.SessionOptions().register_custom_ops_library(path)
        except ORT_ERRORS as exc:
            raise GraphsubError(f"--custom-ops {path}: onnxruntime cannot load it as a "
                                f"custom-op library ({str(exc).splitlines()[0]})") from None
        if path not in _custom_op_libraries:
            _custom_op_libraries.append(path)


def forget_custom_ops() -> None:
    """Register no custom-op library in sessions made from now on."""
    _custom_op_libraries.clear()


def make_session(model: Any, threads: int | None = None, optimize: bool = True,
                 providers: Sequence[str] = (), quiet: bool = False, timed: bool = False) -> Any:
    """An onnxruntime session with onnxruntime's default settings, as users run it.
    `optimize` turns on all of its graph optimizations (the baseline graphsub must beat);
    threads defaults to the core count; providers default to the CPU provider alone. A
    `quiet` session logs nothing, not even its errors: for probes whose failures are
    expected and handled (a node run on made-up inputs).

    Only a `timed` session (a candidate or an operator timed on onnxruntime) keeps
    onnxruntime's spinning worker threads, as users run it: the others (references,
    verification, probes) do not spin after a run: their threads spinning on every core slow
    the torch program timed right after them in the same process (torch-cpu's rounds of the
    zoo's llama on 2 cores: 20.3 ms alone, 35.3 ms with a reference run between rounds in one
    measurement, 10-16% slower in two more; 4-8% without the spinning)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize
                                     else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    opts.intra_op_num_threads = threads or os.cpu_count() or 1
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.log_severity_level = 4 if quiet else 3
    if not timed:
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    for library in _custom_op_libraries:
        opts.register_custom_ops_library(library)
    held = []
    if isinstance(model, DetachedModel) and model.weights:
        held = [ort.OrtValue.ortvalue_from_numpy(a) for a in model.weights.values()]
        opts.add_external_initializers(list(model.weights), held)
    with _mapped_pages_released(model.weights.values() if held else ()):
        session = ort.InferenceSession(_as_bytes(model), sess_options=opts,
                                       providers=list(providers) or ["CPUExecutionProvider"])
    session.graphsub_weights = held  # the arrays must outlive the session that reads them
    return session


#: How often the pages of mapped weights a session is reading are given back while it builds.
RELEASE_INTERVAL = 0.25


@contextlib.contextmanager
def _mapped_pages_released(arrays: Any) -> Iterator[None]:
    """Give back the pages of memory-mapped weights every RELEASE_INTERVAL while the block
    runs (onnxruntime building a session, which releases the GIL) and once after it. A session
    reads every weight once to pack it: left until the end, the pages it read stayed counted
    in the process's memory beside what it packed, and a 3 GB decoder's second session
    peaked at 3.1 GB of them on top of both sessions' 6.5 GB (9.6 GB, 3.1x the weights)."""
    arrays = list(arrays)
    if not arrays:
        yield
        return
    done = threading.Event()

    def release() -> None:
        while not done.wait(RELEASE_INTERVAL):
            _release_mapped_pages(arrays)

    releaser = threading.Thread(target=release, name="graphsub-release-pages", daemon=True)
    releaser.start()
    try:
        yield
    finally:
        done.set()
        releaser.join()
        _release_mapped_pages(arrays)


def file_mapping(array: np.ndarray) -> Any:
    """The mmap.mmap an array views (a weight of a memory-mapped data file), or None."""
    import mmap

    base: object = array  # numpy types .base as an array, but a mapped one's is the mmap
    while isinstance(base, np.ndarray):
        base = base.base
    return base if isinstance(base, mmap.mmap) else None


def _release_mapped_pages(arrays: Any) -> None:
    """Let the kernel drop the pages of memory-mapped weights this process has read (a
    session has just copied or packed them): they are clean pages of a file, read again
    from it if needed, and would otherwise stay counted in the process's memory as long as
    the mapping lives."""
    import mmap

    if not hasattr(mmap, "MADV_DONTNEED"):
        return
    seen: set[int] = set()
    for array in arrays:
        mapping = file_mapping(array)
        if mapping is not None and id(mapping) not in seen:
            seen.add(id(mapping))
            mapping.madvise(mmap.MADV_DONTNEED)


def quiet_run() -> Any:
    """Run options that log nothing (what a `quiet` session's runs take: onnxruntime logs a
    run's errors by the run's own level, not the session's)."""
    import onnxruntime as ort

    options = ort.RunOptions()
    options.log_severity_level = 4
    return options


def run(model: Any, feeds: Mapping[str, np.ndarray], threads: int | None = None,
        optimize: bool = True) -> dict[str, np.ndarray]:
    sess = model if hasattr(model, "run") else make_session(model, threads, optimize)
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, {k: as_feed(v) for k, v in feeds.items()})))


def bfloat16_through_float32(graph: Any) -> tuple[frozenset[str], frozenset[str]]:
    """Rewrite a GraphProto (in place) so that its bfloat16 inputs and outputs cross as
    float32, cast inside: onnxruntime's Python API takes and gives no bfloat16 array. Both
    casts are exact. Returns the names of the inputs and outputs so changed, for
    `with_bfloat16`."""
    from onnx import TensorProto, helper

    bf16 = TensorProto.BFLOAT16
    ins = frozenset(v.name for v in graph.input if v.type.tensor_type.elem_type == bf16)
    outs = frozenset(v.name for v in graph.output if v.type.tensor_type.elem_type == bf16)
    if not ins and not outs:
        return ins, outs
    casts_in = [helper.make_node("Cast", [f"{n}__f32"], [n], to=bf16) for n in ins]
    casts_out = [helper.make_node("Cast", [f"{n}__bf16"], [n], to=TensorProto.FLOAT)
                 for n in outs]
    for node in graph.node:
        for i, name in enumerate(node.output):
            if name in outs:
                node.output[i] = f"{name}__bf16"
    for v in (*graph.input, *graph.output):
        if v.name in ins | outs:
            v.type.tensor_type.elem_type = TensorProto.FLOAT
    for v in graph.input:
        if v.name in ins:
            v.name = f"{v.name}__f32"
    nodes = casts_in + list(graph.node) + casts_out
    del graph.node[:]
    graph.node.extend(nodes)
    return ins, outs


def with_bfloat16(run: Any, names: Any, feeds: Mapping[str, Any], ins: frozenset[str],
                  outs: frozenset[str]) -> list[Any]:
    """`run(names, feeds)` on a graph `bfloat16_through_float32` rewrote: bfloat16 feeds go
    in as float32, and the outputs it casts come back as bfloat16."""
    import ml_dtypes

    fed = {(f"{k}__f32" if k in ins else k): (np.asarray(v, np.float32) if k in ins else v)
           for k, v in feeds.items()}
    results = run(names, fed)
    return [np.asarray(r).astype(ml_dtypes.bfloat16) if n in outs else r
            for n, r in zip(names, results)]


def as_feed(value: Any) -> Any:
    """A value as onnxruntime takes it: an array (a 0-d one for a scalar), or a sequence (a
    list of arrays), a map (a dict) or an absent optional (None) as it is."""
    return value if isinstance(value, (list, tuple, dict)) or value is None else np.asarray(value)


class OrtRunnable(Runnable):
    """A model in an onnxruntime session. Timed runs call `session.run` with numpy inputs, as
    users run it (copies included)."""

    def __init__(self, model: Any, threads: int | None = None, providers: Sequence[str] = (),
                 label: str = "", session: Any = None) -> None:
        """A session of `model` is built here unless `session` is given: one built elsewhere
        (a run's shared session of its original, graphsub.pipeline.sessions), whose close
        here drops this runnable's hold only."""
        self.session = session if session is not None else make_session(
            model, threads, providers=providers, timed=True)
        self.label = label
        self._feeds: dict[str, np.ndarray] = {}


    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return run(self.session, feeds)

    def bind(self, feeds: Mapping[str, np.ndarray]) -> None:
        self._feeds = {k: as_feed(v) for k, v in feeds.items()}

    def timed(self, n: int) -> list[float]:
        return timed_calls(lambda: self.session.run(None, self._feeds), n)

    def close(self) -> None:
        """Drop the session: onnxruntime frees it, and with it its copy of the weights (the
        measure stage closes what it no longer times, so that a large model's sessions do
        not pile up)."""
        self.session = None
        self._feeds = {}


def time_models(models: Sequence[Any], feeds: Mapping[str, np.ndarray],
                threads: int | None = None, **kwargs: Any) -> list[Timing]:
    """Time several ONNX models on the same inputs in onnxruntime (CPU), side by side with
    its default session settings (see `runtime.timing.time_runnables` for the protocol)."""
    return time_runnables([OrtRunnable(m, threads) for m in models], feeds, **kwargs)
