"""Export a Graph as a standard ONNX model.

Only ai.onnx ops are written (opaque nodes keep whatever domain they came with). Weight-only
subgraphs are evaluated once and written as initializers (TASO section 7.3), graph input and
output names and order are kept, the result passes `onnx.checker` with full checking, and
files are written atomically so a failure never leaves a partial model behind.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import AbstractSet, Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from graphsub.errors import ExportError
from graphsub.ir.graph import Graph, Value
from graphsub.tensors.onnx_types import value_info
from graphsub.tensors.symbolic import Dim, dim_text, is_static
from graphsub.tensors.types import TensorType
from graphsub.ops import get_op
from graphsub.onnx_io import external
from graphsub.ops.contexts import OpExportContext
from graphsub.ops.opaque import body_names
from graphsub.runtime.ort_sessions import DetachedModel, ModelData, make_model
from graphsub.runtime.reference import materialized_weights

#: The opset written for graphs that did not come from an ONNX file.
DEFAULT_OPSET = 17
MIN_OPSET, MAX_OPSET = 13, 23


class ExportContext(OpExportContext):
    """What an operator's export function writes into: nodes, constants and fresh names."""

    def __init__(self, opset: int, detach: bool = False) -> None:
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        #: The arrays of initializers held apart from the protobuf (when detaching weights).
        self.detached: dict[str, np.ndarray] | None = {} if detach else None
        self.domains: dict[str, int] = {}
        self._used: set[str] = set()
        self._const_names: dict[bytes, str] = {}
        #: size symbol -> (value name, axis) of a value already written with that dimension
        self._symbol_sources: dict[str, tuple[str, int]] = {}
        self._size_names: dict[Any, str] = {}  # size expression -> its 1-element tensor

    def reserve(self, name: str) -> str:
        if name in self._used:
            raise ExportError(f"value name {name!r} is used twice")
        self._used.add(name)
        return name

    def avoid(self, names: AbstractSet[str]) -> None:
        """Never give out `names` (they are assigned elsewhere in the model)."""
        self._used |= names

    def fresh(self, hint: str) -> str:
        base = "".join(c if c.isalnum() or c in "_./:" else "_" for c in hint) or "v"
        name, k = base, 1
        while name in self._used:
            name = f"{base}_{k}"
            k += 1
        self._used.add(name)
        return name

    def emit(self, op_type: str, inputs: Sequence[str], outputs: Sequence[str],
             **attrs: Any) -> None:
        domain = attrs.get("domain")
        if domain not in (None, "", "ai.onnx"):  # an operator of onnxruntime's, at version 1
            self.domains.setdefault(domain, 1)
        self.nodes.append(helper.make_node(op_type, list(inputs), list(outputs),
                                           name=self.fresh(f"{op_type}_n"), **attrs))

    def emit_proto(self, node: onnx.NodeProto, inputs: Sequence[str], outputs: Sequence[str],
                   opsets: Sequence[tuple[str, int]]) -> None:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        del copy.input[:]
        copy.input.extend(inputs)
        del copy.output[:]
        copy.output.extend(outputs)
        copy.name = self.fresh(node.name or f"{node.op_type}_n")
        for domain, version in opsets:
            if domain not in ("", "ai.onnx"):
                self.domains[domain] = version
        self.nodes.append(copy)

    def const(self, array: np.ndarray, hint: str = "const") -> str:
        """An initializer holding `array` (small constants are shared by content)."""
        arr = np.asarray(array)
        key = None
        if arr.size <= 64:
            key = arr.dtype.str.encode() + str(arr.shape).encode() + arr.tobytes()
            if key in self._const_names:
                return self._const_names[key]
        name = self.fresh(hint)
        self.add_initializer(name, arr)
        if key is not None:
            self._const_names[key] = name
        return name

    def add_initializer(self, name: str, array: np.ndarray) -> None:
        array = np.asarray(array, order="C")
        if self.detached is not None and array.nbytes >= external.MIN_EXTERNAL_TENSOR:
            self.detached[name] = array
            self.initializers.append(external.stub(name, array))
        else:
            self.initializers.append(numpy_helper.from_array(array, name))

    # -- sizes: size expressions written as computations of the shapes -----------------------
    def note_symbols(self, name: str, shape: Sequence[Dim]) -> None:
        """Remember the value `name` as where the size symbols among its dimensions can be
        read (the first such value, a graph input where there is one, wins)."""
        for axis, d in enumerate(shape):
            if not isinstance(d, int) and d.is_Symbol and d.name not in self._symbol_sources:
                self._symbol_sources[d.name] = (name, axis)

    def sizes(self, values: Sequence[Dim], out: str | None = None) -> str:
        """A 1-D int64 tensor of `values`: an initializer where they are numbers, else their
        computation from the shapes of values already written (into `out` when given)."""
        if is_static(values) and out is None:
            return self.const(np.array(values, dtype=np.int64))
        parts: list[str] = []
        run: list[int] = []
        for v in values:
            if type(v) is int:
                run.append(v)
                continue
            if run:
                parts.append(self.const(np.array(run, dtype=np.int64)))
                run = []
            parts.append(self.size(v))
        if run:
            parts.append(self.const(np.array(run, dtype=np.int64)))
        if len(parts) == 1 and out is None:
            return parts[0]
        out = out or self.fresh("sizes")
        # a Concat even of one part: onnxruntime's symbolic shape inference follows sizes
        # through Concat, not through Identity
        self.emit("Concat", parts, [out], axis=0)
        return out

    def size(self, expr: Dim) -> str:
        """A 1-element int64 tensor holding one size expression."""
        if type(expr) is int:
            return self.const(np.array([expr], dtype=np.int64))
        if expr in self._size_names:
            return self._size_names[expr]
        out = write_size(self, expr)
        self._size_names[expr] = out
        return out

    def symbol_size(self, name: str) -> str:
        """The 1-element tensor of a size symbol, read from the shape of a value written."""
        if name not in self._symbol_sources:
            raise ExportError(f"the size {name!r} is not a dimension of any value written "
                              "before its first use")
        value, axis = self._symbol_sources[name]
        shape = self.fresh(f"{value}_shape")
        self.emit("Shape", [value], [shape])
        out = self.fresh(name)
        self.emit("Gather", [shape, self.const(np.array([axis], dtype=np.int64))], [out],
                  axis=0)
        return out

    def reshape_target(self, in_shape: Sequence[Dim], target: Sequence[Dim]) -> str:
        """A Reshape's target: numbers where they are, ONNX's 0 (this dimension of the
        input) and -1 (what is left) where they say it, a computation of the shapes only
        where these cannot."""
        if is_static(target):
            return self.const(np.array(target, dtype=np.int64))
        written: list[Dim] = []
        open_axes = []
        for i, d in enumerate(target):
            if type(d) is int:
                written.append(d)
            elif i < len(in_shape) and in_shape[i] == d:
                written.append(0)
            else:
                written.append(d)
                open_axes.append(i)
        if len(open_axes) == 1 and all(type(d) is not int or d != 0 for d in target):
            written[open_axes[0]] = -1
        return self.sizes(written)

    def emit_sizes(self, values: Sequence[Dim], shape: Sequence[int], dtype: str,
                   out: str) -> None:
        """Write a `sizes` node's tensor (of `shape` and `dtype`) into `out`."""
        plain = tuple(shape) == (len(values),) and dtype == "int64"
        vector = self.sizes(values, out if plain else None)
        if plain:
            return
        if tuple(shape) != (len(values),):
            shaped = out if dtype == "int64" else self.fresh("sizes_shaped")
            if tuple(shape) == ():  # a scalar as exporters write one, which onnxruntime's
                # symbolic shape inference follows (it reads no sizes through Reshape)
                self.emit("Squeeze", [vector, self.const(np.array([0], dtype=np.int64))],
                          [shaped])
            else:
                self.emit("Reshape", [vector, self.const(np.array(shape, dtype=np.int64))],
                          [shaped])
            vector = shaped
        if dtype != "int64":
            self.emit("Cast", [vector], [out],
                      to=helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))


def _value_info(name: str, t: TensorType, declared: Sequence[Any] | None = None
                ) -> onnx.ValueInfoProto:
    """A value's declared type; a symbolic dimension is a dim_param: the name the original
    model declared there (`declared`), which downstream tools key on, else the expression
    (`batch`, `seq + 1`). An opaque value's is its own ONNX type."""
    if t.is_opaque:
        return value_info(name, t)
    dims: list[int | str] = []
    for i, d in enumerate(t.shape):
        if type(d) is int:
            dims.append(d)
        elif declared is not None and len(declared) == t.rank and isinstance(declared[i], str):
            dims.append(declared[i])
        else:
            dims.append(dim_text(d))
    return helper.make_tensor_value_info(
        name, helper.np_dtype_to_tensor_dtype(np.dtype(t.dtype)), dims)


def _input_value_info(graph: Graph, nid: int) -> onnx.ValueInfoProto:
    """An input's declared type: its type in the graph, or, where `facts.inputs_as_declared`
    says so, the open sizes the original model declared where the user fixed them: control
    flow that onnxruntime cannot type at fixed sizes (a branch squeezing a size of 1) must
    be written as the original was (the candidate is checked at the fixed sizes)."""
    name, t = graph[nid].attrs["name"], graph[nid].type
    declared = graph.facts.input_dims.get(name)
    if t.is_opaque or not graph.facts.inputs_as_declared or declared is None \
            or len(declared) != t.rank:
        return _value_info(name, t)
    fixed = [d if type(d) is int else dim_text(d) for d in t.shape]
    dims = [was if not isinstance(was, int) else d for was, d in zip(declared, fixed)]
    return helper.make_tensor_value_info(
        name, helper.np_dtype_to_tensor_dtype(np.dtype(t.dtype)), dims)


def check_onnx(model: onnx.ModelProto | bytes) -> None:
    """Run onnx.checker with full checking (shape inference included); raise ExportError.

    Shape inference's own failure inside the definition of an operator the model keeps as
    it was (ONNX 1.23 fails MeanVarianceNormalization-13's function body, a Constant it
    declares with value_ints: the operator test corpus's test_mvn) is no fault of the export:
    the model is then checked without inference, as the original would have to be."""
    try:
        onnx.checker.check_model(model, full_check=True)
    except onnx.shape_inference.InferenceError as exc:
        kept = _inference_error_in_kept_operator(model, str(exc))
        if kept is None:
            raise ExportError(f"the exported model does not pass the ONNX checker: {exc}") \
                from None
        try:
            onnx.checker.check_model(model, full_check=False)
        except onnx.checker.ValidationError as again:
            raise ExportError(f"the exported model does not pass the ONNX checker: {again}") \
                from None
    except onnx.checker.ValidationError as exc:
        raise ExportError(f"the exported model does not pass the ONNX checker: {exc}") from None
    except ValueError as exc:  # larger than protobuf's 2 GiB limit
        raise ExportError(f"cannot check the exported model: {exc}") from None


def _inference_error_in_kept_operator(model: onnx.ModelProto | bytes, message: str) -> str | None:
    """The op type shape inference failed inside, where every error it reports is in an
    operator of the default domain defined by a function (which the checker expands): such a
    failure is ONNX's, in a node graphsub wrote unchanged. None otherwise."""
    import re

    failed = set(re.findall(r"op_type:(\w+)", message))
    if not failed:
        return None
    proto = model if isinstance(model, onnx.ModelProto) else onnx.load_from_string(model)
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)
    outer = {n.op_type for n in proto.graph.node}
    for op in failed & outer:
        try:
            schema = onnx.defs.get_schema(op, opset or 1)
        except onnx.defs.SchemaError:
            return None
        # onnx's stub of OpSchema lacks these two properties
        if not schema.has_function and not schema.has_context_dependent_function:  # type: ignore[attr-defined]
            return None
    return next(iter(failed & outer), None)


def to_onnx(graph: Graph, opset: int | None = None, model_name: str = "graphsub",
            check: bool = True, avoid: Collection[str] = ()) -> onnx.ModelProto:
    """The graph as an ONNX ModelProto, checked by onnx.checker unless `check` is False.
    `avoid`: names no new value may take (those of the scopes around a control-flow body
    written as a model of its own)."""
    model, _ = _export(graph, opset, model_name, avoid, detach=False)
    if check:
        check_onnx(model)
    return model


def _export(graph: Graph, opset: int | None, model_name: str, avoid: Collection[str],
            detach: bool | None) -> tuple[onnx.ModelProto, dict[str, np.ndarray] | None]:
    """The model, and the arrays of the initializers held apart from it: where `detach`
    says so, or (None) where the graph's weights came from external data or exceed
    external.EXTERNAL_DATA_BYTES."""
    # An opaque node is written at the opset it was read at (a graph of one operator for
    # timing has no opset of its own: the default would lose Split's num_outputs, opset 18).
    opset = opset or graph.facts.opset or max(
        [DEFAULT_OPSET, *(v for node in graph.nodes.values() if node.op == "opaque"
                          for d, v in node.attrs["opsets"] if d in ("", "ai.onnx"))])
    kept = bool(graph.facts.opset_kept) and opset == graph.facts.opset
    if not (MIN_OPSET <= opset <= MAX_OPSET or kept):
        raise ExportError(f"cannot export at opset {opset}: graphsub writes opsets "
                          f"{MIN_OPSET} to {MAX_OPSET}")
    order = graph.topo_order()
    weight_only = graph.weight_only()

    # The weight-only values computation or outputs read directly become initializers.
    folded = materialized_weights(graph)
    if detach is None:
        detach = graph.facts.external_data or sum(
            int(a.nbytes) for a in folded.values()) > external.EXTERNAL_DATA_BYTES
    ctx = ExportContext(opset, detach)
    needed = {v.node for v in folded}

    names: dict[Value, str] = {}
    for nid in graph.inputs:
        names[Value(nid, 0)] = ctx.reserve(graph[nid].attrs["name"])
        ctx.note_symbols(names[Value(nid, 0)], graph[nid].type.shape)
    for out_name in graph.output_names:
        if out_name not in names.values():
            ctx.reserve(out_name)
    # The names assigned inside control-flow bodies stay theirs: ONNX assigns a name once
    # across a model and its subgraphs.
    for node in graph.nodes.values():
        if node.op == "opaque":
            ctx.avoid(body_names(node.attrs["onnx_node"]))
    ctx.avoid(set(avoid) - set(names.values()) - set(graph.output_names))
    # A computed value that is exactly one graph output takes the output's name directly.
    output_count: dict[Value, int] = {}
    for v in graph.outputs:
        output_count[v] = output_count.get(v, 0) + 1
    for v, name in zip(graph.outputs, graph.output_names):
        if (output_count[v] == 1 and v.node not in weight_only and graph[v.node].op != "input"
                and v not in names):
            names[v] = name

    for nid in order:
        if nid not in needed:
            continue
        node = graph[nid]
        for i in range(len(node.outputs)):
            v = Value(nid, i)
            names[v] = ctx.fresh(node.name or f"w{nid}" + (f"_{i}" if i else ""))
            ctx.add_initializer(names[v], folded[v])

    for nid in order:
        node = graph[nid]
        if node.op == "input" or nid in weight_only:
            continue
        outs = []
        for i in range(len(node.outputs)):
            v = Value(nid, i)
            if v not in names:
                names[v] = ctx.fresh(node.name if node.name and len(node.outputs) == 1
                                     else f"{node.op}_{nid}" + (f"_{i}" if i else ""))
            outs.append(names[v])
        ins = [names[v] for v in node.inputs]
        get_op(node.op).export(ctx, node.attrs, ins, outs, graph.input_types(nid))
        for name, t in zip(outs, node.outputs):
            if not t.is_static:
                ctx.note_symbols(name, t.shape)

    for v, name in zip(graph.outputs, graph.output_names):
        if names[v] != name:
            ctx.emit("Identity", [names[v]], [name])

    declared = graph.facts.output_dims
    onnx_graph = helper.make_graph(
        ctx.nodes, model_name,
        [_input_value_info(graph, i) for i in graph.inputs],
        [_value_info(name, graph.type_of(v), declared.get(name))
         for v, name in zip(graph.outputs, graph.output_names)],
        initializer=ctx.initializers)
    return make_model(onnx_graph, [("", opset), *sorted(ctx.domains.items())]), ctx.detached


def to_model_data(graph: Graph, opset: int | None = None, model_name: str = "graphsub",
                  external_data: bool | None = None) -> ModelData:
    """The checked ONNX model as onnxruntime gets it from graphsub: serialized, or, where
    `external_data` says so (None: where the graph's weights came from external data or are
    too large for one protobuf), detached from its large weights (which it shares with the
    graph: graphsub.onnx_io.external)."""
    model, detached = _export(graph, opset, model_name, (), external_data)
    try:
        data: bytes = model.SerializeToString()
    except ValueError as exc:
        raise ExportError(f"the model is too large for a single ONNX file ({exc}): write it "
                          "with external data") from None
    if detached is None:
        check_onnx(data)  # checked on the bytes: a large model is serialized once, not twice
        return data
    result = DetachedModel(data, external.spilled(detached))
    check_onnx(external.skeleton(result))
    return result


def to_onnx_bytes(graph: Graph, opset: int | None = None, model_name: str = "graphsub") -> bytes:
    """The serialized, checked ONNX model in one protobuf (weights included)."""
    data = to_model_data(graph, opset, model_name, external_data=False)
    assert isinstance(data, bytes)
    return data


def save(model: Graph | ModelData, path: str | os.PathLike[str], opset: int | None = None,
         external_data: bool | None = None) -> Path:
    """Write a model atomically to `path`, with its data file beside it where it has
    external data: a graph (exported: see `to_model_data`), or the ONNX model
    `optimize_model` returns (bytes, or a DetachedModel with its weights apart).
    `external_data=True` writes the large weights of either to a data file beside it (what
    `graphsub optimize --external-data` writes)."""
    if isinstance(model, Graph):
        model = to_model_data(model, opset, Path(path).stem, external_data)
    elif opset is not None:
        raise ExportError("opset applies to a graph being exported; this model is ONNX "
                          "already (convert it with onnx.version_converter)")
    elif external_data and isinstance(model, (bytes, bytearray)):
        model = external.detach(model)
    elif external_data is False and isinstance(model, DetachedModel):
        raise ExportError("this model's weights are kept in a data file beside it (it is "
                          "larger than one protobuf holds); save it with external_data left "
                          "unset")
    return external.write_model(model, path)


def write_size(ctx: ExportContext, expr: Any) -> str:
    """Emit the computation of one size expression (sums, products, floor and ceiling of
    quotients, minimum and maximum of size symbols and numbers) as int64 ONNX operators."""
    import sympy

    if expr.is_Integer:
        return ctx.const(np.array([int(expr)], dtype=np.int64))
    if expr.is_Symbol:
        return ctx.symbol_size(expr.name)
    if isinstance(expr, (sympy.floor, sympy.ceiling)):
        num, den = sympy.fraction(sympy.together(expr.args[0]))
        if not den.is_Integer or int(den) <= 0:
            raise ExportError(f"cannot write the size {expr} as integer arithmetic")
        if isinstance(expr, sympy.ceiling):
            num = num + den - 1
        out = ctx.fresh("size")
        ctx.emit("Div", [ctx.size(sympy.expand(num)), ctx.size(int(den))], [out])
        return out
    ops = {sympy.Add: "Add", sympy.Mul: "Mul", sympy.Min: "Min", sympy.Max: "Max"}
    for kind, op_type in ops.items():
        if isinstance(expr, kind):
            args = [ctx.size(a) for a in expr.args]
            out = args[0]
            for arg in args[1:]:
                nxt = ctx.fresh("size")
                ctx.emit(op_type, [out, arg], [nxt])
                out = nxt
            return out
    if isinstance(expr, sympy.Pow) and expr.exp.is_Integer and int(expr.exp) > 0:
        return ctx.size(sympy.Mul(*([expr.base] * int(expr.exp)), evaluate=False))
    if isinstance(expr, sympy.Mod):
        out = ctx.fresh("size")
        ctx.emit("Mod", [ctx.size(expr.args[0]), ctx.size(expr.args[1])], [out])
        return out
    raise ExportError(f"cannot write the size {expr} as ONNX operators")
