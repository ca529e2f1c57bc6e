"""Symbolic sizes at import: input dimensions the model leaves open, the shape computations
exporters write around them, and the types of nodes graphsub does not model.

An exporter that keeps a dynamic batch writes `Shape -> Gather -> Unsqueeze -> Concat ->
Reshape` chains where a static model has a constant target. graphsub evaluates such chains at
import over size expressions ("size values": small integer tensors whose elements are
`batch`, `seq * 4`, ...), exactly as it folds them over numbers for a static model, so that a
reshape's target becomes the attribute `(batch, seq, 4, 32)`. A size value that reaches an
operator that needs it as data (a `Range` of `seq` positions, a `ConstantOfShape`) becomes a
`sizes` node, computed from the shapes of the tensors that define its symbols.

The types of opaque nodes over symbolic inputs come from onnxruntime's symbolic shape
inference (`onnxruntime.tools.symbolic_shape_infer`, built on sympy as graphsub is), which
knows every ONNX operator's shape rules over expressions.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import onnx
from onnx import helper, numpy_helper

from graphsub.errors import MissingInputShapeError, ModelLoadError
from graphsub.ops.contexts import OpImportContext
from graphsub.tensors.symbolic import (Dim, SymbolRange, dim, equal, floordiv, is_negative,
                                  is_symbolic, parse_dim, size_symbol, symbol_name, symbols_in)
from graphsub.tensors.onnx_types import opaque_type, value_info
from graphsub.tensors.types import TensorType
from graphsub.tensors.values import Value



class SizeContext(OpImportContext, Protocol):
    """What folding sizes reads and writes of the import it works for (graphsub.onnx_io's
    `ImportContext` is one): besides what an operator's importer uses, the constants known so
    far (it adds the sizes it folds), the dtypes of size values, where each symbol is read."""

    constants: dict[str, np.ndarray]
    size_dtypes: dict[str, Any]

    def symbol_source(self, name: str) -> tuple[Value, int]: ...

_log = logging.getLogger(__name__)

#: The most elements a size value holds: shape vectors, not data.
_MAX_SIZE_VALUE = 64


def _shape_hint() -> str:
    return "give concrete sizes with --input-shape NAME=1x3x224x224 (or input_shapes={...})"


#: dim_params that name no size: each such dimension is a size of its own (Paddle2ONNX writes
#: an image's height and width both as "?", which are not equal).
ANONYMOUS_DIMS = frozenset({"?", "-1", "None", "none", "unk", "dynamic"})


def input_types(model: onnx.ModelProto, input_shapes: Mapping[str, Sequence[int]] | None
                ) -> list[tuple[str, TensorType]]:
    """The model's real inputs (not initializers) with their types. A dimension the model
    leaves open is a size symbol: its dim_param's name, or `<input>_<axis>` for one without a
    name (or written as -1), which is also written into `model` so that onnxruntime's shape
    inference uses the same names. `input_shapes` fixes inputs to concrete shapes."""
    g = model.graph
    inits = {i.name for i in g.initializer} | {i.values.name for i in g.sparse_initializer}
    shapes = dict(input_shapes or {})
    real = [i for i in g.input if i.name not in inits]
    unknown = set(shapes) - {i.name for i in real}
    if unknown:
        raise ModelLoadError(f"a shape was given for unknown input(s) "
                             f"{', '.join(repr(n) for n in sorted(unknown))}; the model's inputs "
                             f"are: {', '.join(repr(i.name) for i in real)}")
    result = []
    for inp in real:
        opaque = opaque_type(inp.type)
        if opaque is not None:  # a sequence, map, optional or strings: carried as it is
            if inp.name in shapes:
                raise ModelLoadError(f"input {inp.name!r} is {opaque}, not a tensor: it takes "
                                     f"no shape")
            result.append((inp.name, opaque))
            continue
        if not inp.type.tensor_type.elem_type:
            raise ModelLoadError(f"input {inp.name!r} declares no element type")
        tt = inp.type.tensor_type
        dtype = str(helper.tensor_dtype_to_np_dtype(tt.elem_type))
        if inp.name in shapes:
            given = tuple(int(d) for d in shapes[inp.name])
            if tt.HasField("shape") and (len(tt.shape.dim) != len(given) or any(
                    d.HasField("dim_value") and d.dim_value >= 0 and d.dim_value != g_
                    for d, g_ in zip(tt.shape.dim, given))):
                declared = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                                 for d in tt.shape.dim)
                raise ModelLoadError(f"input {inp.name!r}: the given shape {given} does not "
                                     f"fit the model's {declared}")
            result.append((inp.name, TensorType(given, dtype)))
            continue
        if not tt.HasField("shape"):
            raise MissingInputShapeError(f"input {inp.name!r} has no shape, not even a rank; "
                                         f"{_shape_hint()}")
        dims: list[Dim] = []
        for axis, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value") and d.dim_value >= 0:
                dims.append(d.dim_value)
                continue
            named = d.dim_param and d.dim_param not in ANONYMOUS_DIMS
            name = symbol_name(d.dim_param) if named else symbol_name(f"{inp.name}_{axis}")
            d.Clear()
            d.dim_param = name
            dims.append(size_symbol(name))
        result.append((inp.name, TensorType(tuple(dims), dtype)))
    return result


def symbolic_inference(model: onnx.ModelProto, merge: bool) -> onnx.ModelProto:
    """onnxruntime's symbolic shape inference of `model`, with the types of every value it
    could infer: its `infer_shapes` raises when any value stays untyped, after writing the
    model into the current folder (`sym_shape_infer_temp.onnx` and an external data file, in
    the user's folder); its steps run here keep what it found and write nothing."""
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    inference = SymbolicShapeInference(2**31 - 1, merge, merge, 0)
    inference._preprocess(model)
    while inference.run_:
        inference._infer_impl()
    inference._update_output_from_vi()
    inferred: onnx.ModelProto = inference.out_mp_
    return inferred


def inferred_types(model: onnx.ModelProto) -> dict[str, TensorType]:
    """The types onnxruntime's symbolic shape inference gives every value of the model (its
    inputs named as `input_types` left them). A value it cannot type is left out; an
    inference that fails altogether leaves all out, and the nodes that needed a type are then
    refused by name."""
    try:
        inferred = symbolic_inference(model, merge=True)
    except Exception as exc:  # the tool raises many kinds (its own asserts included)
        _log.warning("onnxruntime's symbolic shape inference failed on this model (%s: %s); "
                     "nodes graphsub does not model get no symbolic types", type(exc).__name__,
                     exc)
        return {}
    types: dict[str, TensorType] = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
        t = _parse_type(vi.type)
        if t is not None:
            types[vi.name] = t
    return types


def node_types(node: onnx.NodeProto, in_types: Mapping[str, TensorType],
               constants: Mapping[str, np.ndarray], opsets: Sequence[tuple[str, int]]
               ) -> list[TensorType] | None:
    """One node's output types over symbolic sizes, from onnxruntime's symbolic inference of
    that node alone: where its inference of the whole model fails (its own asserts on nodes
    far from this one), the one node usually goes through. Each size expression of the
    inputs stands in as a placeholder symbol, put back in the outputs; an output over a size
    the inputs do not define is not typed (None)."""
    placeholders: dict[Any, str] = {}

    def written(t: TensorType) -> list[int | str]:
        return [d if type(d) is int else placeholders.setdefault(d, f"gsdim{len(placeholders)}")
                for d in t.shape]

    inputs = [value_info(n, t, None if t.is_opaque else written(t))
              for n, t in in_types.items() if n not in constants]
    inits = [numpy_helper.from_array(np.asarray(constants[n]), n) for n in in_types
             if n in constants]
    outs = [helper.make_empty_tensor_value_info(o) for o in node.output if o]
    graph = helper.make_graph([node], "one", inputs, outs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    try:
        inferred = symbolic_inference(model, merge=False)
    except Exception:  # the tool raises many kinds (its own asserts included)
        return None
    back = {size_symbol(name): expr for expr, name in placeholders.items()}
    by_name = {vi.name: vi for vi in inferred.graph.output}
    types = []
    for o in (o for o in node.output if o):
        t = _parse_type(by_name[o].type) if o in by_name else None
        if t is None:
            return None
        shape = tuple(d if isinstance(d, int) else d.xreplace(back) for d in t.shape)
        if not symbols_in(shape) <= symbols_in(placeholders):
            return None
        types.append(TensorType(shape, t.dtype))
    return types


def declared_dims(type_proto: onnx.TypeProto) -> tuple[int | str | None, ...] | None:
    """The dimensions a value's declared type writes (numbers, dim_param names, None where
    neither), for writing a graph output back with the names its model gave it."""
    if not type_proto.HasField("tensor_type") or not type_proto.tensor_type.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                 for d in type_proto.tensor_type.shape.dim)


def declared_type(type_proto: onnx.TypeProto) -> TensorType | None:
    """A value's type as its model declares it, when every dimension is given (a number or a
    named size); None otherwise."""
    return _parse_type(type_proto)


def _parse_type(type_proto: onnx.TypeProto) -> TensorType | None:
    if not type_proto.HasField("tensor_type") or not type_proto.tensor_type.elem_type:
        return None
    tt = type_proto.tensor_type
    if not tt.HasField("shape"):
        return None
    dims: list[Dim] = []
    for d in tt.shape.dim:
        if d.HasField("dim_value") and d.dim_value >= 0:
            dims.append(d.dim_value)
        elif d.dim_param:
            try:
                dims.append(parse_dim(d.dim_param))
            except Exception:  # sympy's parser raises many kinds
                dims.append(size_symbol(symbol_name(d.dim_param)))
        else:
            return None
    try:
        return TensorType(tuple(dims), str(helper.tensor_dtype_to_np_dtype(tt.elem_type)))
    except ValueError:
        return None


# ---- size values ------------------------------------------------------------------------------

def as_size_value(array: np.ndarray) -> np.ndarray:
    """An integer constant as a size value (an object array of Python ints)."""
    return np.array([int(v) for v in array.reshape(-1)], dtype=object).reshape(array.shape)


def _int_div(a: Dim, b: Dim) -> Dim:
    if type(a) is int and type(b) is int:
        if b == 0:
            raise ZeroDivisionError
        q = abs(a) // abs(b)  # ONNX integer division truncates toward zero
        return q if (a >= 0) == (b >= 0) else -q
    if is_negative(a) is not False or is_negative(b) is not False:
        raise ArithmeticError("the sign of a symbolic quotient is unknown")
    return floordiv(a, b)


def _compare(decide: Callable[[Dim, Dim], bool | None]) -> Callable[[Dim, Dim], bool]:
    def compare(a: Dim, b: Dim) -> bool:
        result = decide(a, b)
        if result is None:
            raise ArithmeticError("the comparison depends on the sizes")
        return result
    return compare


def _max(a: Dim, b: Dim) -> Dim:
    if equal(a, b) is True:
        return a
    diff = is_negative(dim(a - b)) if is_symbolic(a) or is_symbolic(b) else a < b
    if diff is None:
        raise ArithmeticError("the larger size depends on the sizes")
    return b if diff else a


def _min(a: Dim, b: Dim) -> Dim:
    larger = _max(a, b)
    return b if larger is a else a


_BINARY: dict[str, Callable[[Dim, Dim], Any]] = {
    "Add": operator.add, "Sub": operator.sub, "Mul": operator.mul, "Div": _int_div,
    "Max": _max, "Min": _min, "Equal": _compare(equal),
}


class SizeFolder:
    """Evaluates the shape computations of one import over size values."""

    def __init__(self, ctx: SizeContext) -> None:
        self.ctx = ctx
        self.values: dict[str, np.ndarray] = {}  # name -> object array of Dim (or bool)

    def known(self, name: str) -> np.ndarray | None:
        """A size value by name: one computed here, or an integer or boolean constant."""
        if name in self.values:
            return self.values[name]
        c = self.ctx.constants.get(name)
        if c is not None and c.size <= _MAX_SIZE_VALUE and (
                np.issubdtype(c.dtype, np.integer) or c.dtype == bool):
            return as_size_value(c) if c.dtype != bool else c.astype(object)
        return None

    def sizes_of(self, name: str) -> tuple[Dim, ...] | None:
        v = self.known(name)
        return None if v is None else tuple(dim(x) for x in v.reshape(-1))

    def fold(self, node: onnx.NodeProto, in_types: Mapping[str, TensorType]) -> bool:
        """Evaluate `node` over size values; True when its outputs are now size values (or
        constants, where no symbol is left in them)."""
        try:
            result = self._evaluate(node, in_types)
        except (ArithmeticError, ValueError, IndexError, TypeError, ZeroDivisionError):
            return False
        if result is None:
            return False
        result = np.asarray(result, dtype=object)
        if result.size > _MAX_SIZE_VALUE:
            return False
        out = node.output[0]
        if not any(is_symbolic(v) for v in result.reshape(-1)):
            dtype = self._out_dtype(node, result)
            self.ctx.constants[out] = np.array(result.tolist(), dtype=dtype).reshape(result.shape)
        else:
            self.values[out] = result
            self.ctx.size_dtypes[out] = self._out_dtype(node, result)
        return True

    def _out_dtype(self, node: onnx.NodeProto, result: np.ndarray) -> Any:
        op = node.op_type
        if op == "Cast":
            return helper.tensor_dtype_to_np_dtype(self.ctx.attr(node, "to"))
        if op == "Equal":
            return np.bool_
        if op in ("Shape", "Size"):
            return np.int64
        source = node.input[1] if op == "Where" else node.input[0]
        if source in self.ctx.size_dtypes:
            return self.ctx.size_dtypes[source]
        c = self.ctx.constants.get(source)
        return c.dtype if c is not None else np.int64

    def _evaluate(self, node: onnx.NodeProto, in_types: Mapping[str, TensorType]
                  ) -> np.ndarray | None:
        op, ctx = node.op_type, self.ctx
        if op == "Shape" and node.input[0] in self.values:  # the shape of a size value
            start, end = ctx.attr(node, "start", 0), ctx.attr(node, "end", None)
            return np.array(list(self.values[node.input[0]].shape[start:end]), dtype=object)
        if op == "Shape":
            t = in_types.get(node.input[0])
            if t is None or t.is_static:
                return None
            start, end = ctx.attr(node, "start", 0), ctx.attr(node, "end", None)
            return np.array(list(t.shape[start:end]), dtype=object)
        if op == "Size":
            t = in_types.get(node.input[0])
            return None if t is None or t.is_static else np.array(t.numel, dtype=object)
        ins = [self.known(n) if n else None for n in node.input]
        if not node.input or ins[0] is None or not any(n in self.values for n in node.input):
            return None  # nothing symbolic in it: the numeric folding handles it
        x = ins[0]
        if op in ("Identity", "Cast"):
            if op == "Cast" and not np.issubdtype(
                    helper.tensor_dtype_to_np_dtype(ctx.attr(node, "to")), np.integer):
                return None
            return x
        if op == "Gather":
            if ins[1] is None or any(is_symbolic(i) for i in ins[1].reshape(-1)):
                return None
            idx = np.array(ins[1].tolist(), dtype=np.int64)
            return np.take(x, idx, axis=ctx.attr(node, "axis", 0))
        if op in ("Unsqueeze", "Squeeze"):
            given = ins[1] if len(ins) > 1 else None
            axes = ctx.attr(node, "axes", None) if given is None else tuple(int(a) for a in given)
            if op == "Unsqueeze":
                return np.expand_dims(x, tuple(axes))
            return np.squeeze(x, axis=None if axes is None else tuple(axes))
        if op == "Concat":
            parts = [v for v in ins if v is not None]
            if len(parts) < len(ins):
                return None
            return np.concatenate(parts, axis=ctx.attr(node, "axis"))
        if op == "Reshape":
            target = ins[1]
            if target is None or any(is_symbolic(v) for v in target.reshape(-1)):
                return None
            return x.reshape([int(v) for v in target.reshape(-1)])
        if op == "Slice":
            return self._slice(x, ins[1:])
        if op in _BINARY:
            if len(ins) != 2 or ins[1] is None:
                return None
            # an object array (the ufunc gives a bare object for 0-d operands)
            return np.asarray(np.frompyfunc(_BINARY[op], 2, 1)(x, ins[1]), dtype=object)
        if op == "Where":
            parts = [v for v in ins if v is not None]
            if len(parts) < len(ins):
                return None
            cond = parts[0]
            if any(not isinstance(c, (bool, np.bool_)) for c in cond.reshape(-1)):
                return None
            return np.where(cond.astype(bool), parts[1], parts[2])
        if op == "Expand":
            target = ins[1]
            if target is None or any(is_symbolic(v) for v in target.reshape(-1)):
                return None
            return np.broadcast_to(x, [int(v) for v in target.reshape(-1)]).copy()
        return None

    @staticmethod
    def _slice(x: np.ndarray, bounds: list[np.ndarray | None]) -> np.ndarray | None:
        if x.ndim != 1 or not bounds or any(b is None for b in bounds[:2]):
            return None
        parts = [None if b is None else [int(v) for v in b.reshape(-1)] for b in bounds]
        if any(p is not None and len(p) != 1 for p in parts):
            return None
        first, last = parts[0], parts[1]
        if first is None or last is None:
            return None
        start, end = first[0], last[0]
        step = parts[3][0] if len(parts) > 3 and parts[3] is not None else 1
        if len(parts) > 2 and parts[2] is not None and parts[2][0] not in (0, -1):
            return None
        return x[slice(start, end, step)]


def materialize(ctx: SizeContext, values: np.ndarray, dtype: Any) -> Any:
    """A `sizes` node computing a size value at run time from the tensors that define its
    symbols."""
    flat = tuple(dim(v) for v in values.reshape(-1))
    names = sorted(symbols_in(flat))
    sources, inputs = [], []
    for name in names:
        value, axis = ctx.symbol_source(name)
        if value not in inputs:
            inputs.append(value)
        sources.append((name, inputs.index(value), axis))
    return ctx.add("sizes", inputs, values=flat, shape=tuple(values.shape),
                   dtype=str(np.dtype(dtype)), sources=tuple(sources))[0]


def bound_by_slice(ranges: dict[str, SymbolRange], shape: Sequence[Dim],
                   starts: Sequence[Dim], ends: Sequence[Dim], axes: Sequence[int] | None
                   ) -> None:
    """Record the sizes for which a slice stays inside its dimension: by a size symbol
    inside a fixed dimension (`table[:seq]` of a 512-row table needs `seq <= 512`), by a
    number inside a symbolic one (`x[4:5]` needs `seq >= 5`). The slice is imported as if it
    always does, and verification keeps to that range."""
    for i, (s, e) in enumerate(zip(starts, ends)):
        axis = axes[i] if axes is not None else i
        n = shape[axis if axis >= 0 else axis + len(shape)]
        for bound in (s, e):
            if not is_symbolic(n) and is_symbolic(bound) and bound.is_Symbol:
                name = bound.name  # table[:seq] needs seq <= rows
                ranges[name] = ranges.get(name, SymbolRange()).narrowed(high=int(n))
            elif is_symbolic(n) and type(bound) is int and 0 < bound < 2 ** 31:
                offset = n - sum(n.free_symbols)  # x[4:5] of seq + c rows needs seq >= 5 - c
                if len(n.free_symbols) == 1 and offset.is_Integer:
                    name = next(iter(n.free_symbols)).name
                    ranges[name] = ranges.get(name, SymbolRange()).narrowed(
                        low=bound - int(offset))
