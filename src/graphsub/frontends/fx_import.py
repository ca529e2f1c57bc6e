"""ATen-level FX graphs into graphsub Graphs.

torch.compile hands graphsub an FX graph; `torch_compile` traces it to ATen operators (the
dispatcher's level: `aten.addmm`, `aten.convolution`, `aten.native_layer_norm`, ...), with
views functionalized into copies and every node's shape recorded. This module converts the
ATen nodes graphsub models into graphsub operators, with the ATen importers each operator
family registers beside its operators (`graphsub.ops.base.aten_importer`), and says which
nodes it can convert (`unsupported_reason`), so that the rest can stay in torch.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.fx as fx
from torch.fx.passes.shape_prop import TensorMetadata

from graphsub.targets.torch.arrays import to_numpy
from graphsub.errors import ConversionError
from graphsub.ir.builder import GraphBuilder
from graphsub.ir.facts import GraphFacts
from graphsub.ir.graph import Graph, Value
from graphsub.tensors.symbolic import (Dim, SymbolRange, ceildiv, dim, floordiv, size_symbol,
                                       symbols_in)
from graphsub.ops import aten_importers
from graphsub.ops.base import AtenCheckFn, AtenImportFn

aten = torch.ops.aten
#: dtypes graphsub converts (other tensors stay in torch).
_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
           torch.float64: "float64",
           torch.int64: "int64", torch.int32: "int32", torch.bool: "bool"}


def arguments(node: fx.Node) -> dict[str, Any]:
    """The node's arguments by schema name, defaults filled in."""
    # (an ATen node's target is an OpOverload, whose schema fx's union of targets does not
    # know; with torch absent, Any)
    schema = node.target._schema  # type: ignore[union-attr, unused-ignore]
    out: dict[str, Any] = {}
    for i, arg in enumerate(schema.arguments):
        if i < len(node.args):
            out[arg.name] = node.args[i]
        elif arg.name in node.kwargs:
            out[arg.name] = node.kwargs[arg.name]
        elif arg.has_default_value():
            out[arg.name] = arg.default_value
    return out


def tensor_meta(node: Any) -> Any:
    return node.meta.get("tensor_meta") if isinstance(node, fx.Node) else None


# ---- sizes traced with dynamic shapes ----------------------------------------------------
# Traced with dynamic shapes (`make_fx` under torch's symbolic shapes), a node's `val` is a
# fake tensor whose sizes are SymInts, and sizes flow between nodes as SymInt-valued nodes
# (`sym_size`, products of sizes). Their expressions (sympy, over torch's symbols s0, s1, ...)
# become graphsub size expressions over symbols of the same names.

def _from_torch_expr(expr: Any) -> Dim:
    """A graphsub size expression from a torch ShapeEnv expression."""
    import sympy

    if expr.is_Integer:
        return int(expr)
    if expr.is_Symbol:
        return size_symbol(expr.name)
    args = [_from_torch_expr(a) for a in expr.args]
    kind = type(expr).__name__
    if isinstance(expr, sympy.Add):
        return dim(sympy.Add(*args))
    if isinstance(expr, sympy.Mul):
        return dim(sympy.Mul(*args))
    if isinstance(expr, sympy.Pow) and expr.exp.is_Integer:
        return dim(args[0] ** int(expr.exp))
    if kind == "FloorDiv":
        return floordiv(*args)
    if kind == "CeilDiv" and isinstance(args[1], int):
        return ceildiv(args[0], args[1])
    if kind in ("Mod", "PythonMod"):
        return dim(sympy.Mod(*args))
    if kind in ("Min", "Max"):
        return dim(getattr(sympy, kind)(*args))
    raise ConversionError(f"size {expr} uses {kind}, which graphsub does not model")


def symbolic_size(value: Any) -> Dim | None:
    """A size as graphsub writes it: an int as it is, a SymInt as its expression (None for
    anything else)."""
    if isinstance(value, torch.SymInt):
        return _from_torch_expr(value.node.expr)
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def _sym_value(node: fx.Node) -> Any:
    """The SymInt a size-valued node computes (None: the node is not a size)."""
    value = node.meta.get("val")
    return value if isinstance(value, torch.SymInt) else None


def node_shape(node: Any) -> tuple[Dim, ...] | None:
    """A tensor node's shape: symbolic where it was traced with dynamic shapes."""
    if not isinstance(node, fx.Node):
        return None
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in val.shape):
        return tuple(symbolic_size(d) for d in val.shape)
    meta = tensor_meta(node)
    return None if meta is None else tuple(int(d) for d in meta.shape)


def _sizes_resolved(arg: Any) -> Any:
    """An argument with each size-valued node replaced by its size expression."""
    if isinstance(arg, fx.Node):
        value = _sym_value(arg)
        return arg if value is None else symbolic_size(value)
    if isinstance(arg, (list, tuple)):
        return type(arg)(_sizes_resolved(a) for a in arg)
    return arg


class AtenNode:
    """One FX node as the operators' ATen importers see it (graphsub.ops.base.AtenCall): a
    size computed from other sizes is given as its expression, like a number."""

    def __init__(self, node: fx.Node) -> None:
        self.node = node
        self.args = {k: _sizes_resolved(v) for k, v in arguments(node).items()}
        self.kwargs = dict(node.kwargs)

    def out_shape(self) -> tuple[Dim, ...]:
        shape = node_shape(self.node)
        assert shape is not None
        return shape

    def shape_of(self, arg: Any) -> tuple[Dim, ...] | None:
        return node_shape(arg)

    def device_of(self, arg: Any) -> str | None:
        if not isinstance(arg, fx.Node):
            return None
        val = arg.meta.get("val")
        if isinstance(val, torch.Tensor):
            return str(val.device)
        device = arg.meta.get("device")
        return None if device is None else str(device)


class Converter:
    """Builds one graphsub Graph from FX nodes (graphsub.ops.base.AtenBuilder): `value` gives
    the graphsub value of an FX argument (an already converted node, or a Python scalar as a
    0-d weight)."""

    def __init__(self) -> None:
        self.b = GraphBuilder()
        self.env: dict[fx.Node, Any] = {}

    def value(self, arg: Any, like: Value | None = None) -> Value:
        if isinstance(arg, fx.Node):
            v = self.env[arg]
            if not isinstance(v, Value):  # a tuple of values: read through getitem
                raise ConversionError(f"{arg.name} has several outputs")
            return v
        if isinstance(arg, (int, float, bool)):
            dtype = self.b.type_of(like).dtype if like is not None else "float32"
            return self.b.weight(np.array(arg, dtype=dtype))
        raise ConversionError(f"argument {arg!r} is not a tensor")

    def is_tensor(self, arg: Any) -> bool:
        return isinstance(arg, fx.Node)

    def op(self, name: str, *args: Value, **attrs: Any) -> Any:
        return self.b.op(name, *args, **attrs)

    def weight(self, array: np.ndarray) -> Value:
        return self.b.weight(array)

    def shape(self, v: Value) -> tuple[int, ...]:
        return self.b.type_of(v).shape

    def dtype(self, v: Value) -> str:
        return self.b.type_of(v).dtype

    def dtype_name(self, torch_dtype: Any) -> str | None:
        return _DTYPES.get(torch_dtype)


def _resolve(overload: str) -> Any:
    """torch.ops.aten's overload for "name.overload", None where this torch has none."""
    name, _, variant = overload.rpartition(".")
    packet = getattr(aten, name, None)
    return getattr(packet, variant, None) if packet is not None else None


#: ATen overload -> (importer, check), from the operators' registrations (graphsub.ops), for
#: the overloads this torch has.
CONVERTERS: dict[Any, tuple[AtenImportFn, AtenCheckFn]] = {
    target: entry for target, entry in
    ((_resolve(name), entry) for name, entry in aten_importers().items())
    if target is not None
}


# ---- which nodes, and the conversion of a whole graph -----------------------------------

def unsupported_reason(node: fx.Node) -> str | None:
    """None when the node can be converted, else why not."""
    if node.op != "call_function":
        return f"{node.op} nodes are not converted"
    if node.target is operator.getitem:
        source = node.args[0]
        if isinstance(source, fx.Node) and unsupported_reason(source) is None:
            return None
        return "an item of an unconverted node"
    entry = CONVERTERS.get(node.target)
    if entry is None:
        return f"{node.target} has no graphsub equivalent"
    for m in _metas(node):
        if m is not None and m.dtype not in _DTYPES:
            return f"dtype {m.dtype}"
    try:
        return entry[1](AtenNode(node))
    except (KeyError, TypeError, AttributeError) as exc:
        return f"unexpected arguments ({exc})"


def _metas(node: fx.Node) -> list[Any]:
    """The tensor metadata of each of the node's outputs that something reads (a fused
    attention kernel also returns random state in uint64, which nothing reads in inference)."""
    meta = tensor_meta(node)
    if meta is None:
        return []
    if isinstance(meta, TensorMetadata):
        return [meta]
    read = {user.args[1] for user in node.users if user.target is operator.getitem}
    return [m for i, m in enumerate(meta) if m is not None and i in read]


@dataclass(frozen=True)
class CausalMask:
    """A tensor proven to be a causal mask (frontends.fx_position_masks), as the importer
    reads it: its shape, graphsub dtype, and for an additive mask the value it adds above the
    diagonal (0.0 for a boolean one)."""

    shape: tuple[Dim, ...]
    dtype: str
    fill: float


class Converted(NamedTuple):
    """An FX graph as a graphsub Graph: the graph, the FX nodes of its inputs in order, and
    for each of its values the first FX node computing it (a placeholder for a weight made
    from a constant input), which is what splicing a rewrite back reads and replaces."""

    graph: Graph
    inputs: list[fx.Node]
    sources: dict[Value, fx.Node]


def convert_graph(graph: fx.Graph, constants: dict[fx.Node, torch.Tensor],
                  input_names: dict[fx.Node, str] | None = None,
                  masks: Mapping[fx.Node, CausalMask] | None = None) -> Converted:
    """A graphsub Graph computing the FX graph's outputs. Placeholders in `constants` become
    weights (parameters, buffers, folded constants); those in `masks` (proven causal masks:
    frontends.fx_position_masks) `causal_mask` operators reading their sizes from the
    inputs; the others become graph inputs, whose FX nodes are returned in the order of the
    graph's inputs. Raises ConversionError for a node it cannot convert."""
    c = Converter()
    inputs: list[fx.Node] = []
    sizes: list[fx.Node] = []
    masks = masks or {}
    pending = [n for n in graph.find_nodes(op="placeholder") if n in masks]
    for node in graph.nodes:
        if node.op != "placeholder":  # every input is known: placeholders come first
            for mask in pending:  # a mask no input gives the sizes of stays an input
                value = _causal_mask(c, mask, masks[mask], inputs)
                c.env[mask] = value if value is not None else c.b.input(
                    (input_names or {}).get(mask, mask.name), masks[mask].shape,
                    masks[mask].dtype)
                if value is None:
                    inputs.append(mask)
            pending = []
            value = _causal_mask(c, node, masks[node], inputs) if node in masks else None
            if value is not None:
                c.env[node] = value
                continue
        if node.op == "placeholder":
            if node in constants:
                c.env[node] = c.b.weight(to_numpy(constants[node]))
            elif node in masks:
                continue  # once every input is known: a mask reads its sizes from them
            elif _sym_value(node) is not None:
                sizes.append(node)  # its readers see its expression (AtenNode)
                continue
            else:
                meta = tensor_meta(node)
                if meta is None or meta.dtype not in _DTYPES:
                    raise ConversionError(f"input {node.name} is not a tensor graphsub models")
                name = (input_names or {}).get(node, node.name)
                shape = node_shape(node)
                assert shape is not None  # a node with tensor_meta has one
                c.env[node] = c.b.input(name, shape, _DTYPES[meta.dtype])
                inputs.append(node)
        elif node.op == "call_function":
            if node.target is operator.getitem:
                source = c.env[node.args[0]]
                item = source[node.args[1]]
                if item is None:
                    raise ConversionError(f"{node.name} reads an output graphsub does not model")
                c.env[node] = item
                continue
            reason = unsupported_reason(node)
            if reason is not None:
                raise ConversionError(f"{node.name}: {reason}")
            c.env[node] = CONVERTERS[node.target][0](c, AtenNode(node))
        elif node.op == "output":
            outs = node.args[0]
            outs = outs if isinstance(outs, (tuple, list)) else (outs,)
            for i, o in enumerate(outs):
                c.b.output(c.value(o), f"out{i}")
        else:
            raise ConversionError(f"{node.op} node {node.name}")
    inputs += _size_carriers(c, inputs, sizes)
    built = c.b.build(GraphFacts(symbols=symbol_ranges(graph)))
    merged = built.cse()
    return Converted(merged, inputs, _sources(c.env, built, merged))


def _causal_mask(c: Converter, node: fx.Node, mask: CausalMask,
                 inputs: Sequence[fx.Node]) -> Value | None:
    """A proven mask as a `causal_mask` reading each size symbol of its shape from an input
    that has it as a dimension (None where no input has one)."""
    sources: list[tuple[str, int, int]] = []
    reads: list[fx.Node] = []
    for name in sorted(symbols_in(mask.shape)):
        found = next(((n, axis) for n in inputs
                      for axis, d in enumerate(c.b.type_of(c.env[n]).shape)
                      if not isinstance(d, int) and d.is_Symbol and d.name == name), None)
        if found is None:
            return None
        if found[0] not in reads:
            reads.append(found[0])
        sources.append((name, reads.index(found[0]), found[1]))
    value: Value = c.b.causal_mask(*(c.env[n] for n in reads), shape=mask.shape,
                                   dtype=mask.dtype, fill=mask.fill, sources=tuple(sources))
    return value


def _sources(env: dict[fx.Node, Any], built: Graph, merged: Graph) -> dict[Value, fx.Node]:
    """Each value of `merged` (the converted graph after common subexpressions were merged)
    with the first FX node whose value it is: a node merged into another computed the same
    thing, which its digest says."""
    built_digests, merged_digests = built.node_digests(), merged.node_digests()
    canonical = {digest: nid for nid, digest in merged_digests.items()}
    out: dict[Value, fx.Node] = {}
    for node, value in env.items():
        if not isinstance(value, Value) or value.node not in built_digests:
            continue
        nid = canonical.get(built_digests[value.node])
        if nid is not None:
            out.setdefault(Value(nid, value.index), node)
    return out


#: The element type of a size carrier (SIZE_CARRIER_DTYPE[(n,)]: see `_size_carriers`).
SIZE_CARRIER_DTYPE = "uint8"


def _size_carriers(c: Converter, inputs: list[fx.Node], sizes: list[fx.Node]) -> list[fx.Node]:
    """A graph input for each size argument whose symbol no tensor input has as a dimension
    (a part slicing a constant table by the sequence length reads the length from nothing
    else): a tensor of SIZE_CARRIER_DTYPE whose one dimension is the size, which nothing
    reads but its shape, so that a program reads every symbol from its inputs' shapes. The
    caller hands it in as an empty tensor of that length; the FX nodes are returned in
    order."""
    carried = set().union(set(), *(symbols_in(c.b.type_of(c.env[n]).shape) for n in inputs))
    out = []
    for node in sizes:
        size = symbolic_size(_sym_value(node))
        assert size is not None  # a SymInt's expression
        if isinstance(size, int) or not size.is_Symbol or size.name in carried:
            continue
        # (its source: the size's node, whose value a splice hands in as a carrier too)
        c.env[node] = c.b.input(f"{node.name}_size", (size,), SIZE_CARRIER_DTYPE)
        carried.add(size.name)
        out.append(node)
    return out


def symbol_ranges(graph: fx.Graph) -> dict[str, SymbolRange]:
    """The range torch's shape environment gives each size symbol of the graph's inputs
    (torch.compile assumes a dynamic size is at least 2: a size of 1 gets a graph of its
    own)."""
    from graphsub.frontends.dynamic_trace import input_symbols, range_bound

    return {name: SymbolRange(max(1, range_bound(r.lower) or 1) if r is not None else 1,
                              range_bound(r.upper) if r is not None else None)
            for name, r in input_symbols(graph).items()}
