"""ATen-level FX graphs into graphsub Graphs.

torch.compile hands graphsub an FX graph; `torch_compile` traces it to ATen operators (the
dispatcher's level: `aten.addmm`, `aten.convolution`, `aten.native_layer_norm`, ...), with
views functionalized into copies and every node's shape recorded. This module converts the
ATen nodes graphsub models into graphsub operators, one converter per ATen operator, and
says which nodes it can convert (`supported`), so that the rest can stay in torch.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.fx as fx
from torch.fx.passes.shape_prop import TensorMetadata

from graphsub.errors import GraphsubError
from graphsub.ir.builder import GraphBuilder
from graphsub.ir.graph import Graph, Value

aten = torch.ops.aten
#: dtypes graphsub converts (other tensors stay in torch).
_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.float64: "float64",
           torch.int64: "int64", torch.int32: "int32", torch.bool: "bool"}


class ConversionError(GraphsubError):
    """An FX node cannot be expressed with graphsub's operators."""


def arguments(node: fx.Node) -> dict[str, Any]:
    """The node's arguments by schema name, defaults filled in."""
    schema = node.target._schema  # type: ignore[union-attr]
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


class Converter:
    """Builds one graphsub Graph from FX nodes: `value` gives the graphsub value of an FX
    argument (an already converted node, or a Python scalar as a 0-d weight)."""

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

    def op(self, name: str, *args: Value, **attrs: Any) -> Any:
        return self.b.op(name, *args, **attrs)

    def shape(self, v: Value) -> tuple[int, ...]:
        return self.b.type_of(v).shape


ConvertFn = Callable[[Converter, fx.Node, dict[str, Any]], Any]
#: ATen overload -> (converter, check). A check returns a reason the node cannot be
#: converted, or None.
CONVERTERS: dict[Any, tuple[ConvertFn, Callable[[fx.Node, dict[str, Any]], str | None]]] = {}


def _no_check(node: fx.Node, args: dict[str, Any]) -> str | None:
    return None


def converts(*targets: Any, check: Callable[[fx.Node, dict[str, Any]], str | None] = _no_check):
    def deco(fn: ConvertFn) -> ConvertFn:
        for t in targets:
            if t is not None:
                CONVERTERS[t] = (fn, check)
        return fn

    return deco


def _overload(packet: Any, name: str = "default") -> Any:
    return getattr(packet, name, None) if packet is not None else None


# ---- element-wise --------------------------------------------------------------------------

def _unary(ours: str) -> ConvertFn:
    return lambda c, node, a: c.op(ours, c.value(a["self"]))


for _name in ("relu", "sigmoid", "tanh", "exp", "log", "sqrt", "neg", "erf", "reciprocal"):
    converts(_overload(getattr(aten, _name)))(_unary(_name))


@converts(aten.rsqrt.default)
def _rsqrt(c: Converter, node: fx.Node, a: dict[str, Any]) -> Any:
    return c.op("reciprocal", c.op("sqrt", c.value(a["self"])))


@converts(aten.silu.default)
def _silu(c: Converter, node: fx.Node, a: dict[str, Any]) -> Any:
    x = c.value(a["self"])
    return c.op("mul", x, c.op("sigmoid", x))


@converts(aten.gelu.default)
def _gelu(c: Converter, node: fx.Node, a: dict[str, Any]) -> Any:
    return c.op("gelu", c.value(a["self"]), approximate=a.get("approximate", "none"))


@converts(aten.leaky_relu.default)
def _leaky(c: Converter, node: fx.Node, a: dict[str, Any]) -> Any:
    return c.op("leaky_relu", c.value(a["self"]), alpha=float(a.get("negative_slope", 0.01)))


@converts(aten.hardtanh.default, aten.clamp.default)
def _clip(c: Converter, node: fx.Node, a: dict[str, Any]) -> Any:
    lo = a.get("min_val", a.get("min"))
    hi = a.get("max_val", a.get("max"))
    return c.op("clip", c.value(a["self"]), min=lo, max=hi)


def _scalar_alpha(node: fx.Node, a: dict[str, Any]) -> str | None:
    return None if a.get("alpha", 1) == 1 else "alpha != 1"


def _binary(ours: str) -> ConvertFn:
    def convert(c: Converter, node: fx.Node, a: dict[str, Any]) -> Any:
        x = a["self"]
        other = a["other"]
        if not isinstance(x, fx.Node):  # scalar first (rsub and friends are not here)
            raise ConversionError("scalar left operand")
        xv = c.value(x)
        if not isinstance(other, fx.Node) and ours == "mul":
            return c.op("smul", xv, c.value(other, like=xv))
        return c.op(ours, xv, c.value(other, like=xv))

    return convert


for _name, _ours in (("add", "add"), ("sub", "sub"), ("mul", "mul"), ("div", "div")):
    _packet = getattr(aten, _name)
    converts(_overload(_packet, "Tensor"), _overload(_packet, "Scalar"),
             check=_scalar_alpha if _name in ("add", "sub") else _no_check)(_binary(_ours))


@converts(aten.pow.Tensor_Scalar)
def _pow(c: Converter, node: fx.Node, a: dict[str, Any]) -> Any:
    x = c.value(a["self"])
    return c.op("pow", x, c.value(a["exponent"], like=x))


# ---- linear algebra and convolution ------------------------------------------------------

@converts(aten.mm.default, aten.bmm.default, aten.matmul.default)
def _mm(c: Converter, node: fx.Node, a: dict[str, Any]) -> Any:
    return c.op("matmul", c.value(a["self"]), c.value(a.get("mat2", a.get("other"))))


def _addmm_check(node: fx.Node, a: dict[str, Any]) -> str | None:
    return None if a.get("beta", 1) == 1 and a.get("alpha", 1) == 1 else "beta/alpha != 1"


@converts(aten.addmm.default, check=_addmm_check)
def _addmm(c: Converter, node: fx.Node, a: dict[str, Any]) -> Any:
    y = c.op("matmul", c.value(a["mat1"]), c.value(a["mat2"]))
    return c.op("add", y, c.value(a["self"]))


def _conv_check(node: fx.Node, a: dict[str, Any]) -> str | None:
    if a["transposed"] or len(a["stride"]) != 2:
        return "only 2-D, non-transposed convolutions are modelled"
    return None


@converts(aten.convolution.default, check=_conv_check)
def _convolution(c: Converter, node: fx.Node, a: dict[str, Any]) -> Any:
    x, w = c.value(a["input"]), c.value(a["weight"])
    if c.shape(x)[1] != a["groups"] * c.shape(w)[1]:
        raise ConversionError("group count does not match the shapes")
    ph, pw = a["padding"]
    args = [x, w] + ([c.value(a["bias"])] if a["bias"] is not None else [])
    return c.op("conv2d", *args, stride=tuple(a["stride"]), dilation=tuple(a["dilation"]),
                padding=(ph, pw, ph, pw))


# ---- normalization, softmax, pooling, reductions ---------------------------------------

@converts(aten._softmax.default)
def _softmax(c: Converter, node: fx.Node, a: dict[str, Any]) -> Any:
    return c.op("softmax", c.value(a["self"]), axis=a["dim"])


@converts(_overload(aten.softmax, "int"))
def _softmax_int(c: Converter, node: fx.Node, a: dict[str, Any]) -> Any:
    if a.get("dtype") is not None:
        raise ConversionError("softmax with a dtype")
    return c.op("softmax", c.value(a["self"]), axis=a["dim"])


def _ones(c: Converter, shape: Sequence[int], fill: float, like: Value) -> Value:
    return c.b.weight(np.full(tuple(shape), fill, dtype=c.b.type_of(like).dtype))


@converts(aten.native_layer_norm.default)
def _layer_norm(c: Converter, node: fx.Node, a: dict[str, Any]) -> Any:
    x = c.value(a["input"])
    shape = tuple(a["normalized_shape"])
    w = c.value(a["weight"]) if a["weight"] is not None else _ones(c, shape, 1.0, x)
    args = [x, w] + ([c.value(a["bias"])] if a["bias"] is not None else [])
    y = c.op("layer_norm", *args, axis=-len(shape), epsilon=float(a["eps"]))
    return (y, None, None)  # mean and inverse std are not modelled


def _bn_check(node: fx.Node, a: dict[str, Any]) -> str | None:
    return "training-mode batch norm" if a.get("training") else None


@converts(aten.native_batch_norm.default, aten._native_batch_norm_legit_no_training.default,
          check=_bn_check)
def _batch_norm(c: Converter, node: fx.Node, a: dict[str, Any]) -> Any:
    x = c.value(a["input"])
    channels = (c.shape(x)[1],)
    w = c.value(a["weight"]) if a["weight"] is not None else _ones(c, channels, 1.0, x)
    bias = c.value(a["bias"]) if a["bias"] is not None else _ones(c, channels, 0.0, x)
    y = c.op("batch_norm", x, w, bias, c.value(a["running_mean"]), c.value(a["running_var"]),
             epsilon=float(a["eps"]))
    return (y, None, None)


def _pool_check(node: fx.Node, a: dict[str, Any]) -> str | None:
    if any(d != 1 for d in a.get("dilation", [1, 1])) or a.get("ceil_mode"):
        return "dilated or ceil-mode pooling"
    if a.get("divisor_override") is not None:
        return "pooling with a divisor override"
    return None


def _pair(v: Sequence[int] | int) -> tuple[int, int]:
    v = list(v) if not isinstance(v, int) else [v]
    return (v[0], v[-1])


def _pool_attrs(a: dict[str, Any]) -> dict[str, Any]:
    kernel = _pair(a["kernel_size"])
    stride = _pair(a["stride"]) if a.get("stride") else kernel
    ph, pw = _pair(a.get("padding", 0) or 0)
    return dict(kernel=kernel, stride=stride, padding=(ph, pw, ph, pw))


@converts(aten.max_pool2d_with_indices.default, check=_pool_check)
def _max_pool_indices(c: Converter, node: fx.Node, a: dict[str, Any]) -> Any:
    return (c.op("max_pool2d", c.value(a["self"]), **_pool_attrs(a)), None)


@converts(aten.max_pool2d.default, check=_pool_check)
def _max_pool(c: Converter, node: fx.Node, a: dict[str, Any]) -> Any:
    return c.op("max_pool2d", c.value(a["self"]), **_pool_attrs(a))


@converts(aten.avg_pool2d.default, check=_pool_check)
def _avg_pool(c: Converter, node: fx.Node, a: dict[str, Any]) -> Any:
    return c.op("avg_pool2d", c.value(a["self"]), count_include_pad=bool(a["count_include_pad"]),
                **_pool_attrs(a))


def _adaptive_check(node: fx.Node, a: dict[str, Any]) -> str | None:
    return None if list(a["output_size"]) == [1, 1] else "adaptive pooling to more than 1x1"


@converts(aten._adaptive_avg_pool2d.default, aten.adaptive_avg_pool2d.default,
          check=_adaptive_check)
def _adaptive(c: Converter, node: fx.Node, a: dict[str, Any]) -> Any:
    return c.op("global_avg_pool", c.value(a["self"]))


def _reduce(ours: str) -> ConvertFn:
    def convert(c: Converter, node: fx.Node, a: dict[str, Any]) -> Any:
        if a.get("dtype") is not None:
            raise ConversionError("reduction with a dtype")
        dims = a.get("dim")
        axes = None if dims is None or (isinstance(dims, (list, tuple)) and not dims) else (
            [dims] if isinstance(dims, int) else list(dims))
        return c.op(ours, c.value(a["self"]), axes=axes, keepdims=bool(a.get("keepdim", False)))

    return convert


converts(_overload(aten.mean, "dim"))(_reduce("reduce_mean"))
converts(_overload(aten.sum, "dim_IntList"))(_reduce("reduce_sum"))
converts(aten.amax.default)(_reduce("reduce_max"))


# ---- data movement --------------------------------------------------------------------------

def _out_shape(node: fx.Node) -> tuple[int, ...]:
    return tuple(int(d) for d in tensor_meta(node).shape)


def _same_numel(node: fx.Node, a: dict[str, Any]) -> str | None:
    """A view or expand that keeps the element count is a reshape; one that broadcasts is not."""
    source = tensor_meta(a["self"])
    if source is None or math.prod(source.shape) != math.prod(_out_shape(node)):
        return "an expand that broadcasts"
    return None


@converts(aten.view.default, _overload(aten.view_copy), aten._unsafe_view.default,
          aten.reshape.default, _overload(aten.squeeze_copy, "dim"),
          _overload(aten.squeeze_copy, "dims"), _overload(aten.unsqueeze_copy),
          aten.squeeze.dim, aten.unsqueeze.default, aten.flatten.using_ints,
          _overload(aten.expand_copy), aten.expand.default, check=_same_numel)
def _reshape(c: Converter, node: fx.Node, a: dict[str, Any]) -> Any:
    return c.op("reshape", c.value(a["self"]), shape=_out_shape(node))


@converts(aten.t.default, _overload(aten.t_copy))
def _t(c: Converter, node: fx.Node, a: dict[str, Any]) -> Any:
    x = c.value(a["self"])
    return x if len(c.shape(x)) < 2 else c.op("transpose", x, perm=(1, 0))


@converts(aten.permute.default, _overload(aten.permute_copy))
def _permute(c: Converter, node: fx.Node, a: dict[str, Any]) -> Any:
    return c.op("transpose", c.value(a["self"]), perm=tuple(a["dims"]))


@converts(_overload(aten.transpose, "int"), _overload(aten.transpose_copy, "int"))
def _transpose(c: Converter, node: fx.Node, a: dict[str, Any]) -> Any:
    x = c.value(a["self"])
    rank = len(c.shape(x))
    perm = list(range(rank))
    d0, d1 = a["dim0"] % rank, a["dim1"] % rank
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return c.op("transpose", x, perm=tuple(perm))


@converts(aten.cat.default)
def _cat(c: Converter, node: fx.Node, a: dict[str, Any]) -> Any:
    return c.op("concat", *(c.value(t) for t in a["tensors"]), axis=a.get("dim", 0))


@converts(_overload(aten.split, "Tensor"), _overload(aten.split_copy, "Tensor"),
          aten.split_with_sizes.default, _overload(aten.split_with_sizes_copy))
def _split(c: Converter, node: fx.Node, a: dict[str, Any]) -> Any:
    x = c.value(a["self"])
    dim = a.get("dim", 0) % len(c.shape(x))
    n = c.shape(x)[dim]
    if "split_sizes" in a:
        sizes = list(a["split_sizes"])
    else:
        step = a["split_size"]
        sizes = [min(step, n - i) for i in range(0, n, step)] if step else [n]
    outs = c.op("split", x, axis=dim, sizes=sizes)
    return outs if isinstance(outs, tuple) else (outs,)


@converts(_overload(aten.slice, "Tensor"), _overload(aten.slice_copy, "Tensor"))
def _slice(c: Converter, node: fx.Node, a: dict[str, Any]) -> Any:
    x = c.value(a["self"])
    big = 2 ** 62
    start = a.get("start") if a.get("start") is not None else 0
    end = a.get("end") if a.get("end") is not None else big
    return c.op("slice", x, starts=[max(min(start, big), -big)], ends=[max(min(end, big), -big)],
                axes=[a.get("dim", 0)], steps=[a.get("step", 1)])


@converts(_overload(aten.select, "int"), _overload(aten.select_copy, "int"))
def _select(c: Converter, node: fx.Node, a: dict[str, Any]) -> Any:
    x = c.value(a["self"])
    dim = a["dim"] % len(c.shape(x))
    index = a["index"] % c.shape(x)[dim]
    part = c.op("slice", x, starts=[index], ends=[index + 1], axes=[dim], steps=[1])
    return c.op("reshape", part, shape=_out_shape(node))


@converts(aten.constant_pad_nd.default)
def _pad(c: Converter, node: fx.Node, a: dict[str, Any]) -> Any:
    x = c.value(a["self"])
    rank = len(c.shape(x))
    flat = list(a["pad"])  # (last axis before, after, second to last before, after, ...)
    begin, end = [0] * rank, [0] * rank
    for k in range(len(flat) // 2):
        begin[rank - 1 - k], end[rank - 1 - k] = flat[2 * k], flat[2 * k + 1]
    return c.op("pad", x, pads=begin + end, value=float(a.get("value", 0.0)))


@converts(aten.clone.default, aten.alias.default, _overload(aten.alias_copy),
          aten.detach.default, _overload(aten.detach_copy))
def _identity(c: Converter, node: fx.Node, a: dict[str, Any]) -> Any:
    return c.value(a["self"])


def _to_copy_check(node: fx.Node, a: dict[str, Any]) -> str | None:
    extra = {k for k in ("layout", "device", "pin_memory", "memory_format")
             if node.kwargs.get(k) is not None}
    return f"_to_copy changing {', '.join(sorted(extra))}" if extra else None


@converts(aten._to_copy.default, check=_to_copy_check)
def _to_copy(c: Converter, node: fx.Node, a: dict[str, Any]) -> Any:
    x = c.value(a["self"])
    dtype = a.get("dtype")
    if dtype is None:
        return x
    if dtype not in _DTYPES:
        raise ConversionError(f"cast to {dtype}")
    return c.op("cast", x, to=_DTYPES[dtype])


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
        return entry[1](node, arguments(node))
    except (KeyError, TypeError, AttributeError) as exc:
        return f"unexpected arguments ({exc})"


def _metas(node: fx.Node) -> list[Any]:
    """The tensor metadata of each of the node's outputs."""
    meta = tensor_meta(node)
    if meta is None:
        return []
    return [meta] if isinstance(meta, TensorMetadata) else [m for m in meta if m is not None]


def convert_graph(graph: fx.Graph, constants: dict[fx.Node, torch.Tensor],
                  input_names: dict[fx.Node, str] | None = None) -> tuple[Graph, list[fx.Node]]:
    """A graphsub Graph computing the FX graph's outputs. Placeholders in `constants` become
    weights (parameters, buffers, folded constants); the others become graph inputs, whose FX
    nodes are returned in the order of the graph's inputs. Raises ConversionError for a node
    it cannot convert."""
    c = Converter()
    inputs: list[fx.Node] = []
    for node in graph.nodes:
        if node.op == "placeholder":
            if node in constants:
                c.env[node] = c.b.weight(constants[node].detach().cpu().numpy())
            else:
                meta = tensor_meta(node)
                if meta is None or meta.dtype not in _DTYPES:
                    raise ConversionError(f"input {node.name} is not a tensor graphsub models")
                name = (input_names or {}).get(node, node.name)
                c.env[node] = c.b.input(name, tuple(int(d) for d in meta.shape),
                                        _DTYPES[meta.dtype])
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
            c.env[node] = CONVERTERS[node.target][0](c, node, arguments(node))
        elif node.op == "output":
            outs = node.args[0]
            outs = outs if isinstance(outs, (tuple, list)) else (outs,)
            for i, o in enumerate(outs):
                c.b.output(c.value(o), f"out{i}")
        else:
            raise ConversionError(f"{node.op} node {node.name}")
    return c.b.build().cse(), inputs
