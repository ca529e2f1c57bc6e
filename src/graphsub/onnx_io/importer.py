"""Import an ONNX model as a Graph.

Initializers and Constant nodes become weights; computations over constants whose result is a
shape, an index or a generated constant (Shape, ConstantOfShape, integer arithmetic on shapes)
are folded at import, which is what turns ONNX's run-time shape inputs into the concrete
attributes graphsub's operators have. Ops graphsub does not model become opaque nodes. Models
older than opset 13 are first converted to opset 13 with ONNX's version converter.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import helper, numpy_helper

from graphsub.errors import GraphsubError, ModelLoadError
from graphsub.ir.binding import defined_ranges
from graphsub.ir.facts import GraphFacts
from graphsub.ir.graph import Graph, Node, Value, make_node
from graphsub.tensors.symbolic import (Dim, SymbolRange, bind_all, floordiv, renamed, size_symbol,
                                  symbols_in)
from graphsub.tensors.onnx_types import (array_type, made_up_value, modelled, opaque_type,
                                         value_info)
from graphsub.tensors.types import Constant, TensorType
from graphsub.onnx_io import bodies, external, sizes
from graphsub.onnx_io.exporter import MAX_OPSET, MIN_OPSET
from graphsub.ops import get_op, importer_for
from graphsub.progress import Tracker, step
from graphsub.ops.contexts import OpImportContext
from graphsub.ops.control_flow import captured_names, has_subgraphs
from graphsub.runtime.ort_sessions import ORT_ERRORS, DetachedModel, ModelData, make_model

_MISSING = object()
#: Ops folded whenever all their inputs are constant, whatever their output type.
_ALWAYS_FOLD = {"Constant", "ConstantOfShape", "Shape", "Size", "Range", "EyeLike"}
_NONDETERMINISTIC = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                     "Bernoulli", "Multinomial"}
DEFAULT_DOMAINS = ("", "ai.onnx")
#: Ops never folded at import: a dequantized weight would be stored as floats (ops.is_foldable).
_KEPT = {"DequantizeLinear"}


def _read_model(source: Any) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The model, and the arrays of its initializers kept in external data files (mapped,
    never copied: graphsub.onnx_io.external)."""
    if isinstance(source, onnx.ModelProto):
        return source, {}
    if isinstance(source, DetachedModel):
        return _read_model(source.proto)[0], dict(source.weights)
    if isinstance(source, (bytes, bytearray)):
        model = onnx.ModelProto()
        try:
            model.ParseFromString(bytes(source))
        except DecodeError as exc:
            raise ModelLoadError(f"the bytes given are not an ONNX model: {exc}") from None
        return _check_looks_like_onnx(model, "the bytes given"), {}
    path = Path(os.fspath(source))
    if not path.exists():
        raise ModelLoadError(f"{path}: no such file")
    if path.is_dir():
        raise ModelLoadError(f"{path} is a folder, not an ONNX file")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except DecodeError as exc:
        raise ModelLoadError(f"{path} is not a valid ONNX model (truncated or not ONNX?): "
                             f"{exc}") from None
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path} could not be read as an ONNX model: {exc}") from None
    _check_looks_like_onnx(model, str(path))
    return model, external.mapped_initializers(model, path.parent)


def model_data(path: str | os.PathLike[str]) -> ModelData:
    """A model file as onnxruntime gets it from graphsub: the file's bytes, or, where its
    weights are in external data files beside it, the model with its weights mapped from
    them (the same arrays `load` gives the graph's weights)."""
    return _as_model_data(path, *_read_model(path))


def _as_model_data(source: Any, model: onnx.ModelProto,
                   weights: Mapping[str, np.ndarray]) -> ModelData:
    if weights or external.has_external_data(model):
        return DetachedModel(model.SerializeToString(), dict(weights))
    if isinstance(source, (bytes, bytearray)):
        return bytes(source)
    if isinstance(source, (str, os.PathLike)):
        return Path(source).read_bytes()
    serialized: bytes = model.SerializeToString()
    return serialized


def load_with_original(source: Any, input_shapes: Mapping[str, Sequence[int]] | None = None
                       ) -> tuple[Graph, ModelData]:
    """The graph `load` makes of the model, and the model as onnxruntime gets it (what
    `model_data` reads), from one parse of the file: a 2 GB model is read once."""
    model, weights = _read_model(source)
    original = _as_model_data(source, model, weights)  # before the import reads the model
    return _graph_of(model, weights, input_shapes), original


def _check_looks_like_onnx(model: onnx.ModelProto, where: str) -> onnx.ModelProto:
    # Protobuf parses many random byte strings without complaint; a real model has these.
    if model.ir_version <= 0 or not model.opset_import or not model.graph.output:
        raise ModelLoadError(f"{where} is not a valid ONNX model (no IR version, opset or "
                             "outputs: truncated or not an ONNX file?)")
    return model


def _default_opset(model: onnx.ModelProto) -> int:
    """The model's opset of ONNX's default domain (MAX_OPSET for a model without one: an
    ai.onnx.ml pipeline uses none of its operators)."""
    o: onnx.OperatorSetIdProto
    for o in model.opset_import:
        if o.domain in DEFAULT_DOMAINS:
            return o.version
    return MAX_OPSET


def _convert_opset(model: onnx.ModelProto, mapped: Mapping[str, np.ndarray]
                   ) -> tuple[onnx.ModelProto, dict[str, np.ndarray], str]:
    """The model at an opset graphsub reads (MIN_OPSET-MAX_OPSET) with the arrays of the
    weights it holds apart (`mapped`, as external data), and, where it could not be brought
    there with its meaning kept, the original with the reason it is kept at its own opset.
    ONNX's version converter changes meaning at times (an opset-6 PRelu's per-channel slope,
    an opset-8 Scan's batch axis), so a converted model is run beside the original in
    onnxruntime on made-up inputs (where small, or holding an operator of
    CONVERSION_HAZARDS), and kept only where both run and agree. The converter reads the
    model without its large weights (stubs in their place: it copied the whole model twice,
    9 s for VGG-19), which come along as arrays instead."""
    from onnx import version_converter

    version = _default_opset(model)
    if MIN_OPSET <= version <= MAX_OPSET:
        return model, dict(mapped), ""
    target = MIN_OPSET if version < MIN_OPSET else MAX_OPSET
    light, arrays = _large_weights_apart(model)
    try:
        converted = version_converter.convert_version(light, target)
    except Exception as exc:  # the converter raises bare RuntimeErrors of many kinds
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return model, dict(mapped), (f"ONNX's version converter cannot bring it to opset "
                                     f"{target} ({first[:160]})")
    weights = {**mapped, **arrays}
    if _weight_bytes(model, mapped) <= CONVERSION_CHECK_BYTES or _hazards(light):
        problem = _meaning_changed(DetachedModel(model.SerializeToString() if not mapped
                                                 else light.SerializeToString(), weights)
                                   if mapped else model, DetachedModel(
                                       converted.SerializeToString(), weights), model)
        if problem:
            return model, dict(mapped), (f"converted to opset {target}, it computes something "
                                         f"else ({problem})")
    return converted, weights, ""


#: A converted model is run beside its original (`_meaning_changed`) where its weights are
#: at most this many bytes, or where it holds an operator of CONVERSION_HAZARDS; a larger
#: one of other operators is trusted to the converter (two sessions of VGG-19's 575 MB took
#: 12 s), and checked anyway, as every model graphsub writes is, against the original.
CONVERSION_CHECK_BYTES = 64 << 20
#: Operators whose meaning changed between opsets in ways onnx's converter has been seen to
#: lose or could: a PRelu's per-channel slope (opset 7 broadcasts it over the last axis),
#: Scan's batch axis (opset 9), Upsample and Resize's modes, batch norm's `spatial` (opset
#: 9); the softmaxes' 2-D coercion (opset 13) where their input has more than two axes and
#: they do not normalize the last.
CONVERSION_HAZARDS = frozenset({"PRelu", "Scan", "Upsample", "Resize"})
_SOFTMAXES = frozenset({"Softmax", "LogSoftmax", "Hardmax"})
#: Initializers larger than this are held apart from the model the version converter reads.
_LARGE_WEIGHT = 1 << 16


def _weight_bytes(model: onnx.ModelProto, mapped: Mapping[str, np.ndarray]) -> int:
    return sum(len(t.raw_data) for t in model.graph.initializer) + sum(
        int(a.nbytes) for a in mapped.values())


def _hazards(model: onnx.ModelProto) -> bool:
    """Whether the model holds an operator whose conversion may change its meaning (see
    CONVERSION_HAZARDS); a softmax counts where inference gives its input more than two
    axes and it does not normalize the last."""
    ops = {n.op_type for n in model.graph.node}
    if ops & CONVERSION_HAZARDS or any(
            n.op_type == "BatchNormalization" and any(a.name == "spatial" and a.i == 0
                                                      for a in n.attribute)
            for n in model.graph.node):
        return True
    if not ops & _SOFTMAXES:
        return False
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - an old model inference cannot type: assume the worst
        return True
    ranks = {vi.name: len(vi.type.tensor_type.shape.dim)
             for vi in (*inferred.graph.value_info, *inferred.graph.input)
             if vi.type.tensor_type.HasField("shape")}
    for node in model.graph.node:
        if node.op_type in _SOFTMAXES:
            rank = ranks.get(node.input[0])
            axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
            if rank is None or (rank > 2 and axis not in (-1, rank - 1)):
                return True
    return False


def _large_weights_apart(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The model with each large initializer a stub (its name, type and shape, its data
    marked external) and the arrays of those initializers."""
    light = onnx.ModelProto()
    for field in ("ir_version", "producer_name", "producer_version", "domain",
                  "model_version", "doc_string"):
        setattr(light, field, getattr(model, field))
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    light.metadata_props.extend(model.metadata_props)
    g, h = model.graph, light.graph
    h.name = g.name
    h.node.extend(g.node)
    h.input.extend(g.input)
    h.output.extend(g.output)
    h.value_info.extend(g.value_info)
    h.sparse_initializer.extend(g.sparse_initializer)
    arrays = {}
    for t in g.initializer:
        if len(t.raw_data) > _LARGE_WEIGHT and not external.is_external(t):
            stub = h.initializer.add()
            stub.name, stub.data_type = t.name, t.data_type
            stub.dims.extend(t.dims)
            stub.data_location = onnx.TensorProto.EXTERNAL
            entry = stub.external_data.add()
            entry.key, entry.value = "location", "graphsub-held-apart"
            arrays[t.name] = numpy_helper.to_array(t)
        else:
            h.initializer.append(t)
    return light, arrays


def _meaning_changed(original: Any, converted: Any, proto: onnx.ModelProto) -> str:
    """How the converted model differs from the original (each an ONNX model as onnxruntime
    takes it; `proto` the original's, for its inputs) on made-up inputs ("" where it does
    not; the reason where either does not run, which is not knowing it is the same)."""
    from graphsub.verdicts.equivalence import SAME_FUNCTION, compare_outputs
    from graphsub.runtime.ort_sessions import make_session, quiet_run

    rng = np.random.default_rng(0)
    inits = {i.name for i in proto.graph.initializer}
    feeds = {}
    for vi in proto.graph.input:
        if vi.name not in inits:
            feeds[vi.name] = made_up_value(TensorType.opaque(vi.type.SerializeToString()), rng)
    try:
        outs = []
        for model in (original, converted):
            session = make_session(model if isinstance(model, DetachedModel)
                                   else model.SerializeToString(), threads=1, optimize=False,
                                   quiet=True)
            names = [o.name for o in session.get_outputs()]
            outs.append(dict(zip(names, session.run(names, feeds, quiet_run()))))
    except Exception as exc:  # noqa: BLE001 - a model that does not run cannot be compared
        return f"not run in onnxruntime: {str(exc).splitlines()[0][:120] if str(exc) else exc}"
    diffs, problems = compare_outputs(outs[0], outs[1], SAME_FUNCTION)
    wrong = problems + [d.describe() for d in diffs if not d.ok]
    return wrong[0] if wrong else ""


def _tensor_type(type_proto: onnx.TypeProto) -> tuple[list[int | str | None] | None, str] | None:
    if not type_proto.HasField("tensor_type"):
        return None
    tt = type_proto.tensor_type
    dtype = str(helper.tensor_dtype_to_np_dtype(tt.elem_type)) if tt.elem_type else None
    if dtype is None:
        return None
    if not tt.HasField("shape"):
        return None, dtype
    dims: list[int | str | None] = []
    for d in tt.shape.dim:
        if d.HasField("dim_value"):
            dims.append(d.dim_value)
        elif d.HasField("dim_param"):
            dims.append(d.dim_param)
        else:
            dims.append(None)
    return dims, dtype


def _topo_sorted_nodes(g: onnx.GraphProto, known: set[str]) -> list[onnx.NodeProto]:
    """The graph's nodes in dependency order; a clear error for cycles and undefined names."""
    producer: dict[str, int] = {}
    for i, n in enumerate(g.node):
        for o in n.output:
            if o:
                if o in producer or o in known:
                    raise ModelLoadError(f"value {o!r} is produced twice (node {n.name or n.op_type})")
                producer[o] = i
    deps: list[set[int]] = []
    for n in g.node:
        d = set()
        for name in (*n.input, *captured_names(n)):
            if not name:
                continue
            if name in producer:
                d.add(producer[name])
            elif name not in known:
                raise ModelLoadError(f"node {n.name or n.op_type} reads {name!r}, which no node, "
                                     "input or initializer defines")
        deps.append(d)
    order: list[int] = []
    state = [0] * len(g.node)
    for start in range(len(g.node)):
        if state[start]:
            continue
        stack = [(start, iter(sorted(deps[start])))]
        state[start] = 1
        while stack:
            i, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                stack.pop()
                state[i] = 2
                order.append(i)
            elif state[nxt] == 0:
                state[nxt] = 1
                stack.append((nxt, iter(sorted(deps[nxt]))))
            elif state[nxt] == 1:
                cycle = [j for j, _ in stack]
                cycle = cycle[cycle.index(nxt):]
                names = " -> ".join(g.node[j].name or g.node[j].op_type for j in cycle)
                from graphsub.errors import CycleError

                raise CycleError(f"the model's graph has a cycle: {names} -> "
                                 f"{g.node[nxt].name or g.node[nxt].op_type}")
    return [g.node[i] for i in order]


class ImportContext(OpImportContext):
    """What an op importer sees: values by ONNX name, constants, attributes, and `add`."""

    def __init__(self, opset: int, domain_opsets: dict[str, int]) -> None:
        self.opset = opset
        self.domain_opsets = domain_opsets
        self.nodes: dict[int, Node] = {}
        self.values: dict[str, Value] = {}
        self.constants: dict[str, np.ndarray] = {}
        self.used: set[str] = set()  # ONNX value names that some node or output reads
        #: what symbolic sizes need: the size values of shape computations, their dtypes,
        #: each size symbol's range and a value and axis where it is a dimension, and the
        #: types onnxruntime's symbolic inference gives the model's values
        self.folder = sizes.SizeFolder(self)
        self.size_dtypes: dict[str, Any] = {}
        self.symbol_ranges: dict[str, SymbolRange] = {}
        self.symbol_sources: dict[str, tuple[Value, int]] = {}
        self.inferred: dict[str, TensorType] = {}
        #: the types the model itself declares for its values (value_info and outputs)
        self.declared: dict[str, TensorType] = {}
        #: the values it declares of a type graphsub does not model (sequences, strings)
        self.opaque_declared: set[str] = set()
        #: Opaque nodes whose symbolic types a run confirmed, by what decides their outputs
        #: (_check_key): each layer of a deep model repeats the same few.
        self.checked: set[Any] = set()
        #: Every operator kept as it is (an opset graphsub does not read: onnx_io.importer.
        #: _convert_opset).
        self.all_opaque = False
        #: Outputs of nodes over constants that onnxruntime does not run here.
        self.unrunnable: set[str] = set()
        self.renamed: dict[str, Dim] = {}  # onnxruntime's fresh size names -> graphsub's

    def is_used(self, name: str) -> bool:
        return bool(name) and name in self.used

    # -- for op importers --
    def type_of(self, value: Value) -> TensorType:
        return self.nodes[value.node].outputs[value.index]

    def constant(self, name: str) -> np.ndarray | None:
        return self.constants.get(name)

    def sizes_of(self, name: str) -> tuple[Dim, ...] | None:
        """An integer input read as sizes (a reshape's target, a slice's bounds), flattened:
        numbers, or size expressions where the model computes it from its shapes; None
        when it is computed from data."""
        return self.folder.sizes_of(name)

    def bound_by_slice(self, shape: Sequence[Dim], starts: Sequence[Dim], ends: Sequence[Dim],
                       axes: Sequence[int] | None) -> None:
        sizes.bound_by_slice(self.symbol_ranges, shape, starts, ends, axes)

    def at_least(self, name: str, low: int) -> None:
        """Record that the model is defined for the size `name` from `low` on."""
        if name in self.symbol_ranges:
            self.symbol_ranges[name] = self.symbol_ranges[name].narrowed(low=low)

    def symbol_source(self, name: str) -> tuple[Value, int]:
        """A value, and the axis, whose dimension is the size symbol `name`."""
        if name not in self.symbol_sources:
            raise ModelLoadError(f"the size {name!r} is not a dimension of any tensor before "
                                 "its first use")
        return self.symbol_sources[name]

    def unify(self, inferred: TensorType, computed: TensorType) -> None:
        """Read onnxruntime's names for sizes it could not relate to the inputs (a fresh
        `Flatten_119_o0__d1` where graphsub knows the value is `seq`) from a value both
        typed, so that the types it gives later nodes use the model's own sizes."""
        if inferred.rank != computed.rank:
            return
        for ours, theirs in zip(computed.shape, inferred.shape):
            if (not isinstance(theirs, int) and theirs.is_Symbol and theirs.name not in
                    self.symbol_ranges and theirs.name not in self.renamed):
                self.renamed[theirs.name] = ours

    def note_symbols(self, value: Value) -> None:
        for axis, d in enumerate(self.type_of(value).shape):
            if not isinstance(d, int) and d.is_Symbol and d.name not in self.symbol_sources:
                self.symbol_sources[d.name] = (value, axis)

    def value(self, name: str) -> Value:
        if name not in self.values:
            if name in self.constants and not _modelled_array(self.constants[name]):
                self.values[name] = _opaque_constant(self, name, self.constants[name])
            elif name in self.constants:
                self.values[name] = self.weight(self.constants[name], name)
            elif name in self.folder.values:
                self.values[name] = sizes.materialize(self, self.folder.values[name],
                                                      self.size_dtypes[name])
            else:
                raise ModelLoadError(f"value {name!r} is used before it is defined")
        return self.values[name]

    def inputs(self, node: onnx.NodeProto) -> list[Value]:
        return [self.value(n) for n in node.input if n]

    def attr(self, node: onnx.NodeProto, name: str, default: Any = _MISSING) -> Any:
        for a in node.attribute:
            if a.name == name:
                v = helper.get_attribute_value(a)
                if isinstance(v, bytes):
                    return v.decode()
                if isinstance(v, list):
                    return tuple(v)
                return v
        if default is _MISSING:
            raise ModelLoadError(f"{node.op_type} node {node.name!r} lacks attribute {name!r}")
        return default

    def add(self, op: str, inputs: Sequence[Value], **attrs: Any) -> list[Value]:
        node = make_node(op, inputs, [self.type_of(v) for v in inputs], attrs)
        nid = len(self.nodes)
        self.nodes[nid] = node
        values = [Value(nid, i) for i in range(len(node.outputs))]
        if not all(t.is_static for t in node.outputs):
            for v in values:
                self.note_symbols(v)
        return values

    def weight(self, array: np.ndarray, name: str = "") -> Value:
        node = make_node("weight", (), (), {"value": Constant(array)}, name)
        nid = len(self.nodes)
        self.nodes[nid] = node
        return Value(nid, 0)


def _modelled_array(array: np.ndarray) -> bool:
    """Whether graphsub holds a constant as a weight (a numeric or boolean tensor), rather
    than as an opaque Constant node (strings, an element type it has no arithmetic for)."""
    return not array_type(array).is_opaque


def _opaque_constant(ctx: ImportContext, name: str, array: np.ndarray) -> Value:
    """A constant graphsub does not model, as the Constant node that makes it."""
    node = helper.make_node("Constant", [], [name], value=numpy_helper.from_array(array, name))
    (value,) = ctx.add("opaque", [], onnx_node=node.SerializeToString(),
                       opsets=(("", ctx.opset),), output_types=(array_type(array),),
                       input_slots=(), captures=(), op_type="Constant")
    return value


def _makes_opaque(node: onnx.NodeProto, ctx: ImportContext) -> bool:
    """Whether the node makes a value graphsub does not model, as ONNX's schema or the
    model's declarations tell before anything runs: a Cast to strings, an op whose outputs
    are sequences or optionals (SplitToSequence, SequenceEmpty, Optional)."""
    if node.op_type in _MAKES_OPAQUE:
        return True
    if node.op_type == "Cast":
        to = next((a.i for a in node.attribute if a.name == "to"), None)
        return to is not None and not modelled(helper.make_tensor_type_proto(to, None))
    return any(o in ctx.opaque_declared for o in node.output)


#: ONNX ops whose outputs are sequences, optionals or maps whatever their inputs.
_MAKES_OPAQUE = frozenset({"SequenceEmpty", "SequenceConstruct", "SequenceInsert",
                           "SequenceErase", "SplitToSequence", "Optional", "SequenceMap",
                           "ZipMap", "CastMap"})


def _domain_opsets(model: onnx.ModelProto) -> dict[str, int]:
    return {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}


def _single_node_model(node: onnx.NodeProto, ctx: ImportContext,
                       in_types: dict[str, TensorType], outputs_typed: bool = False,
                       out_types: Sequence[TensorType] = ()) -> onnx.ModelProto:
    inputs, inits = [], []
    for name in dict.fromkeys(n for n in (*node.input, *captured_names(node)) if n):
        if name in ctx.constants:
            inits.append(numpy_helper.from_array(ctx.constants[name], name))
        else:
            t = in_types[name]
            inputs.append(value_info(name, t))
    outs = [o for o in node.output if o]
    if outputs_typed:
        out_vi = [value_info(o, t) for o, t in zip(outs, out_types)]
    else:
        out_vi = [helper.make_empty_tensor_value_info(o) for o in outs]
    graph = helper.make_graph([node], "single", inputs, out_vi, initializer=inits)
    return make_model(graph, list(ctx.domain_opsets.items()))


def _run_single(node: onnx.NodeProto, ctx: ImportContext, in_types: dict[str, TensorType],
                seed: int = 0, spread: int = 1) -> list[np.ndarray]:
    """The node run once in onnxruntime on made-up inputs: floats standard-normal, integers
    from 0 to `spread` (1: valid indices into any axis), opaque values of their type."""
    from graphsub.runtime.inputs import random_array
    from graphsub.runtime.ort_sessions import (bfloat16_through_float32, make_session, quiet_run,
                                      with_bfloat16)

    model = _single_node_model(node, ctx, in_types)
    bf16_in, bf16_out = bfloat16_through_float32(model.graph)
    sess = make_session(model.SerializeToString(), threads=1, optimize=False, quiet=True)
    rng = np.random.default_rng(seed)

    def made_up(t: TensorType) -> Any:
        if t.is_opaque:
            return made_up_value(t, rng)
        if spread > 1 and t.dtype.startswith(("int", "uint")):
            return np.asarray(rng.integers(0, spread + 1, t.shape).astype(t.dtype))
        return random_array(t, rng)

    feeds = {n: made_up(in_types[n]) for n in (i.name.removesuffix("__f32")
                                               for i in sess.get_inputs())}
    names = [o.name for o in sess.get_outputs()]
    return with_bfloat16(lambda ns, fs: sess.run(ns, fs, quiet_run()), names, feeds, bf16_in,
                         bf16_out)


def _shapes_follow_data(node: onnx.NodeProto, ctx: ImportContext,
                        in_types: dict[str, TensorType], results: Sequence[Any]) -> bool:
    """Whether the node's output shapes depend on the values of an input the model computes
    (a Pad whose amounts come from an input, a NonZero): runs on other made-up values, of
    wider ranges, give other shapes, or fail (which is no evidence they would not). A run's
    shapes are then no type: a Shape read of them, folded, would be wrong at every other
    input (the ONNX test corpus's CenterCropPad, expanded)."""
    if all(n in ctx.constants for n in node.input if n):
        return False
    shapes = [np.shape(r) for r in results]
    for seed, spread in ((1, 7), (2, 40)):
        try:
            other = _run_single(node, ctx, in_types, seed, spread)
        except Exception:  # noqa: BLE001 - made-up values out of the node's domain
            return True
        if [np.shape(r) for r in other] != shapes:
            return True
    return False


def _shape_unknown(name: str, result: Any, ctx: ImportContext) -> TensorType:
    """The type of a tensor whose shape only its inputs' values decide: the model's
    declaration where it has one, else carried as an opaque tensor of its element type."""
    if name in ctx.declared:
        return ctx.declared[name]
    if not isinstance(result, np.ndarray):
        return array_type(result)
    proto = helper.make_tensor_type_proto(helper.np_dtype_to_tensor_dtype(result.dtype),
                                          [None] * result.ndim)
    return TensorType.opaque(proto.SerializeToString())


def _infer_output_types(node: onnx.NodeProto, ctx: ImportContext,
                        in_types: dict[str, TensorType]) -> list[TensorType]:
    """Output types of one node from ONNX shape inference, or by running it once when
    inference cannot tell (data-dependent shapes are then fixed to what this input gives)."""
    model = _single_node_model(node, ctx, in_types)
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
        by_name = {vi.name: _tensor_type(vi.type) for vi in inferred.graph.output}
        opaque = {vi.name: t for vi in inferred.graph.output
                  if vi.type.WhichOneof("value") and (t := opaque_type(vi.type)) is not None}
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError):
        by_name, opaque = {}, {}  # inference cannot tell: the node is run below instead
    protos = {vi.name: vi.type for vi in inferred.graph.output} if by_name else {}
    reads_opaque = any(t.is_opaque for t in in_types.values())
    types: list[TensorType] = []
    for o in (o for o in node.output if o):
        if o in opaque:  # a sequence, an optional, strings: carried as inference types it
            types.append(opaque[o])
            continue
        tt = by_name.get(o)
        if reads_opaque and (tt is None or tt[0] is None
                             or any(not isinstance(d, int) for d in tt[0])):
            # made from a sequence (how many elements, what sizes): not a shape a run on a
            # made-up value could tell, so the tensor is carried as it is, like its source
            types.append(_carried_tensor(node, o, protos.get(o), ctx))
            continue
        if tt is None or tt[0] is None or any(not isinstance(d, int) for d in tt[0]):
            try:
                results = _run_single(node, ctx, in_types)
            except Exception as exc:
                declared = _declared_types(node, ctx)
                if declared is not None:
                    return declared
                raise ModelLoadError(_untyped_message(node, exc)) from None
            if _shapes_follow_data(node, ctx, in_types, results):
                outs = [o for o in node.output if o]
                return [_shape_unknown(o, r, ctx) for o, r in zip(outs, results)]
            return [array_type(r) for r in results]
        types.append(TensorType(tuple(tt[0]), tt[1]))
    return types


def _carried_tensor(node: onnx.NodeProto, name: str, proto: onnx.TypeProto | None,
                    ctx: ImportContext) -> TensorType:
    """The type of a tensor whose shape only the values of an opaque input decide: the model's
    declaration where it has one, else an opaque type of the element type inference gives."""
    if name in ctx.declared:
        return ctx.declared[name]
    if proto is not None and proto.HasField("tensor_type") and proto.tensor_type.elem_type:
        return TensorType.opaque(proto.SerializeToString())
    raise ModelLoadError(_untyped_message(node, ValueError(
        "its output is made from a sequence or optional whose contents decide its type")))


def _declared_types(node: onnx.NodeProto, ctx: ImportContext) -> list[TensorType] | None:
    """The node's output types as the model declares them (value_info, graph outputs): what
    an operator no inference knows and onnxruntime cannot run (a custom domain's) is typed
    by; None unless every output is declared over sizes the model defines."""
    declared = [ctx.declared.get(o) for o in node.output if o]
    types = [t for t in declared if t is not None]
    if len(types) != len(declared) or any(
            not symbols_in(t.shape) <= set(ctx.symbol_ranges) for t in types):
        return None
    return types


def _untyped_message(node: onnx.NodeProto, exc: BaseException) -> str:
    where = f"{node.domain}.{node.op_type}" if node.domain not in DEFAULT_DOMAINS else node.op_type
    reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return (f"cannot determine the output shapes of {where} node {node.name!r}: no shape "
            f"inference knows it, the model declares no type for its outputs (value_info), "
            f"and onnxruntime cannot run it ({reason}); declare its output types in the "
            "model's value_info, or give its custom-op library with --custom-ops LIB.so")


def _fold(node: onnx.NodeProto, ctx: ImportContext, in_types: dict[str, TensorType]) -> bool:
    """Compute a node over constants at import; True when it was folded."""
    if node.op_type == "Shape" and node.input[0] in in_types and in_types[node.input[0]].is_static:
        shape = np.array(in_types[node.input[0]].shape, dtype=np.int64)
        start = ctx.attr(node, "start", 0)
        end = ctx.attr(node, "end", None)
        ctx.constants[node.output[0]] = shape[start:end]
        return True
    if node.op_type == "Size" and node.input[0] in in_types and in_types[node.input[0]].is_static:
        ctx.constants[node.output[0]] = np.array(in_types[node.input[0]].numel, dtype=np.int64)
        return True
    if node.op_type in _NONDETERMINISTIC or node.op_type in _KEPT or has_subgraphs(node):
        return False
    if node.op_type == "ConstantOfShape" and node.input[0] in ctx.constants:
        fill = ctx.attr(node, "value", None)
        fill = numpy_helper.to_array(fill) if fill is not None else np.zeros(1, np.float32)
        dims = tuple(int(d) for d in ctx.constants[node.input[0]])
        ctx.constants[node.output[0]] = np.full(dims, fill.reshape(-1)[0], dtype=fill.dtype)
        return True
    if node.op_type == "Constant" and len(node.attribute) == 1 and node.attribute[0].name == "value":
        ctx.constants[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
        return True
    if not all(n in ctx.constants for n in node.input if n):
        return False
    if node.op_type not in _ALWAYS_FOLD:
        if not any(node.input):
            return False
        if importer_for(node.op_type) is not None:
            # A modelled op over constants stays a (weight-only) node unless it computes
            # shapes or indices, which must be concrete for the ops that read them.
            probe = _infer_output_types(node, ctx, in_types)
            if any(t.dtype.startswith(("float", "bfloat")) for t in probe):
                return False
    try:
        results = _run_single(node, ctx, in_types)
    except ORT_ERRORS:
        ctx.unrunnable.update(node.output)  # stays a node, never folded: see _import_opaque
        return False
    for name, r in zip((o for o in node.output if o), results):
        ctx.constants[name] = np.asarray(r)
    return True


def _runtime_types(node: onnx.NodeProto, ctx: ImportContext, in_types: dict[str, TensorType],
                   inferred: list[TensorType]) -> list[TensorType]:
    """An opaque node's output types as onnxruntime computes them, which is what the model
    computes where it runs: ONNX shape inference can disagree (MaxPool with ceil_mode, whose
    last window onnxruntime drops when it starts in the padding, is a row shorter), and a
    wrong type would mislead every op graphsub builds after it (found by the fuzzer). Where
    the node cannot run on made-up inputs, inference's types stay."""
    if any(t.is_opaque for t in (*inferred, *in_types.values())):
        return inferred  # what a run on made-up sequences shows says less than inference
    try:
        results = _run_single(node, ctx, in_types)
    except ORT_ERRORS:
        return inferred
    ran = [array_type(r) for r in results]
    return ran if len(ran) == len(inferred) else inferred


def _import_opaque(node: onnx.NodeProto, ctx: ImportContext,
                   in_types: dict[str, TensorType]) -> list[Value]:
    captures = captured_names(node)
    flow_types = bodies.output_types(node, in_types, ctx.constants,
                                     sorted(ctx.domain_opsets.items()), load) if captures or \
        has_subgraphs(node) else None
    if flow_types is not None:
        out_types = flow_types
    elif any(t.is_opaque for t in in_types.values()):
        out_types = _infer_output_types(node, ctx, in_types)  # what a sequence gives: carried
    elif any(n in ctx.folder.values for n in (*node.input, *captures)) or not all(
            t.is_static for t in in_types.values()):
        out_types = _symbolic_types(node, ctx, in_types)
        _check_symbolic_types(node, ctx, in_types, out_types)
    else:
        out_types = _runtime_types(node, ctx, in_types, _infer_output_types(node, ctx, in_types))
    slots = tuple(i for i, n in enumerate(node.input) if n)
    domain = "" if node.domain == "ai.onnx" else node.domain
    opsets = tuple(sorted({("", ctx.opset), (domain, ctx.domain_opsets.get(domain, 1))}))
    if has_subgraphs(node):  # a body may use any domain of the model
        opsets = tuple(sorted({*opsets, *((d, v) for d, v in ctx.domain_opsets.items() if d)}))
    inputs = [*ctx.inputs(node), *(ctx.value(n) for n in captures)]
    read = [ctx.type_of(v) for v in inputs]
    return ctx.add("opaque", inputs,
                   onnx_node=node.SerializeToString(), opsets=opsets,
                   output_types=tuple(out_types), input_slots=slots, captures=captures,
                   op_type=node.op_type if not domain else f"{domain}.{node.op_type}",
                   opaque_inputs=tuple(t.onnx_type for t in read)
                   if any(t.is_opaque for t in read) else (),
                   foldable=not any(o in ctx.unrunnable for o in node.output))


def _trusted(types: Sequence[TensorType | None], ctx: ImportContext) -> bool:
    """Whether inferred types can stand: every size over the model's own symbols, and an
    integer for every value of them (onnxruntime types an uneven Split's halves `s/2`)."""
    return all(t is not None and symbols_in(t.shape) <= set(ctx.symbol_ranges)
               and all(isinstance(d, int) or d.is_integer for d in t.shape) for t in types)


def _symbolic_types(node: onnx.NodeProto, ctx: ImportContext,
                    in_types: dict[str, TensorType]) -> list[TensorType]:
    """An opaque node's output types over symbolic sizes, from onnxruntime's inference of the
    whole model (where it relates every size to the model's own), or else of the node alone
    (onnxruntime's, or a fit of its sizes from runs)."""
    types = [renamed(ctx.inferred[o], ctx.renamed) if o in ctx.inferred else None
             for o in node.output if o]
    if not _trusted(types, ctx):
        # A size onnxruntime names afresh (`ConvInteger_254_o0__d3`) is one no input defines,
        # and its rank may be guessed: the node is typed on its own instead.
        types = [None]
        in_types = {**in_types, **{n: TensorType(ctx.folder.values[n].shape,
                                                 str(np.dtype(ctx.size_dtypes[n])))
                                   for n in node.input if n in ctx.folder.values}}
        declared = _declared_types(node, ctx)
        if declared is not None:
            return declared
        alone = sizes.node_types(node, in_types, ctx.constants, sorted(ctx.domain_opsets.items()))
        if alone is not None and _trusted(alone, ctx):
            return alone
        probed = _probed_types(node, ctx, in_types)
        if probed is not None:
            return probed
    known = [t for t in types if t is not None]
    if len(known) != len(types):
        raise ModelLoadError(f"cannot determine the output shapes of {node.op_type} node "
                             f"{node.name!r} over the model's symbolic sizes; give concrete "
                             "sizes with --input-shape NAME=1x128 (or input_shapes={...})")
    return known


#: Sizes an opaque node's symbolic output types are checked at (each symbol at each value,
#: within its range): where onnxruntime's symbolic inference is wrong (Conv with SAME_LOWER
#: padding at stride 2, found by the fuzzer), a run tells.
_CHECK_SIZES = (5, 8)


def _node_symbols(node: onnx.NodeProto, ctx: ImportContext, types: Sequence[TensorType]
                  ) -> set[str]:
    """The size symbols of these types and of the size values the node reads."""
    read = {*node.input, *captured_names(node)}
    return set(symbols_in(d for t in types for d in t.shape)) | set(
        symbols_in(d for n, v in ctx.folder.values.items() if n in read for d in v.reshape(-1)))


def _run_at(node: onnx.NodeProto, ctx: ImportContext, in_types: dict[str, TensorType],
            binding: Mapping[str, int]) -> list[np.ndarray] | None:
    """The node's outputs on made-up inputs with every size at `binding`'s value; None where
    the node does not run on them."""
    read = {*node.input, *captured_names(node)}
    bound = {n: t.bound(binding) for n, t in in_types.items()}
    extra = {n: np.array(bind_all(tuple(v.reshape(-1)), binding), dtype=ctx.size_dtypes[n]
                         ).reshape(v.shape) for n, v in ctx.folder.values.items() if n in read}
    saved = {n: ctx.constants.get(n) for n in extra}
    ctx.constants.update(extra)
    try:
        return _run_single(node, ctx, bound)
    except ORT_ERRORS:
        return None
    finally:
        for n, c in saved.items():
            if c is None:
                ctx.constants.pop(n, None)
            else:
                ctx.constants[n] = c


def _check_symbolic_types(node: onnx.NodeProto, ctx: ImportContext,
                          in_types: dict[str, TensorType], out_types: list[TensorType]) -> None:
    """Run the node at concrete sizes and refuse it, naming it, where its outputs' shapes
    differ from the symbolic types it was given. A node that does not run on made-up inputs
    (indices out of range, a data-dependent shape) is not checked."""
    names = _node_symbols(node, ctx, [*in_types.values(), *out_types])
    if not names <= set(ctx.symbol_ranges):
        return
    _defined_from(names, out_types, ctx)
    key = _check_key(node, ctx, in_types, out_types)
    if key is not None and key in ctx.checked:
        return
    for value in _CHECK_SIZES:
        binding = {n: ctx.symbol_ranges[n].clamp(value) for n in names}
        try:
            results = _run_at(node, ctx, in_types, binding)
        except ValueError:  # an input of negative size: the model is not defined there
            continue
        if results is None:
            return
        for out, t, r in zip([o for o in node.output if o], out_types, results):
            try:
                bound_shape = t.bound(binding).shape
            except ValueError:  # a negative size: the inferred expression is wrong there
                bound_shape = None
            if bound_shape != tuple(r.shape):
                raise ModelLoadError(
                    f"cannot determine the output shape of {node.op_type} node {node.name!r} "
                    f"over the model's symbolic sizes (inferred {t}, but at "
                    f"{', '.join(f'{k}={v}' for k, v in sorted(binding.items()))} it computes "
                    f"{'x'.join(map(str, r.shape))}); give concrete sizes with --input-shape "
                    "NAME=1x128 (or input_shapes={...})")
    if key is not None:
        ctx.checked.add(key)


#: Constants larger than this are not part of a check's key (weights: not hashed for it).
_KEY_CONSTANT_BYTES = 4096


def _check_key(node: onnx.NodeProto, ctx: ImportContext, in_types: dict[str, TensorType],
               out_types: Sequence[TensorType]) -> Any:
    """What decides whether a node's runs confirm its symbolic types: its operator and
    attributes, its inputs' types, the values of the constants and size values it reads, the
    symbols' ranges and the types to confirm. None where it reads a large constant."""
    bare = onnx.NodeProto()
    bare.CopyFrom(node)
    bare.name = bare.doc_string = ""
    del bare.input[:], bare.output[:], bare.metadata_props[:]
    read = [n for n in (*node.input, *captured_names(node)) if n]
    parts: list[Any] = [bare.SerializeToString(), tuple(str(out) for out in out_types)]
    for n in read:
        if n in ctx.folder.values:
            parts.append(("size", str(ctx.folder.values[n].tolist()), ctx.size_dtypes[n]))
        elif n in ctx.constants:
            c = ctx.constants[n]
            if c.nbytes > _KEY_CONSTANT_BYTES:
                return None
            parts.append(("const", c.dtype.str, c.shape, c.tobytes()))
        else:
            parts.append(("value", str(in_types.get(n))))
    parts.append(tuple(sorted((k, str(r)) for k, r in ctx.symbol_ranges.items())))
    return tuple(parts)


#: The largest size a symbol's range is raised to where an inferred size would be empty.
_MAX_LOW = 64


def _defined_from(names: set[str], out_types: Sequence[TensorType], ctx: ImportContext) -> None:
    """Raise the range of a single size symbol to where every inferred output size is at
    least 1: a slice `x[7:]` of a dimension `s` is `s - 7` from s = 8 on, and empty (not
    negative) below, which no expression of graphsub's describes; the model is then taken
    as defined from 8 on (checked and verified there), as graphsub does for its own slices."""
    if len(names) != 1:
        return
    (name,) = names
    low = ctx.symbol_ranges[name].low
    for value in range(low, _MAX_LOW + 1):
        try:
            if all(d >= 1 for t in out_types for d in t.bound({name: value}).shape):
                if value > low:
                    ctx.at_least(name, value)
                return
        except (ValueError, KeyError, TypeError):
            continue


#: The sizes an untyped node is run at to find its output sizes: each symbol at consecutive
#: values from the base (enough to see a division by up to _PROBE_DIVISORS' largest), then at
#: farther ones that confirm the fit.
_PROBE_BASE = 6
_PROBE_DIVISORS = (1, 2, 3, 4, 8, 16, 32)
_PROBE_CONFIRM = (53, 77, 130)


def _fit_dim(samples: Mapping[int, int]) -> tuple[int, int, int] | None:
    """(p, c, q) with floor((p*s + c) / q) equal to every sampled size (s -> size): what a
    chain of strided convolutions, poolings and linear size arithmetic computes."""
    points = sorted(samples.items())
    (s0, d0), (s1, d1) = points[0], points[-1]
    for q in _PROBE_DIVISORS:
        p = round((d1 - d0) * q / (s1 - s0))
        for c in range(q * d0 - p * s0, q * d0 - p * s0 + q):
            if all((p * s + c) // q == d for s, d in points):
                return p, c, q
    return None


def _probed_types(node: onnx.NodeProto, ctx: ImportContext, in_types: dict[str, TensorType]
                  ) -> list[TensorType] | None:
    """An opaque node's output types over symbolic sizes found by running it (an LSTM's
    sequence and batch, a com.microsoft operator no inference knows, an integer convolution
    of a quantized model): each output dimension is fitted as floor((p*size + c) / q) of the
    one size it changes with, or as a constant, from runs at consecutive sizes, and the fit is
    confirmed at far ones. None where the node does not run on made-up inputs or a dimension
    is no such function (a data-dependent count, a product of sizes); the written model is
    verified at many sizes anyway, where a wrong fit would be caught."""
    if any(t.is_opaque for t in in_types.values()):
        return None  # a made-up sequence's sizes are not the model's
    names = sorted(_node_symbols(node, ctx, list(in_types.values())))
    values = range(_PROBE_BASE, _PROBE_BASE + 2 * max(_PROBE_DIVISORS) + 1)
    if not names or not set(names) <= set(ctx.symbol_ranges) or any(
            ctx.symbol_ranges[n].clamp(v) != v for n in names
            for v in (*values, *_PROBE_CONFIRM)):
        return None  # the ranges do not hold the probe sizes: no fit to trust

    def shapes_at(binding: Mapping[str, int]) -> list[tuple[int, ...]] | None:
        try:
            results = _run_at(node, ctx, in_types, binding)
        except ValueError:  # a negative size: the model is not defined there
            return None
        if results is None or not all(isinstance(r, np.ndarray) for r in results):
            return None  # a sequence out: its sizes are not a fit of the inputs'
        return [r.shape for r in results]

    base = {n: _PROBE_BASE for n in names}
    first = shapes_at(base)
    if first is None:
        return None
    dtypes = [str(r.dtype) for r in _run_at(node, ctx, in_types, base) or []]
    dims: list[list[Dim]] = [list(shape) for shape in first]
    for name in names:
        maybe = {v: shapes_at({**base, name: v}) for v in (*values, *_PROBE_CONFIRM)}
        runs = {v: r for v, r in maybe.items() if r is not None}
        if len(runs) != len(maybe) or any(
                [len(s) for s in r] != [len(s) for s in first] for r in runs.values()):
            return None
        for k, shape in enumerate(first):
            for axis in range(len(shape)):
                samples = {v: r[k][axis] for v, r in runs.items()}
                if len(set(samples.values())) == 1:
                    continue  # does not change with this size
                if type(dims[k][axis]) is not int or dims[k][axis] != shape[axis]:
                    return None  # changes with two sizes: no fit
                fit = _fit_dim(samples)
                if fit is None:
                    return None
                p, c, q = fit
                dims[k][axis] = floordiv(p * size_symbol(name) + c, q)
    return [TensorType(tuple(d), dtype) for d, dtype in zip(dims, dtypes)]


def _reads(g: onnx.GraphProto) -> set[str]:
    return {n for node in g.node for n in (*node.input, *captured_names(node))} | {
        o.name for o in g.output}


def _import_nodes(ctx: ImportContext, nodes: Sequence[onnx.NodeProto],
                  tracker: Tracker | None = None) -> None:
    for node in nodes:
        if tracker is not None:
            tracker.advance()
        read = [n for n in (*node.input, *captured_names(node)) if n]
        in_types = {n: ctx.type_of(ctx.values[n]) for n in read if n in ctx.values}
        in_types.update({n: array_type(ctx.constants[n]) for n in read if n in ctx.constants})
        carried = ctx.all_opaque or any(t.is_opaque for t in in_types.values()) \
            or _makes_opaque(node, ctx)
        if node.domain in DEFAULT_DOMAINS and not carried and (
                ctx.folder.fold(node, in_types) or _fold(node, ctx, in_types)
                or _inline_if(node, ctx)):
            continue
        if carried and node.op_type == "Constant" and node.domain in DEFAULT_DOMAINS \
                and _fold(node, ctx, in_types):
            continue  # a constant of strings: kept as one (an opaque Constant where read)
        outputs = None
        importer = importer_for(node.op_type, node.domain) if not carried else None
        if importer is not None:
            try:
                outputs = importer(ctx, node)
            except (GraphsubError, ValueError):
                outputs = None  # outside what graphsub models: keep it as an opaque node
        if outputs is None:
            outputs = _import_opaque(node, ctx, in_types)
        for name, v in zip((o for o in node.output if o), outputs):
            ctx.values[name] = v
            if name in ctx.inferred:
                ctx.unify(ctx.inferred[name], ctx.type_of(v))


def _inline_if(node: onnx.NodeProto, ctx: ImportContext) -> bool:
    """An If whose condition is known at import (a constant, or computed from static
    shapes: `if x.shape[0] == 1` in a traced model) as the branch it takes, imported in
    place; True when it was. Exporters write such Ifs around squeezes whose rank depends on
    the branch, which no single type could describe."""
    cond = ctx.constants.get(node.input[0]) if node.op_type == "If" and node.input else None
    if cond is None or cond.size != 1:
        return False
    name = "then_branch" if bool(cond.reshape(-1)[0]) else "else_branch"
    branch = next(a.g for a in node.attribute if a.name == name)
    for init in branch.initializer:
        ctx.constants[init.name] = numpy_helper.to_array(init)
    for sparse in branch.sparse_initializer:
        ctx.constants[sparse.values.name] = _densify(sparse)
    known = set(ctx.constants) | set(ctx.values) | set(ctx.folder.values)
    ctx.used |= _reads(branch)
    _import_nodes(ctx, _topo_sorted_nodes(branch, known))
    for out, inner in zip(node.output, branch.output):
        if not out:
            continue
        if inner.name in ctx.constants:
            ctx.constants[out] = ctx.constants[inner.name]
        elif inner.name in ctx.folder.values:
            ctx.folder.values[out] = ctx.folder.values[inner.name]
            ctx.size_dtypes[out] = ctx.size_dtypes[inner.name]
        else:
            ctx.values[out] = ctx.value(inner.name)
    return True


def load(source: Any, input_shapes: Mapping[str, Sequence[int]] | None = None) -> Graph:
    """Import an ONNX model (path, bytes or ModelProto) as a Graph.

    A dimension the model leaves open (a dim_param, or none) is a size symbol of the graph,
    kept through import; `input_shapes` fixes inputs to concrete shapes instead. The graph's
    `facts.symbols` gives each symbol's range.
    """
    return _graph_of(*_read_model(source), input_shapes)


def _graph_of(original: onnx.ModelProto, mapped: Mapping[str, np.ndarray],
              input_shapes: Mapping[str, Sequence[int]] | None) -> Graph:
    source_opset = _default_opset(original)
    external_data = bool(mapped)
    model, mapped, kept_because = _convert_opset(original, mapped)
    g = model.graph
    opset = _default_opset(model)
    ctx = ImportContext(opset, _domain_opsets(model))
    # At an opset graphsub does not read, every operator is kept as it is (opaque), and the
    # model is written back at its own opset.
    ctx.all_opaque = bool(kept_because)

    for vi in (*g.value_info, *g.output):
        declared = sizes.declared_type(vi.type)
        if declared is not None:
            ctx.declared[vi.name] = declared
        elif vi.type.WhichOneof("value") and opaque_type(vi.type) is not None:
            ctx.opaque_declared.add(vi.name)
    for init in g.initializer:
        ctx.constants[init.name] = (mapped[init.name] if init.name in mapped
                                    else numpy_helper.to_array(init))
    for sparse in g.sparse_initializer:
        ctx.constants[sparse.values.name] = _densify(sparse)
    inputs = sizes.input_types(model, input_shapes)
    if not all(t.is_static for _, t in inputs):
        ctx.inferred = sizes.inferred_types(external.without_external_data(model))
    input_ids = []
    for name, t in inputs:
        node = make_node("input", (), (), {"name": name, "shape": t.shape, "dtype": t.dtype,
                                           "onnx_type": t.onnx_type})
        nid = len(ctx.nodes)
        ctx.nodes[nid] = node
        ctx.values[name] = Value(nid, 0)
        ctx.note_symbols(ctx.values[name])
        for d in t.shape:
            if not isinstance(d, int):
                ctx.symbol_ranges.setdefault(d.name, SymbolRange())
        input_ids.append(nid)

    known = set(ctx.constants) | {name for name, _ in inputs}
    ctx.used = _reads(g)
    with step("load", len(g.node), "nodes") as tracker:
        _import_nodes(ctx, _topo_sorted_nodes(g, known), tracker)

    out_values, out_names = [], []
    for o in g.output:
        if o.name in ctx.values or o.name in ctx.constants:
            out_values.append(ctx.value(o.name))
        else:
            raise ModelLoadError(f"graph output {o.name!r} is not computed by any node")
        out_names.append(o.name)
    facts = GraphFacts(
        opset=opset, source_opset=source_opset, producer=model.producer_name,
        opset_kept=f"opset {source_opset} kept: {kept_because}" if kept_because else "",
        external_data=external_data,
        domain_opsets={d: v for d, v in ctx.domain_opsets.items() if d},
        # what the model declared where the user fixed sizes (graphsub.pipeline.probe_stage:
        # control flow onnxruntime cannot type at fixed sizes is written as declared)
        input_dims={vi.name: sizes.declared_dims(vi.type) for vi in g.input
                    if vi.name in (input_shapes or {})},
        symbols=dict(ctx.symbol_ranges),
        output_dims={o.name: sizes.declared_dims(o.type) for o in g.output}
        if ctx.symbol_ranges else {})
    _unfoldable_marked(ctx, input_ids, out_values)
    graph = _softmax_guards(Graph(ctx.nodes, input_ids, out_values, out_names, facts).dce())
    if ctx.symbol_ranges:
        graph = graph.with_facts(symbols=defined_ranges(graph, ctx.symbol_ranges))
    return graph


def _unfoldable_marked(ctx: ImportContext, input_ids: Sequence[int],
                       outputs: Sequence[Value]) -> None:
    """Opaque nodes over weights alone that onnxruntime cannot run here (an Equal over
    bfloat16) are marked not foldable, so that the exporter writes them as nodes rather than
    computing them into initializers. Their inputs are computed (graphsub's operators over
    weights, by the numpy reference), then each is run once."""
    from graphsub.runtime.reference import evaluate

    draft = Graph(ctx.nodes, input_ids, outputs, [f"o{i}" for i in range(len(outputs))],
                  check=False)
    weight_only = draft.weight_only()
    suspects = [nid for nid in draft.topo_order() if nid in weight_only
                and ctx.nodes[nid].op == "opaque" and ctx.nodes[nid].inputs]
    for nid in suspects:
        node = ctx.nodes[nid]
        probe = Graph(ctx.nodes, (), list(node.inputs), [f"i{k}" for k in range(len(node.inputs))],
                      check=False).dce()
        try:
            args = list(evaluate(probe, {}).values())
            get_op("opaque").evaluate(node.attrs, args)
        except ORT_ERRORS:
            ctx.nodes[nid] = make_node("opaque", node.inputs,
                                       [ctx.type_of(v) for v in node.inputs],
                                       {**dict(node.attrs), "foldable": False}, node.name)


def _softmax_guards(graph: Graph) -> Graph:
    """Each Where(IsNaN(p), 0, p) after a softmax p, the guard the dynamo exporter writes
    after attention's softmax, as one guarded_softmax operator: rules can then see the
    softmax and its guard together, and drop the guard where it provably changes nothing,
    while no rule for plain softmax can drop it by mistake."""
    edit = None
    for nid, where in graph.nodes.items():
        if where.op != "opaque" or where.attrs["op_type"] != "Where" \
                or tuple(where.attrs["input_slots"]) != (0, 1, 2):
            continue
        cond, zero, probs = where.inputs
        isnan, softmax, fill = graph[cond.node], graph[probs.node], graph[zero.node]
        if (isnan.op != "opaque" or isnan.attrs["op_type"] != "IsNaN"
                or isnan.inputs != (probs,) or softmax.op != "softmax"
                or fill.op != "weight" or not fill.attrs["value"].all_equal(0)
                or where.outputs[0] != graph.type_of(probs)):
            continue
        edit = edit or graph.edit()
        (guarded,) = edit.add("guarded_softmax", softmax.inputs, {"axis": softmax.attrs["axis"]},
                              name=softmax.name)
        edit.replace_uses(Value(nid, 0), guarded)
    return edit.finish() if edit is not None else graph


def _densify(sparse: onnx.SparseTensorProto) -> np.ndarray:
    dense = np.zeros(tuple(sparse.dims), dtype=helper.tensor_dtype_to_np_dtype(sparse.values.data_type))
    values = numpy_helper.to_array(sparse.values)
    idx = numpy_helper.to_array(sparse.indices)
    if idx.ndim == 1:
        dense.flat[idx] = values
    else:
        dense[tuple(idx.T)] = values
    return dense
