"""Inputs the original model runs on, found before any search.

graphsub runs the user's model on inputs it makes up: random floats, small integers, and
open sizes at a default profile (1 for a batch, 128 for the rest). Some trained models run at
few of those. A text recognizer exported by Paddle2ONNX runs at a height of 48 only (its
sizes are `p2o_DynamicDimension_*`, nothing says which is the batch); a voice-activity
detector picks its branch by comparing a sample-rate input with 16000 and fails in the other
branch at the same length. Finding that out after the search wastes the search; asking the
user is the last resort. So the original is run once, in onnxruntime (the reference every
result is checked against), at the default inputs; where it fails, at the other sizes and
values a person would try first: the batch at 1, each open size at the sizes images and
sequences usually have, integer inputs at the constants the model compares them with.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from graphsub.ir.graph import Graph
from graphsub.ops.control_flow import all_graphs
from graphsub.runtime.inputs import graph_input_specs, random_feeds
from graphsub.runtime.ort_sessions import DetachedModel, ModelData, make_session, quiet_run
from graphsub.tensors.symbolic import SymbolRange

#: Sizes an open dimension is tried at where the default fails, in order: the sizes text
#: lines, images and sequences are usually given at.
TRIAL_SIZES = (32, 48, 64, 16, 1, 8, 96, 224, 256, 320, 512)
#: The most runs of the original one probe makes.
MAX_TRIALS = 80
#: Operators a value passes through unchanged on its way to a comparison.
_PASSTHROUGH = {"Cast", "Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten"}
#: Comparisons whose constant operand tells which values of an input matter; for the strict
#: ones, the values on either side of the constant too.
_COMPARISONS = {"Equal": False, "Less": True, "Greater": True, "LessOrEqual": True,
                "GreaterOrEqual": True}


@dataclass
class Probe:
    """What running the original found: the sizes and input values it runs at (`runs`
    False: none of those tried), how many were tried, and the first failure's message."""

    binding: dict[str, int]
    values: dict[str, np.ndarray] = field(default_factory=dict)
    runs: bool = True
    tried: int = 1
    error: str = ""


def probe(graph: Graph, model: ModelData, binding: Mapping[str, int], free_sizes: bool,
          seconds: float, session_of_model: Callable[[], Any]) -> Probe | None:
    """Run `model` (the original of `graph`) at `binding` and the inputs graphsub makes up;
    where that fails, at other sizes (when `free_sizes`: the user fixed none) and at the
    values its integer inputs are compared with, within `seconds` after the first run and
    MAX_TRIALS runs, on the session `session_of_model` gives (the run's session of its
    original, shared with the stages after). None when onnxruntime cannot even build the
    model (the measuring stage says why)."""
    try:
        session = session_of_model()
    except Exception:  # noqa: BLE001 (onnxruntime raises its own types)
        return None
    given = graph.facts.input_values
    choices = {name: values for name, values in compared_values(_proto(model)).items()
               if name not in given}
    symbols = graph.facts.symbols
    bindings = size_trials(graph, dict(binding), symbols) if free_sizes else [dict(binding)]
    deadline = None  # counted from the first run's end: the default must be tried anyway
    first_error = ""
    tried = 0
    for sizes in bindings:
        for values in value_trials(choices):
            if tried >= MAX_TRIALS or (deadline and time.perf_counter() > deadline):
                return Probe(dict(binding), runs=False, tried=tried, error=first_error)
            tried += 1
            feeds = random_feeds(graph_input_specs(graph, sizes))
            feeds.update(values)
            try:
                session.run(None, feeds, quiet_run())
            except Exception as exc:  # noqa: BLE001
                first_error = first_error or str(exc).strip().splitlines()[0][:300]
                deadline = deadline or time.perf_counter() + seconds
                continue
            return Probe(sizes, values, tried=tried, error=first_error)
    return Probe(dict(binding), runs=False, tried=tried, error=first_error)


def size_trials(graph: Graph, base: dict[str, int], symbols: Mapping[str, SymbolRange]
                ) -> list[dict[str, int]]:
    """Bindings to try, the default first: the leading sizes (a batch, whatever its name) at
    1; then each other size alone at each of TRIAL_SIZES; then all of them together at
    each; a size outside its symbol's range (a height the model needs above 32) is not
    tried, and no binding twice."""
    def inside(name: str, size: int) -> bool:
        return name not in symbols or symbols[name].clamp(size) == size

    leading = leading_symbols(graph) & set(base)
    batch_one = {**base, **{s: 1 for s in leading if inside(s, 1)}}
    others = sorted(set(base) - leading)
    found = [base]
    trials = [batch_one]
    trials += [{**batch_one, name: size} for name in others for size in TRIAL_SIZES
               if inside(name, size)]
    trials += [{**batch_one, **{name: size for name in others if inside(name, size)}}
               for size in TRIAL_SIZES]
    found += [t for k, t in enumerate(trials) if t != base and t not in trials[:k]]
    return found


def leading_symbols(graph: Graph) -> set[str]:
    """The symbols that are the first size of an input of rank 2 or more whose other sizes
    are not all fixed, or of rank 3 or more: a batch, in every layout exporters write."""
    found = set()
    for i in graph.inputs:
        shape = graph[i].type.shape
        if len(shape) < 2 or isinstance(shape[0], int) or not shape[0].is_Symbol:
            continue
        if len(shape) >= 3 or any(type(d) is not int for d in shape[1:]):
            found.add(shape[0].name)
    return found


def value_trials(choices: Mapping[str, Sequence[np.ndarray]]
                 ) -> Iterator[dict[str, np.ndarray]]:
    """Random values first (no entry), then every combination of the candidate values."""
    yield {}
    names = sorted(choices)
    if not names:
        return
    for combo in itertools.product(*(choices[n] for n in names)):
        yield dict(zip(names, combo))


def compared_values(model: onnx.ModelProto) -> dict[str, list[np.ndarray]]:
    """For each integer scalar input of the model that a comparison reads (directly or
    through a cast or reshape, in the main graph or any body), the constants it is compared
    with, as values of the input's type: a sample rate compared with 16000 is tried at 16000
    (and, for `<` or `>`, at 15999 and 16001)."""
    g = model.graph
    scalars = {}
    for vi in g.input:
        t = vi.type.tensor_type
        dtype = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type) if t.elem_type else None
        if dtype is not None and np.issubdtype(dtype, np.integer) and \
                t.HasField("shape") and all(d.HasField("dim_value") and d.dim_value == 1
                                            for d in t.shape.dim):
            scalars[vi.name] = (dtype, tuple(d.dim_value for d in t.shape.dim))
    if not scalars:
        return {}
    constants = {init.name: numpy_helper.to_array(init) for init in g.initializer
                 if int(np.prod(init.dims)) == 1}
    found: dict[str, list[np.ndarray]] = {}
    aliases = {name: name for name in scalars}  # value names are unique across bodies
    for graph in all_graphs(g):
        for node in graph.node:
            if node.op_type == "Constant":
                value = next((a.t for a in node.attribute if a.name == "value"), None)
                if value is not None and int(np.prod(value.dims)) == 1:
                    constants[node.output[0]] = numpy_helper.to_array(value)
            elif node.op_type in _PASSTHROUGH and node.input and node.input[0] in aliases:
                aliases[node.output[0]] = aliases[node.input[0]]
            elif node.op_type in _COMPARISONS and len(node.input) == 2:
                a, b = node.input
                source, constant = (a, b) if a in aliases else (b, a)
                if source not in aliases or constant not in constants:
                    continue
                name = aliases[source]
                dtype, shape = scalars[name]
                center = int(np.asarray(constants[constant]).reshape(()))
                steps = (0, -1, 1) if _COMPARISONS[node.op_type] else (0,)
                values = found.setdefault(name, [])
                for step in steps:
                    value = np.asarray(center + step, dtype=dtype).reshape(shape)
                    if not any(np.array_equal(value, v) for v in values):
                        values.append(value)
    return found


def fixed_declaration_error(graph: Graph, model: ModelData) -> str:
    """Why onnxruntime cannot build `model` with its inputs declared at `graph`'s input
    types ("" where it can): the sizes the user fixed, declared in place of the open ones,
    can break onnxruntime's typing of control flow (a branch that squeezes a size of 1 is
    typed as if taken)."""
    proto = onnx.ModelProto()
    proto.CopyFrom(_proto(model))
    types = {graph[i].attrs["name"]: graph[i].type for i in graph.inputs}
    for vi in proto.graph.input:
        t = types.get(vi.name)
        if t is None or not t.is_static or len(vi.type.tensor_type.shape.dim) != t.rank:
            continue
        for d, size in zip(vi.type.tensor_type.shape.dim, t.shape):
            d.dim_value = int(size)
    data: ModelData = proto.SerializeToString() if not isinstance(model, DetachedModel) else \
        DetachedModel(proto.SerializeToString(), model.weights)
    try:
        make_session(data, 1, quiet=True)
    except Exception as exc:  # noqa: BLE001
        return str(exc).strip().splitlines()[0]
    return ""


def _proto(model: ModelData) -> onnx.ModelProto:
    """The ModelProto of a model as graphsub hands it to onnxruntime (runtime.ort.ModelData)."""
    return onnx.load_from_string(model.proto if isinstance(model, DetachedModel) else model)


__all__ = ["Probe", "compared_values", "fixed_declaration_error", "leading_symbols", "probe", "size_trials",
           "value_trials"]
