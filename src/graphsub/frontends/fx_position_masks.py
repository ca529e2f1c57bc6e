"""Masks a traced graph builds from positions, proven causal for every size it runs at.

At a symbolic sequence length, transformers builds the attention mask from positions: an
`arange` over the length, a check for packed sequences (`diff` of the positions, `cumsum`
of where they jump), the positions of each query and key picked by `index` with more
aranges, compared with `le`, combined with `__and__`. Nothing of it is a constant, so no
rule can read that the mask is causal, and the attention keeps a mask tensor where the
hand-written model passes `is_causal=True` (a kernel that skips the masked half).

Here each tensor the graph computes from sizes alone is described by its elements: a z3
term over its indices and the graph's size symbols (an `arange` is its index; `index`
substitutes the index tensors' terms; a `cumsum` is read only where z3 proves its operand
constant along the axis). A mask is causal when z3 proves, for every size in the symbols'
ranges and every index within the shape, that it keeps key j for query i exactly where
j <= i (a boolean mask), or adds 0 there and one value at or below the masked score
elsewhere (an additive one). Anything else (an operator not modelled here, an arithmetic z3
cannot decide within its time) leaves the mask what it was: nothing is assumed.

The proof is the license for the importer to read such a mask as graphsub's `causal_mask`
operator (which computes the same values at every size), and the library's
`attention-causal-mask` reads that as the attention's causal flag.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
import z3

from graphsub.errors import ConversionError
from graphsub.frontends.fx_fold import attribute
from graphsub.frontends.fx_import import CausalMask, node_shape, symbolic_size
from graphsub.rules.expr import masked_at
from graphsub.tensors.symbolic import Dim, SymbolRange

#: z3's time for one question (milliseconds): a term it cannot decide in this is not proven.
SOLVER_TIMEOUT_MS = 2000
#: The largest constant (elements) read element by element.
CONSTANT_LIMIT = 64

aten = torch.ops.aten

#: The infinities, as values no float reaches (floats are only moved here, never computed
#: with: `where`, `masked_fill`, comparisons, as torch's attention decomposition writes a
#: boolean mask as 0 and -inf).
NEG_INF, POS_INF = z3.Real("negative_infinity"), z3.Real("positive_infinity")
#: Beyond every finite float64 (an int: z3 reads no float's exponent).
FLOAT_BOUND = 2 ** 1024

Indices = tuple[z3.ArithRef, ...]


class _Unmodelled(Exception):
    """A node this module does not describe: what reads it is not proven anything."""


#: What describing a node or proving a mask may raise: the node is left undescribed, the
#: mask unproven (terms are built lazily, so a proof meets what a description did not).
_FAILURES = (_Unmodelled, ConversionError, z3.Z3Exception, ArithmeticError, IndexError,
             KeyError, TypeError, ValueError)


@dataclass(frozen=True)
class _Form:
    """A tensor described by its elements: its shape (z3 terms over the size symbols), its
    kind (bool, int or real), and its element at given indices."""

    shape: tuple[z3.ArithRef, ...]
    kind: str
    at: Callable[[Indices], z3.ExprRef]

    @property
    def rank(self) -> int:
        return len(self.shape)


def _size_term(size: Dim, symbols: dict[str, z3.ArithRef]) -> z3.ArithRef:
    """A graphsub size expression as a z3 integer term over the symbols."""
    import sympy

    if isinstance(size, int):
        return z3.IntVal(size)
    if size.is_Integer:
        return z3.IntVal(int(size))
    if size.is_Symbol:
        if size.name not in symbols:
            symbols[size.name] = z3.Int(size.name)
        return symbols[size.name]
    args = [_size_term(a, symbols) for a in size.args]
    if isinstance(size, sympy.Add):
        return z3.Sum(args)
    if isinstance(size, sympy.Mul):
        return z3.Product(args)
    if isinstance(size, sympy.Pow) and size.exp.is_Integer and int(size.exp) > 0:
        return z3.Product([args[0]] * int(size.exp))
    if isinstance(size, sympy.Mod):
        return args[0] % args[1]
    if isinstance(size, sympy.floor) and isinstance(size.args[0], sympy.Mul):
        numerator, denominator = sympy.fraction(size.args[0])
        return _size_term(numerator, symbols) / _size_term(denominator, symbols)
    raise _Unmodelled(f"size {size}")


class _Reader:
    """Describes the graph's size-built tensors (see the module's docstring)."""

    def __init__(self, ranges: Mapping[str, SymbolRange]) -> None:
        self.symbols: dict[str, z3.ArithRef] = {}
        self.ranges = ranges
        self.forms: dict[fx.Node, _Form | z3.ArithRef] = {}
        self.fresh = 0

    # ---- terms --------------------------------------------------------------------------

    def size(self, value: Any) -> z3.ArithRef:
        size = symbolic_size(value)
        if size is None:
            raise _Unmodelled(f"size {value!r}")
        return _size_term(size, self.symbols)

    def shape(self, node: fx.Node) -> tuple[z3.ArithRef, ...]:
        shape = node_shape(node)
        if shape is None:
            raise _Unmodelled(f"{node.name} has no shape")
        return tuple(_size_term(d, self.symbols) for d in shape)

    def kind(self, node: fx.Node) -> str:
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            raise _Unmodelled(f"{node.name} is no tensor")
        if val.dtype == torch.bool:
            return "bool"
        if val.dtype.is_floating_point:
            return "real"
        if not val.dtype.is_complex:
            return "int"
        raise _Unmodelled(f"{node.name} is complex")

    def scalar(self, arg: Any, kind: str) -> _Form:
        """A number or a size as a rank-0 form of the given kind."""
        if isinstance(arg, fx.Node):
            term = self.forms.get(arg)
            if term is None or isinstance(term, _Form):
                raise _Unmodelled(f"{arg.name} is no size")
            value: z3.ExprRef = term
        elif isinstance(arg, bool):
            value = z3.BoolVal(arg)
        elif isinstance(arg, int) and kind == "real":
            if abs(arg) > 1 << 24:  # float32 holds it exactly only up to here
                raise _Unmodelled(f"the integer {arg} as a float")
            value = z3.RealVal(arg)
        elif isinstance(arg, int):
            value = z3.IntVal(arg)
        elif isinstance(arg, float):
            value = _real(arg)
        elif isinstance(arg, torch.SymInt):
            value = self.size(arg)
        else:
            raise _Unmodelled(f"argument {arg!r}")
        term = _converted(value, kind)
        return _Form((), kind, lambda idx: term)

    def operand(self, arg: Any, kind: str | None = None) -> _Form:
        if isinstance(arg, fx.Node) and isinstance(self.forms.get(arg), _Form):
            form = self.forms[arg]
            assert isinstance(form, _Form)
            return form if kind is None else _as_kind(form, kind)
        return self.scalar(arg, kind or "int")

    # ---- nodes --------------------------------------------------------------------------

    def read(self, node: fx.Node) -> None:
        """Describe the node if it is computed from sizes alone (else leave it out)."""
        val = node.meta.get("val")
        if isinstance(val, torch.SymInt):
            try:
                self.forms[node] = self.size(val)
            except _FAILURES:
                pass
            return
        if node.op == "get_attr":
            module = node.graph.owning_module
            try:
                value = attribute(module, str(node.target)) if module is not None else None
            except AttributeError:
                return
            if isinstance(value, torch.Tensor) and value.numel() <= CONSTANT_LIMIT:
                try:
                    self.forms[node] = _constant(value, self.shape(node))
                except _Unmodelled:
                    pass
            return
        if node.op != "call_function" or not isinstance(val, torch.Tensor):
            return
        inputs = node.all_input_nodes
        if any(n not in self.forms for n in inputs if not _shape_only(node, n)):
            return
        try:
            self.forms[node] = self.describe(node)
        except _FAILURES:
            return

    def describe(self, node: fx.Node) -> _Form:
        target, args, kwargs = node.target, node.args, node.kwargs
        out = self.shape(node)
        kind = self.kind(node)
        handler = _HANDLERS.get(target)
        if handler is None:
            raise _Unmodelled(str(target))
        form = handler(self, node, out, kind, *args, **kwargs)
        if len(form.shape) != len(out):
            raise _Unmodelled(f"{node.name}: rank {len(form.shape)} read, {len(out)} traced")
        return _Form(out, kind, _as_kind(form, kind).at)

    # ---- proofs -------------------------------------------------------------------------

    def solver(self, shape: Sequence[z3.ArithRef]) -> tuple[z3.Solver, Indices]:
        """A solver knowing the symbols' ranges, and indices within `shape`."""
        self.fresh += 1
        idx = tuple(z3.Int(f"i{self.fresh}_{k}") for k in range(len(shape)))
        s = z3.Solver()
        s.set("timeout", SOLVER_TIMEOUT_MS)
        for d, i in zip(shape, idx):
            s.add(0 <= i, i < d)
        self.bound(s)
        return s, idx

    def bound(self, s: z3.Solver) -> None:
        s.add(NEG_INF < -FLOAT_BOUND, POS_INF > FLOAT_BOUND)
        for name, term in self.symbols.items():
            r = self.ranges.get(name, SymbolRange(0))
            s.add(term >= r.low)
            if r.high is not None:
                s.add(term <= r.high)

    def never(self, shape: Sequence[z3.ArithRef], claim: Callable[[Indices], z3.BoolRef]
              ) -> bool:
        """Whether z3 proves that no index within `shape` (at any size) makes `claim` hold."""
        s, idx = self.solver(shape)
        s.add(claim(idx))
        return bool(s.check() == z3.unsat)

    def constant_along(self, form: _Form, axis: int) -> bool:
        def varies(idx: Indices) -> z3.BoolRef:
            first = idx[:axis] + (z3.IntVal(0),) + idx[axis + 1:]
            return form.at(idx) != form.at(first)

        return self.never(form.shape, varies)

    def causal(self, node: fx.Node) -> CausalMask | None:
        """The node as a causal mask, if z3 proves it is one (see the module's docstring)."""
        form = self.forms.get(node)
        shape = node_shape(node)
        if not isinstance(form, _Form) or form.rank < 2 or shape is None:
            return None
        dtype = node.meta["val"].dtype
        if form.kind == "bool":
            if self.never(form.shape, lambda idx: form.at(idx) != (idx[-1] <= idx[-2])):
                return CausalMask(shape, "bool", 0.0)
            return None
        if form.kind != "real":
            return None
        s, idx = self.solver(form.shape)
        s.add(idx[-1] > idx[-2])
        if s.check() != z3.sat:
            return None
        model = s.model()
        fill = model.eval(form.at(idx), model_completion=True)
        if z3.is_true(model.eval(form.at(idx) == NEG_INF, model_completion=True)):
            fill, value = NEG_INF, float("-inf")
        elif z3.is_rational_value(fill) and abs(fill.as_fraction()) < FLOAT_BOUND:
            value = float(fill.as_fraction())
        else:
            return None
        name = str(dtype).removeprefix("torch.")
        if value > masked_at(name):
            return None
        exact = self.never(form.shape, lambda i: form.at(i) != z3.If(
            i[-1] <= i[-2], z3.RealVal(0), fill))
        return CausalMask(shape, name, value) if exact else None


def _constant(value: torch.Tensor, shape: tuple[z3.ArithRef, ...]) -> _Form:
    """A small constant (a folded `arange(batch)`): its one value, or its elements picked by
    the flat index."""
    if value.dtype.is_complex or value.dim() != len(shape):
        raise _Unmodelled("a constant")
    kind = "bool" if value.dtype == torch.bool else \
        "real" if value.dtype.is_floating_point else "int"
    flat = value.detach().cpu().reshape(-1).tolist()
    terms = [_converted(z3.BoolVal(v) if kind == "bool" else _real(v) if kind == "real"
                        else z3.IntVal(v), kind) for v in flat]
    if all(v == flat[0] for v in flat):
        return _Form(shape, kind, lambda idx: terms[0])
    sizes = list(value.shape)

    def at(idx: Indices) -> z3.ExprRef:
        position: z3.ArithRef = z3.IntVal(0)
        for i, size in zip(idx, sizes):
            position = position * size + i
        term = terms[-1]
        for k in range(len(terms) - 2, -1, -1):
            term = z3.If(position == k, terms[k], term)
        return term

    return _Form(shape, kind, at)


def _real(value: float) -> z3.ArithRef:
    if math.isnan(value):
        raise _Unmodelled("NaN")
    if math.isinf(value):
        return NEG_INF if value < 0 else POS_INF
    return z3.RealVal(value)


def _shape_only(node: fx.Node, read: fx.Node) -> bool:
    """Whether `node` reads `read` for its shape alone (new_ones(x, ...), sym_size(x, d))."""
    return node.target in _SHAPE_READERS and node.args[0] is read and all(
        a is not read for a in node.args[1:])


def _converted(value: z3.ExprRef, kind: str) -> z3.ExprRef:
    if kind == "bool":
        return value if z3.is_bool(value) else value != 0
    if z3.is_bool(value):
        return z3.If(value, z3.IntVal(1), z3.IntVal(0)) if kind == "int" else \
            z3.If(value, z3.RealVal(1), z3.RealVal(0))
    if kind == "real" and z3.is_int(value):
        raise _Unmodelled("an integer read as a float (exact only while small)")
    if kind == "int" and z3.is_real(value):
        raise _Unmodelled("a float read as an integer")
    return value


def _as_kind(form: _Form, kind: str) -> _Form:
    if form.kind == kind:
        return form
    if form.kind == "int" and kind == "real":
        raise _Unmodelled("an integer tensor cast to a float")
    return _Form(form.shape, kind, lambda idx: _converted(form.at(idx), kind))


def _broadcast(form: _Form, out: Sequence[z3.ArithRef]) -> Callable[[Indices], z3.ExprRef]:
    """`form`'s element at an index of the shape it broadcasts to (its axes of size 1 read
    at 0)."""
    lead = len(out) - form.rank
    if lead < 0:
        raise _Unmodelled("broadcast to a lower rank")
    ones = [z3.is_int_value(d) and d.as_long() == 1 for d in form.shape]

    def at(idx: Indices) -> z3.ExprRef:
        return form.at(tuple(z3.IntVal(0) if one else i
                             for one, i in zip(ones, idx[lead:])))

    return at


def _axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


# ---- the operators -----------------------------------------------------------------------

Handler = Callable[..., _Form]
_HANDLERS: dict[Any, Handler] = {}
_SHAPE_READERS = {aten.new_ones.default, aten.new_zeros.default, aten.new_full.default,
                  aten.new_empty.default, aten.ones_like.default, aten.zeros_like.default,
                  aten.full_like.default, aten.sym_size.int}


def _handles(*targets: Any) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        for t in targets:
            _HANDLERS[t] = fn
        return fn

    return register


@_handles(aten.arange.default, aten.arange.start, aten.arange.start_step)
def _arange(r: _Reader, node: fx.Node, out: tuple[z3.ArithRef, ...], kind: str, *args: Any,
            **kwargs: Any) -> _Form:
    start, step = (args[0] if len(args) > 1 else 0), (args[2] if len(args) > 2 else 1)
    if kind != "int":
        raise _Unmodelled("a float arange")
    first, stride = r.scalar(start, "int").at(()), r.scalar(step, "int").at(())
    return _Form(out, kind, lambda idx: first + idx[0] * stride)


def _filled(value: Any) -> Handler:
    def filled(r: _Reader, node: fx.Node, out: tuple[z3.ArithRef, ...], kind: str, *args: Any,
               **kwargs: Any) -> _Form:
        fill = value if value is not None else (args[2] if node.target in (
            aten.new_full.default,) else args[1])
        term = r.scalar(fill, kind).at(())
        return _Form(out, kind, lambda idx: term)

    return filled


for _target, _value in ((aten.new_ones.default, 1), (aten.ones.default, 1),
                        (aten.ones_like.default, 1), (aten.new_zeros.default, 0),
                        (aten.zeros.default, 0), (aten.zeros_like.default, 0),
                        (aten.full.default, None), (aten.new_full.default, None),
                        (aten.full_like.default, None)):
    _HANDLERS[_target] = _filled(_value)


@_handles(aten.scalar_tensor.default)
def _scalar_tensor(r: _Reader, node: fx.Node, out: tuple[z3.ArithRef, ...], kind: str,
                   value: Any, **kwargs: Any) -> _Form:
    return r.scalar(value, kind)


@_handles(aten.clone.default, aten.alias.default, aten.detach.default,
          aten.lift_fresh_copy.default, aten._to_copy.default, aten.contiguous.default)
def _same(r: _Reader, node: fx.Node, out: tuple[z3.ArithRef, ...], kind: str, x: Any,
          *args: Any, **kwargs: Any) -> _Form:
    return r.operand(x)


def _binary(fn: Callable[[z3.ExprRef, z3.ExprRef], z3.ExprRef], operands: str | None = None
            ) -> Handler:
    """An element-wise operator over operands that broadcast; `operands`: the kind both
    are read as (None: the output's, or bool and int as they are for comparisons)."""

    def binary(r: _Reader, node: fx.Node, out: tuple[z3.ArithRef, ...], kind: str, a: Any,
               b: Any, *rest: Any, **kwargs: Any) -> _Form:
        if rest or kwargs.get("alpha", 1) != 1:
            raise _Unmodelled("an operator with alpha")
        read_as = operands or kind
        x, y = r.operand(a, read_as), r.operand(b, read_as)
        if read_as == "real" and operands is None:
            raise _Unmodelled("float arithmetic (rounds)")
        fx_, fy = _broadcast(x, out), _broadcast(y, out)
        return _Form(out, kind, lambda idx: fn(fx_(idx), fy(idx)))

    return binary


def _comparison(fn: Callable[[z3.ExprRef, z3.ExprRef], z3.ExprRef]) -> Handler:
    def compare(r: _Reader, node: fx.Node, out: tuple[z3.ArithRef, ...], kind: str, a: Any,
                b: Any) -> _Form:
        x = r.operand(a)
        y = r.operand(b, x.kind)
        fx_, fy = _broadcast(x, out), _broadcast(y, out)
        return _Form(out, "bool", lambda idx: fn(fx_(idx), fy(idx)))

    return compare


for _name, _fn in (("add", operator.add), ("sub", operator.sub), ("mul", operator.mul)):
    for _overload in ("Tensor", "Scalar"):
        _HANDLERS[getattr(getattr(aten, _name), _overload)] = _binary(_fn)
for _name, _fn in (("eq", operator.eq), ("ne", operator.ne), ("lt", operator.lt),
                   ("le", operator.le), ("gt", operator.gt), ("ge", operator.ge)):
    for _overload in ("Tensor", "Scalar"):
        _HANDLERS[getattr(getattr(aten, _name), _overload)] = _comparison(_fn)
for _name, _fn in (("__and__", z3.And), ("bitwise_and", z3.And), ("logical_and", z3.And),
                   ("__or__", z3.Or), ("bitwise_or", z3.Or), ("logical_or", z3.Or),
                   ("__xor__", z3.Xor), ("bitwise_xor", z3.Xor), ("logical_xor", z3.Xor)):
    for _overload in ("Tensor", "Scalar", "default"):
        _op = getattr(getattr(aten, _name), _overload, None)
        if _op is not None:
            _HANDLERS[_op] = _binary(_fn, "bool")


@_handles(aten.bitwise_not.default, aten.logical_not.default)
def _not(r: _Reader, node: fx.Node, out: tuple[z3.ArithRef, ...], kind: str, x: Any) -> _Form:
    form = r.operand(x, "bool")
    return _Form(out, "bool", lambda idx: z3.Not(form.at(idx)))


@_handles(aten.where.self, aten.where.Scalar, aten.where.ScalarSelf, aten.where.ScalarOther)
def _where(r: _Reader, node: fx.Node, out: tuple[z3.ArithRef, ...], kind: str, c: Any, a: Any,
           b: Any) -> _Form:
    fc, fa, fb = (_broadcast(f, out) for f in (r.operand(c, "bool"), r.operand(a, kind),
                                                r.operand(b, kind)))
    return _Form(out, kind, lambda idx: z3.If(fc(idx), fa(idx), fb(idx)))


@_handles(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def _masked_fill(r: _Reader, node: fx.Node, out: tuple[z3.ArithRef, ...], kind: str, x: Any,
                 mask: Any, value: Any) -> _Form:
    fx_, fm = _broadcast(r.operand(x, kind), out), _broadcast(r.operand(mask, "bool"), out)
    fv = _broadcast(r.operand(value, kind), out)
    return _Form(out, kind, lambda idx: z3.If(fm(idx), fv(idx), fx_(idx)))


@_handles(aten.unsqueeze.default)
def _unsqueeze(r: _Reader, node: fx.Node, out: tuple[z3.ArithRef, ...], kind: str, x: Any,
               axis: int) -> _Form:
    form = r.operand(x)
    axis = _axis(axis, len(out))
    return _Form(out, form.kind, lambda idx: form.at(idx[:axis] + idx[axis + 1:]))


@_handles(aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.view.default,
          aten.reshape.default, aten._unsafe_view.default)
def _reshaped(r: _Reader, node: fx.Node, out: tuple[z3.ArithRef, ...], kind: str, x: Any,
              *args: Any) -> _Form:
    """A reshape that only adds or drops axes of size 1 (else not modelled)."""
    form = r.operand(x)
    source, target = node_shape(x), node_shape(node)
    if source is None or target is None:
        raise _Unmodelled("a reshape without shapes")
    kept_in = [k for k, d in enumerate(source) if d != 1]
    kept_out = [k for k, d in enumerate(target) if d != 1]
    if [source[k] for k in kept_in] != [target[k] for k in kept_out]:
        raise _Unmodelled("a reshape that moves elements")

    def at(idx: Indices) -> z3.ExprRef:
        picked = dict(zip(kept_in, (idx[k] for k in kept_out)))
        return form.at(tuple(picked.get(k, z3.IntVal(0)) for k in range(len(source))))

    return _Form(out, form.kind, at)


@_handles(aten.expand.default)
def _expand(r: _Reader, node: fx.Node, out: tuple[z3.ArithRef, ...], kind: str, x: Any,
            *args: Any, **kwargs: Any) -> _Form:
    form = r.operand(x)
    return _Form(out, form.kind, _broadcast(form, out))


@_handles(aten.permute.default)
def _permute(r: _Reader, node: fx.Node, out: tuple[z3.ArithRef, ...], kind: str, x: Any,
             dims: Sequence[int]) -> _Form:
    form = r.operand(x)
    order = [_axis(d, len(out)) for d in dims]

    def at(idx: Indices) -> z3.ExprRef:
        source = [z3.IntVal(0)] * len(order)
        for k, d in enumerate(order):
            source[d] = idx[k]
        return form.at(tuple(source))

    return _Form(out, form.kind, at)


@_handles(aten.transpose.int)
def _transpose(r: _Reader, node: fx.Node, out: tuple[z3.ArithRef, ...], kind: str, x: Any,
               a: int, b: int) -> _Form:
    order = list(range(len(out)))
    a, b = _axis(a, len(out)), _axis(b, len(out))
    order[a], order[b] = order[b], order[a]
    return _permute(r, node, out, kind, x, order)


@_handles(aten.slice.Tensor)
def _slice(r: _Reader, node: fx.Node, out: tuple[z3.ArithRef, ...], kind: str, x: Any,
           axis: int = 0, start: Any = None, end: Any = None, step: int = 1) -> _Form:
    form = r.operand(x)
    axis = _axis(axis, form.rank)
    size = form.shape[axis]
    first = r.scalar(start if start is not None else 0, "int").at(())
    first = z3.If(first < 0, first + size, first)
    first = z3.If(first < 0, z3.IntVal(0), z3.If(first > size, size, first))

    def at(idx: Indices) -> z3.ExprRef:
        return form.at(idx[:axis] + (first + idx[axis] * step,) + idx[axis + 1:])

    return _Form(out, form.kind, at)


@_handles(aten.select.int)
def _select(r: _Reader, node: fx.Node, out: tuple[z3.ArithRef, ...], kind: str, x: Any,
            axis: int, index: Any) -> _Form:
    form = r.operand(x)
    axis = _axis(axis, form.rank)
    i = r.scalar(index, "int").at(())
    i = z3.If(i < 0, i + form.shape[axis], i)
    return _Form(out, form.kind, lambda idx: form.at(idx[:axis] + (i,) + idx[axis:]))


def _concatenated(forms: Sequence[_Form], axis: int) -> _Form:
    def at(idx: Indices) -> z3.ExprRef:
        offset: z3.ArithRef = z3.IntVal(0)
        cases: list[tuple[z3.BoolRef, z3.ExprRef]] = []
        for f in forms:
            shifted = idx[:axis] + (idx[axis] - offset,) + idx[axis + 1:]
            cases.append((idx[axis] < offset + f.shape[axis], f.at(shifted)))
            offset = offset + f.shape[axis]
        value = cases[-1][1]
        for condition, term in reversed(cases[:-1]):
            value = z3.If(condition, term, value)
        return value

    shape = list(forms[0].shape)
    shape[axis] = z3.Sum([f.shape[axis] for f in forms])
    return _Form(tuple(shape), forms[0].kind, at)


@_handles(aten.cat.default)
def _cat(r: _Reader, node: fx.Node, out: tuple[z3.ArithRef, ...], kind: str,
         tensors: Sequence[Any], axis: int = 0) -> _Form:
    forms = [r.operand(t, kind) for t in tensors]
    return _concatenated(forms, _axis(axis, len(out)))


@_handles(aten.diff.default)
def _diff(r: _Reader, node: fx.Node, out: tuple[z3.ArithRef, ...], kind: str, x: Any,
          n: int = 1, axis: int = -1, prepend: Any = None, append: Any = None) -> _Form:
    if n != 1 or kind not in ("int", "bool"):
        raise _Unmodelled("diff of order other than 1")
    form = r.operand(x)
    axis = _axis(axis, form.rank)
    parts = [r.operand(p, form.kind) for p in (prepend, x, append) if p is not None]
    whole = _concatenated(parts, axis)

    def at(idx: Indices) -> z3.ExprRef:
        after = idx[:axis] + (idx[axis] + 1,) + idx[axis + 1:]
        if form.kind == "bool":
            return z3.Xor(whole.at(after), whole.at(idx))
        return whole.at(after) - whole.at(idx)

    return _Form(out, form.kind, at)


@_handles(aten.cumsum.default)
def _cumsum(r: _Reader, node: fx.Node, out: tuple[z3.ArithRef, ...], kind: str, x: Any,
            axis: int, *args: Any, **kwargs: Any) -> _Form:
    """A running sum, of an operand z3 proves constant along the axis (else not modelled:
    a sum of a symbolic count of terms)."""
    form = r.operand(x)
    axis = _axis(axis, form.rank)
    if not r.constant_along(form, axis):
        raise _Unmodelled("a running sum of varying terms")
    term = _as_kind(form, "int")

    def at(idx: Indices) -> z3.ExprRef:
        first = idx[:axis] + (z3.IntVal(0),) + idx[axis + 1:]
        return (idx[axis] + 1) * term.at(first)

    return _Form(out, "int", at)


@_handles(aten.index.Tensor)
def _index(r: _Reader, node: fx.Node, out: tuple[z3.ArithRef, ...], kind: str, x: Any,
           indices: Sequence[Any]) -> _Form:
    """Advanced indexing by index tensors over the leading axes (torch's rule: their
    broadcast shape, then the axes not indexed)."""
    form = r.operand(x)
    if any(i is None for i in indices) or not indices:
        raise _Unmodelled("indexing with None")
    index_forms = [r.operand(i, "int") for i in indices]
    lead = len(out) - (form.rank - len(indices))
    reads = [_broadcast(f, out[:lead]) for f in index_forms]

    def at(idx: Indices) -> z3.ExprRef:
        picked = []
        for axis, read in enumerate(reads):
            i = read(idx[:lead])
            picked.append(z3.If(i < 0, i + form.shape[axis], i))
        return form.at(tuple(picked) + idx[lead:])

    return _Form(out, form.kind, at)


# ---- the graph ---------------------------------------------------------------------------

def causal_masks(graph: fx.Graph, ranges: Mapping[str, SymbolRange]) -> dict[fx.Node, CausalMask]:
    """The tensors of `graph` computed from sizes alone that z3 proves causal masks at every
    size within `ranges` (by symbol name). Each boolean or floating-point one of two axes or
    more is asked: which of them a part of the graph reads is known only once it is cut."""
    reader = _Reader(ranges)
    for node in graph.nodes:
        reader.read(node)
    found: dict[fx.Node, CausalMask] = {}
    for node, form in reader.forms.items():
        if not isinstance(form, _Form) or form.rank < 2 or form.kind == "int":
            continue
        try:
            mask = reader.causal(node)
        except _FAILURES:  # a term not modelled, or one z3 cannot take: proven nothing
            continue
        if mask is not None:
            found[node] = mask
    return found


__all__ = ["CONSTANT_LIMIT", "SOLVER_TIMEOUT_MS", "causal_masks"]
