"""The operator definition type and the registry every other part of graphsub reads.

One `OpDef` holds everything that must agree about an operator: its attributes, shape
inference, numpy reference semantics, ONNX export, cost counts, whether it is a view, torch
lowering, fission category, what the numerical rule check draws for it and whether a library
product fuses it as an activation. Imports are
keyed by the *foreign* operator instead (one ONNX op or ATen op may become several graphsub
ops, as Gemm and silu do), so ONNX and ATen importers have registries of their own, filled by
the same family modules, beside the OpDefs they produce. docs/operators.md says how to add one.

The family modules never import torch: a lowering and an ATen importer reach torch through
the context the torch backend or the torch.compile frontend hands them (`TorchLowering`,
`AtenBuilder`), so graphsub without its torch extra still imports every operator, and the
operator layer stays below the targets that run it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

import numpy as np

from graphsub.errors import OpAttributeError, ShapeError
from graphsub.tensors.symbolic import Dim, dim, is_static, is_symbolic, provably_equal
from graphsub.ops.contexts import OpExportContext, OpImportContext
from graphsub.tensors.types import Attrs, TensorType

Types = tuple[TensorType, ...]
Shape = tuple[Dim, ...]
InferFn = Callable[[Attrs, Types], Types]
EvalFn = Callable[[Attrs, Sequence[np.ndarray]], tuple[np.ndarray, ...]]
ExportFn = Callable[[OpExportContext, Attrs, list[str], list[str], Types], None]
CountFn = Callable[[Attrs, Types, Types], int]
CanonFn = Callable[[dict[str, Any], Types], dict[str, Any]]


class TorchLowering(Protocol):
    """What an operator's torch lowering may use, handed over by the torch backend.

    A lowering is called once, when a program is built, with this context, the node's
    attributes and its input and output types; it returns a function of the input tensors
    that uses torch operations only, with every shape, pad and index resolved ahead (no
    `.shape`, `.item()` or host round trip at run time), so that the same function runs
    eagerly, is traced into an FX graph, captured in a CUDA graph or handed to inductor.
    """

    torch: Any            #: the torch module
    F: Any                #: torch.nn.functional
    device: Any           #: the torch.device the program runs on
    #: cuDNN's fused convolution + bias + relu where the device has it, else None
    fused_conv_relu: Any

    def const(self, array: np.ndarray) -> Any:
        """A constant tensor on the device, made once when the program is built."""

    def leaf(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Call `fn` without tracing into it (onnxruntime on the host, for opaque nodes)."""

    def dtype(self, name: str) -> Any:
        """The torch dtype of a graphsub dtype name."""

    def generated(self, fn: Callable[..., tuple[Any, ...]], ins: Types, outs: Types) -> TorchFn:
        """`fn` (torch operations from inputs of types `ins` to outputs of types `outs`)
        compiled by the code generator into one kernel where it can be (inductor), else `fn`
        itself."""


TorchFn = Callable[..., tuple[Any, ...]]
LowerFn = Callable[[TorchLowering, Attrs, Types, Types], TorchFn]


class _Required:
    def __repr__(self) -> str:
        return "<required>"


REQUIRED: Any = _Required()


#: Values of an attribute from the input shapes and the attributes drawn before it (a split's
#: sizes from its input's dimension along its axis).
TriesFn = Callable[[Sequence[Shape], Mapping[str, Any]], tuple[Any, ...]]


@dataclass(frozen=True)
class AttrSpec:
    """One attribute: its default (or REQUIRED) and a converter to its canonical form.

    `tries` are the values the numerical rule check (rules/check.py) draws one of, uniformly,
    where a rule leaves the attribute open: a tuple, or a function of the input shapes that
    gives them; none (the default) leaves the attribute at its default. A rule holds for every
    value, so the tries are the values that tell a wrong rule: several axes, both padding
    modes, strides of 1 and 2."""

    name: str
    default: Any = REQUIRED
    convert: Callable[[Any], Any] | None = None
    tries: tuple[Any, ...] | TriesFn = ()

    def tried(self, in_shapes: Sequence[Shape], attrs: Mapping[str, Any]) -> tuple[Any, ...]:
        """The values to try for inputs of `in_shapes` (`attrs`: those drawn already)."""
        return self.tries(in_shapes, attrs) if callable(self.tries) else self.tries


class Category(StrEnum):
    """The fission paper's categories of primitives (section 2.1; Korch, section 3), and the
    operators that are not one: a primitive has one degree of parallelism and one data access
    pattern, so it runs as one kernel. The category decides what a generated kernel may hold
    (graphsub.fission.candidates): elementwise, reduce/broadcast and layout primitives fuse
    into one loop nest; a linear primitive is a library call of its own."""

    ELEMENTWISE = "elementwise"
    REDUCE = "reduce"         #: reductions and broadcasts
    LAYOUT = "layout"         #: moves data without arithmetic
    LINEAR = "linear"         #: matmul, convolution: linear in every input
    COARSE = "coarse"         #: an operator fission splits into the four above (fission.rules)
    SOURCE = "source"         #: graph inputs and weights: no kernel
    #: a kernel of its own, which fission does not split: an operator graphsub does not model,
    #: softmax with its NaN guard (no primitive tests for NaN), or one no fission rule
    #: expresses (a rotary embedding's gather by position)
    OPAQUE = "opaque"
    GENERATED = "generated"   #: a generated kernel (`fused`): fission puts its body back


#: The shapes the numerical rule check draws an operand from where its operator's
#: `OperandRole` names
#: none: every rank from scalars to 4-D images, sizes that broadcast against each other, and
#: shapes that tell a rule right only for some: batches of more than one (a transpose of the
#: two leading axes is a reshape only where one is 1), odd sizes (a slice off by one agrees
#: with the right one on even sizes), every dimension different (a reduction over the wrong
#: axis agrees where the sizes are equal).
ANY_SHAPES: tuple[Shape, ...] = ((4, 4), (1, 4, 6, 6), (4,), (1, 8, 6, 6), (4, 6), (1, 4, 1, 1),
                                 (), (1, 4), (2, 4, 4), (3, 5), (2, 3, 5), (5,), (2, 3, 5, 7),
                                 (2, 1, 5, 1), (2, 3, 1, 5), (1, 1, 1, 4))


@dataclass(frozen=True)
class OperandRole:
    """What the numerical rule check draws for one input of the operator where a rule has a
    variable: the shapes it may take (a convolution's weights are 4-D, a norm's scale is a
    vector), whether its values must be positive for the operator to be defined (a
    logarithm's input, a divisor) and its type (quantized values and zero points are
    integers over their whole range)."""

    shapes: tuple[Shape, ...] = ANY_SHAPES
    positive: bool = False
    dtype: str = "float32"


def _no_algorithm(attrs: Attrs) -> str:
    return ""


@dataclass(frozen=True)
class PostOp:
    """An activation that a library's matrix product applies to its result within the same
    call (oneDNN's post-ops: targets/torch/fusion.py): the post-op's name, and its algorithm
    for the node's attributes (GELU's tanh approximation)."""

    name: str
    algorithm: Callable[[Attrs], str] = _no_algorithm


def _zero(attrs: Attrs, ins: Types, outs: Types) -> int:
    return 0


def _bytes_moved(attrs: Attrs, ins: Types, outs: Types) -> int:
    return sum(t.nbytes for t in ins) + sum(t.nbytes for t in outs)


#: The kinds of view an operator can be (`OpDef.view`).
VIEW_KINDS = ("alias", "strided")


@dataclass(frozen=True)
class OpDef:
    """The single definition of one graphsub operator."""

    name: str
    inputs: tuple[int, int | None]  # (min, max); max None means variadic
    infer: InferFn
    evaluate: EvalFn
    export: ExportFn
    #: What fission does with it: splits it (coarse), keeps it as a primitive of a category,
    #: or leaves it a kernel of its own.
    category: Category
    attrs: tuple[AttrSpec, ...] = ()
    flops: CountFn = _zero
    bytes: CountFn = _bytes_moved
    #: Rewrites attributes into canonical form once input types are known (negative axes,
    #: padding modes that coincide with SAME/VALID, ...), so equal computations look equal.
    canonicalize: CanonFn | None = None
    #: Binary and commutative: rules match it with operands in either order, and the
    #: structural hash does not depend on their order.
    commutative: bool = False
    #: Associative as well (a sum, a product): rules match a chain of it in any association
    #: (graphsub.rules.matcher's chains), as they match its operands in either order.
    associative: bool = False
    #: Whether the output is the input's memory: "alias" (the same bytes read as another
    #: shape: reshape and its kin), "strided" (the same bytes with other strides: transpose,
    #: split, slice) or "" (a kernel computes it). A view moves no data (an alias of a
    #: contiguous input, a strided view where operators read strided inputs); whether it
    #: also runs without a kernel is the target's to say (`Target.free_views`;
    #: `cost.base.costs_nothing` answers for a node): torch runs both kinds as torch views,
    #: onnxruntime launches a kernel for each, of which the analytic model charges an
    #: alias's launch alone and a strided view's as a copy.
    view: str = ""
    #: The operator in torch (see `TorchLowering`); None: the torch targets cannot run it.
    torch: LowerFn | None = None
    #: What the numerical rule check draws for each input (`OperandRole`), by position; inputs past
    #: the end take `OperandRole()`.
    roles: tuple[OperandRole, ...] = ()
    #: Set for an activation a library's matrix product applies in the same call.
    post_op: PostOp | None = None
    doc: str = ""
    _spec_by_name: dict[str, AttrSpec] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.view not in ("", *VIEW_KINDS):
            raise ValueError(f"operator {self.name!r}: view {self.view!r} is not one of "
                             f"{', '.join(VIEW_KINDS)} or empty")
        object.__setattr__(self, "_spec_by_name", {a.name: a for a in self.attrs})

    def role(self, position: int) -> OperandRole:
        """What the rule check draws for the input at `position`."""
        return self.roles[position] if position < len(self.roles) else OperandRole()

    def attr_spec(self, name: str) -> AttrSpec | None:
        return self._spec_by_name.get(name)

    def make_attrs(self, given: Mapping[str, Any], in_types: Types) -> Attrs:
        """Validate, default and canonicalize user-given attributes for these input types."""
        unknown = set(given) - set(self._spec_by_name)
        if unknown:
            known = ", ".join(sorted(self._spec_by_name)) or "none"
            raise OpAttributeError(
                f"{self.name}: unknown attribute(s) {', '.join(sorted(unknown))}; known: {known}"
            )
        values: dict[str, Any] = {}
        for spec in self.attrs:
            if spec.name in given:
                value = given[spec.name]
            elif spec.default is REQUIRED:
                raise OpAttributeError(f"{self.name}: attribute {spec.name!r} is required")
            else:
                value = spec.default
            if spec.convert is not None and value is not None:
                try:
                    value = spec.convert(value)
                except (TypeError, ValueError) as exc:
                    raise OpAttributeError(
                        f"{self.name}: bad value {value!r} for attribute {spec.name!r}: {exc}"
                    ) from None
            values[spec.name] = value
        if self.canonicalize is not None:
            values = self.canonicalize(values, in_types)
        return Attrs(values)

    def check_arity(self, n: int) -> None:
        lo, hi = self.inputs
        if n < lo or (hi is not None and n > hi):
            want = f"{lo}" if lo == hi else f"{lo}..{'any' if hi is None else hi}"
            raise ShapeError(f"{self.name}: takes {want} inputs, got {n}")


_REGISTRY: dict[str, OpDef] = {}

ImportFn = Callable[[OpImportContext, Any], Any]
_IMPORTERS: dict[str, ImportFn] = {}


def register(op: OpDef) -> OpDef:
    if op.name in _REGISTRY:
        raise ValueError(f"operator {op.name!r} defined twice")
    _REGISTRY[op.name] = op
    return op


def onnx_importer(*op_types: str) -> Callable[[ImportFn], ImportFn]:
    """Register an importer for ONNX op types (default domain, or "domain.OpType").

    An importer returns the output values it built, or None when this particular instance is
    outside what graphsub models (then the node is imported as opaque).
    """

    def deco(fn: ImportFn) -> ImportFn:
        for t in op_types:
            _IMPORTERS[t] = fn
        return fn

    return deco


def get_op(name: str) -> OpDef:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise OpAttributeError(f"unknown graphsub operator {name!r}") from None


def all_ops() -> dict[str, OpDef]:
    return dict(_REGISTRY)


def view_ops(*kinds: str) -> frozenset[str]:
    """The operators whose `view` is one of `kinds` ("alias", "strided")."""
    return frozenset(name for name, op in _REGISTRY.items() if op.view in kinds)


class AtenCall(Protocol):
    """One ATen node as an ATen importer sees it, handed over by the torch.compile frontend."""

    #: The node's arguments by schema name, defaults filled in.
    args: dict[str, Any]
    #: Keyword arguments as written (those a schema default hides from `args` included).
    kwargs: dict[str, Any]

    def out_shape(self) -> tuple[int, ...]:
        """The shape of the node's (first) output."""

    def shape_of(self, arg: Any) -> tuple[int, ...] | None:
        """The shape of a tensor argument as recorded in the graph, None if unknown."""

    def device_of(self, arg: Any) -> str | None:
        """The device of a tensor argument as recorded in the graph ("cpu", "cuda:0"), None
        if unknown."""


class AtenBuilder(Protocol):
    """What an ATen importer may ask of the graph being built."""

    def value(self, arg: Any, like: Any = None) -> Any:
        """The graphsub value of an argument: a converted tensor, or a Python scalar as a
        0-d weight of `like`'s dtype."""

    def is_tensor(self, arg: Any) -> bool:
        """Whether the argument is a tensor of the graph (not a Python scalar)."""

    def op(self, name: str, *args: Any, **attrs: Any) -> Any:
        """Add a graphsub operator; its value, or a tuple for several outputs."""

    def weight(self, array: np.ndarray) -> Any:
        """A constant of the graph."""

    def shape(self, value: Any) -> tuple[int, ...]:
        """The shape of a graphsub value."""

    def dtype(self, value: Any) -> str:
        """The dtype name of a graphsub value."""

    def dtype_name(self, torch_dtype: Any) -> str | None:
        """graphsub's name of a torch dtype, None for one graphsub does not convert."""


AtenImportFn = Callable[[AtenBuilder, AtenCall], Any]
AtenCheckFn = Callable[[AtenCall], "str | None"]
#: ATen overload name ("relu.default", "add.Tensor") -> (importer, check). A check returns
#: why this particular node cannot be imported, or None.
_ATEN_IMPORTERS: dict[str, tuple[AtenImportFn, AtenCheckFn]] = {}


def _always(call: AtenCall) -> str | None:
    return None


def aten_importer(*overloads: str, check: AtenCheckFn = _always
                  ) -> Callable[[AtenImportFn], AtenImportFn]:
    """Register an importer for ATen overloads, named as `torch.ops.aten` spells them
    ("convolution.default"). The importer returns the graphsub value (or a tuple, None where
    an output is not modelled); it raises ConversionError for what it cannot express."""

    def deco(fn: AtenImportFn) -> AtenImportFn:
        for name in overloads:
            _ATEN_IMPORTERS[name] = (fn, check)
        return fn

    return deco


def aten_importers() -> dict[str, tuple[AtenImportFn, AtenCheckFn]]:
    return dict(_ATEN_IMPORTERS)


def importer_for(onnx_op_type: str, domain: str = "") -> ImportFn | None:
    """The importer of an op type of the default domain, or of another domain's (registered
    as "com.microsoft.MatMulNBits")."""
    key = onnx_op_type if domain in ("", "ai.onnx") else f"{domain}.{onnx_op_type}"
    return _IMPORTERS.get(key)


def importable_onnx_ops() -> list[str]:
    return sorted(_IMPORTERS)


# ---- shared converters and checks used by the family modules -------------------------------

#: What the rule check tries for an axis and a tuple of axes (`AttrSpec.tries`): both ends,
#: counted from either side, and all axes.
AXIS_TRIES = (1, 0, -1)
AXES_TRIES = ((-1,), (0,), (1,), None)


def ints(value: Any) -> tuple[int, ...]:
    if isinstance(value, (int, np.integer)):
        return (int(value),)
    return tuple(int(v) for v in value)


def f32(value: Any) -> float:
    """A float attribute, rounded to float32 as ONNX stores it, so that a graph and its ONNX
    round trip carry the same attribute values."""
    return float(np.float32(value))


def pair(value: Any) -> tuple[int, int]:
    v = ints(value)
    if len(v) == 1:
        return (v[0], v[0])
    if len(v) != 2:
        raise ValueError("expected one or two integers")
    return (v[0], v[1])


def choice(*options: str) -> Callable[[Any], str]:
    def convert(value: Any) -> str:
        v = str(value).lower()
        if v not in options:
            raise ValueError(f"expected one of {', '.join(options)}")
        return v

    return convert


def is_float(t: TensorType) -> bool:
    return t.dtype.startswith(("float", "bfloat"))


def norm_axis(axis: int, rank: int, op: str) -> int:
    if not -rank <= axis < max(rank, 1):
        raise ShapeError(f"{op}: axis {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


def same_dtype(op: str, types: Types) -> str:
    dtypes = {t.dtype for t in types}
    if len(dtypes) > 1:
        raise ShapeError(f"{op}: inputs must share a dtype, got {', '.join(sorted(dtypes))}")
    return types[0].dtype


def broadcast(op: str, types: Types) -> tuple[Dim, ...]:
    shapes = [t.shape for t in types]
    if all(is_static(s) for s in shapes):
        try:
            return tuple(np.broadcast_shapes(*shapes))
        except ValueError:
            pass
    else:
        result = broadcast_shapes(shapes)
        if result is not None:
            return result
    shown = " and ".join(str(t.shape) for t in types)
    raise ShapeError(f"{op}: shapes {shown} do not broadcast") from None


def broadcast_shapes(shapes: Sequence[Sequence[Dim]]) -> tuple[Dim, ...] | None:
    """numpy's broadcasting over symbolic dimensions, or None where the shapes do not
    broadcast for every value of the sizes. A size symbol broadcasts against 1 and against
    itself; against another number or another symbol it is a shape error unless the two are
    provably equal: a model whose `seq` must equal 128 has no dynamic `seq`, and reading the
    one as the other would let a rewrite rely on what only some sizes satisfy."""
    rank = max((len(s) for s in shapes), default=0)
    out: list[Dim] = []
    for axis in range(rank):
        result: Dim = 1
        for s in shapes:
            d = s[axis - rank + len(s)] if axis - rank + len(s) >= 0 else 1
            if d == 1 or d == result:
                continue
            if result == 1:
                result = d
            elif not provably_equal(result, d):
                return None
        out.append(result)
    return tuple(out)


def same_dim(a: Dim, b: Dim) -> bool:
    """Whether two dimensions are equal for every value of the sizes (plain equality for
    numbers; structurally different expressions are compared by sympy)."""
    return a == b or (not (type(a) is int and type(b) is int) and provably_equal(a, b))


def broadcasts_to(shape: Sequence[Dim], target: Sequence[Dim]) -> bool:
    """Whether `shape` broadcasts to exactly `target` for every value of the sizes."""
    result = broadcast_shapes((shape, target))
    return result is not None and len(result) == len(target) and all(
        same_dim(r, t) for r, t in zip(result, target))


def size_dims(value: Any) -> tuple[Dim, ...]:
    """A tuple of sizes, each a number or a size expression (a reshape's target, a split's
    sizes)."""
    if isinstance(value, (int, np.integer)) or is_symbolic(value):
        return (dim(value),)
    return tuple(dim(v) for v in value)
