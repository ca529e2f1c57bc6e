"""Validating the operator properties (TASO section 3, "methodology for developing operator
properties"): symbolic execution on small tensors, and consistency and redundancy checks.

Why: the prover trusts the hand-written axioms of `axioms.py` completely; one wrong axiom lets
it "prove" wrong rules, and an inconsistent or collapsing set proves everything. So, as in TASO:

* every axiom is checked against a small symbolic implementation of the operators, for all
  combinations of parameter values and tensor sizes within `Bounds`. The axiom's Z3 formula
  itself is interpreted (so what is checked is what the prover uses, not a transcription);
  only the input shapes are given per axiom, in `SHAPES`. Inputs are tensors of fresh Z3
  reals, both sides are elaborated into real arithmetic (relu is an uninterpreted function,
  max pooling an `If` chain), and Z3 proves the sides equal elementwise (their negation
  unsatisfiable) or produces a counterexample. Combinations on which an operator is
  undefined (shapes that do not fit, a window larger than the padded input) are skipped;
* the axiom set is checked for consistency, and for redundancy (an axiom the others entail),
  by first-order entailment queries with a timeout.

The symbolic operators follow graphsub's numeric operators (`graphsub.ops`), because those
are what the proven rules rewrite: SAME padding is ONNX's SAME_UPPER (the odd padding pixel
at the end), max pooling never picks a padded cell, the group count of a convolution is the
input channels over the weight's input channels, and average pooling is checked in both of
its modes (padded cells counted or not), because the axioms' pool_avg stands for avg_pool2d
whatever its count_include_pad.

Constants whose size the axioms leave implicit take it from the instance: C_pool(k) is the
depth-wise kernel (C, 1, kh, kw) with every entry 1/(kh*kw) for a C-channel input (TASO figure
8b), I_conv(k) the (C, C, kh, kw) kernel with a single 1 per output channel, at the spatial
position SAME padding aligns with the output pixel ((kh-1)//2, (kw-1)//2), I_matmul the
identity of the size the product needs, I_ewmul all ones. split needs a cut position: the
split axioms split at the size of the first concatenated operand, the only cut for which a
split could invert that concatenation.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from itertools import product
from types import SimpleNamespace
from typing import Any

import numpy as np
import z3

from graphsub.errors import ShapeError
from graphsub.ops.conv import resolve_pads, window_out
from graphsub.proofs.axioms import (
    ACT_NONE,
    ACT_RELU,
    PAD_SAME,
    PAD_VALID,
    Axiom,
    axioms,
    signature,
)

Tensor = np.ndarray[tuple[int, ...], np.dtype[np.object_]]  # each element a Z3 real expression
Shape = tuple[int, ...]
KernelSize = tuple[int, int]

RELU = z3.Function("relu", z3.RealSort(), z3.RealSort())
_ZERO, _ONE = z3.RealVal(0), z3.RealVal(1)


# ---- symbolic tensors ------------------------------------------------------------------------

def variables(name: str, shape: Shape) -> Tensor:
    """A tensor of fresh real variables, named after the tensor and the element's index."""
    return _build(shape, lambda idx: z3.Real(name + "".join(f"_{i}" for i in idx)))


def _build(shape: Shape, element: Callable[[tuple[int, ...]], z3.ArithRef]) -> Tensor:
    out = np.empty(shape, dtype=object)
    for idx in np.ndindex(*shape):
        out[idx] = element(idx)
    return out


def _map(fn: Callable[[z3.ArithRef], z3.ArithRef], x: Tensor) -> Tensor:
    return _build(x.shape, lambda idx: fn(x[idx]))


def _sum(terms: Sequence[z3.ArithRef]) -> z3.ArithRef:
    return z3.Sum(*terms) if terms else _ZERO


def _same_shape(op: str, x: Tensor, y: Tensor) -> None:
    if x.shape != y.shape:
        raise ShapeError(f"{op}: shapes {x.shape} and {y.shape} differ")


# ---- symbolic operators ----------------------------------------------------------------------

def ewadd(x: Tensor, y: Tensor) -> Tensor:
    _same_shape("ewadd", x, y)
    out: Tensor = x + y  # numpy types object arithmetic as Any
    return out


def ewmul(x: Tensor, y: Tensor) -> Tensor:
    _same_shape("ewmul", x, y)
    out: Tensor = x * y
    return out


def smul(x: Tensor, w: Tensor) -> Tensor:
    """x scaled by the scalar tensor w (shape ())."""
    if w.shape != ():
        raise ShapeError(f"smul: the scale must have shape (), got {w.shape}")
    return _map(lambda e: e * w[()], x)


def transpose(x: Tensor) -> Tensor:
    """Swap the last two axes (the only transpose the prover translates)."""
    if x.ndim < 2:
        raise ShapeError(f"transpose: needs two axes, got shape {x.shape}")
    return np.swapaxes(x, -1, -2)


def matmul(x: Tensor, y: Tensor) -> Tensor:
    if x.ndim != 2 or y.ndim != 2 or x.shape[1] != y.shape[0]:
        raise ShapeError(f"matmul: cannot multiply {x.shape} by {y.shape}")
    return _build((x.shape[0], y.shape[1]),
                  lambda ij: _sum([x[ij[0], k] * y[k, ij[1]] for k in range(x.shape[1])]))


def relu(x: Tensor) -> Tensor:
    return _map(RELU, x)


def concat(axis: int, x: Tensor, y: Tensor) -> Tensor:
    if x.ndim != y.ndim or axis >= x.ndim or any(
            a != b for i, (a, b) in enumerate(zip(x.shape, y.shape)) if i != axis):
        raise ShapeError(f"concat: shapes {x.shape} and {y.shape} differ outside axis {axis}")
    return np.concatenate([x, y], axis=axis)


def _split(axis: int, x: Tensor, cut: int) -> tuple[Tensor, Tensor]:
    if axis >= x.ndim or not 0 <= cut <= x.shape[axis]:
        raise ShapeError(f"split: cannot cut axis {axis} of {x.shape} at {cut}")
    before, after = np.split(x, [cut], axis=axis)
    return before, after


def split0(axis: int, x: Tensor, cut: int) -> Tensor:
    """The part of x before position `cut` of `axis`."""
    return _split(axis, x, cut)[0]


def split1(axis: int, x: Tensor, cut: int) -> Tensor:
    """The part of x from position `cut` of `axis` on."""
    return _split(axis, x, cut)[1]


def _padding_name(padding: int) -> str:
    if padding not in (PAD_SAME, PAD_VALID):
        raise ValueError(f"padding mode {padding} is not modelled")
    return "same" if padding == PAD_SAME else "valid"


def _activate(activation: int, x: Tensor) -> Tensor:
    if activation not in (ACT_NONE, ACT_RELU):
        raise ValueError(f"activation {activation} is not modelled")
    return relu(x) if activation == ACT_RELU else x


def conv(stride: int, dilation: int, padding: int, activation: int, x: Tensor,
         w: Tensor) -> Tensor:
    """NCHW input, OIHW kernel, grouped (groups = input channels / kernel input channels),
    with graphsub's SAME/VALID padding; padded cells contribute no term at all."""
    if x.ndim != 4 or w.ndim != 4:
        raise ShapeError(f"conv: input and kernel must be 4-D, got {x.shape} and {w.shape}")
    n, c, h, wd = x.shape
    cout, cin_g, kh, kw = w.shape
    if c % cin_g or cout % (c // cin_g):
        raise ShapeError(f"conv: channels of {x.shape} and {w.shape} do not form groups")
    per_group = cout // (c // cin_g)
    top, left, bottom, right = resolve_pads(_padding_name(padding), (h, wd), (kh, kw),
                                            (stride, stride), (dilation, dilation))
    out_h = window_out(h, kh, stride, dilation, top, bottom, "conv")
    out_w = window_out(wd, kw, stride, dilation, left, right, "conv")

    def element(idx: tuple[int, ...]) -> z3.ArithRef:
        b, o, i, j = idx
        base = (o // per_group) * cin_g
        return _sum([x[b, base + ci, r, s] * w[o, ci, a, e]
                     for ci in range(cin_g) for a in range(kh) for e in range(kw)
                     if 0 <= (r := i * stride - top + a * dilation) < h
                     and 0 <= (s := j * stride - left + e * dilation) < wd])

    return _activate(activation, _build((n, cout, out_h, out_w), element))


def enlarge(kernel: KernelSize, w: Tensor) -> Tensor:
    """Zero-pad an OIHW kernel spatially, centred, to `kernel`."""
    kh, kw = kernel
    if w.ndim != 4 or kh < w.shape[2] or kw < w.shape[3] or (kh - w.shape[2]) % 2 \
            or (kw - w.shape[3]) % 2:
        raise ShapeError(f"enlarge: cannot centre kernel {w.shape} in {kernel}")
    ph, pw = (kh - w.shape[2]) // 2, (kw - w.shape[3]) // 2
    out = np.full(w.shape[:2] + (kh, kw), _ZERO, dtype=object)
    out[:, :, ph:ph + w.shape[2], pw:pw + w.shape[3]] = w
    return out


def _pool_windows(kernel: KernelSize, stride: int, padding: int,
                  x: Tensor) -> tuple[Shape, dict[tuple[int, ...], list[z3.ArithRef]]]:
    """The output shape of a pooling, and each output index's window cells inside the input."""
    if x.ndim != 4:
        raise ShapeError(f"pool: input must be 4-D, got {x.shape}")
    n, c, h, wd = x.shape
    kh, kw = kernel
    top, left, bottom, right = resolve_pads(_padding_name(padding), (h, wd), kernel,
                                            (stride, stride))
    if max(top, bottom) >= kh or max(left, right) >= kw:
        raise ShapeError(f"pool: padding of {x.shape} is not smaller than the window {kernel}")
    shape = (n, c, window_out(h, kh, stride, 1, top, bottom, "pool"),
             window_out(wd, kw, stride, 1, left, right, "pool"))
    windows: dict[tuple[int, ...], list[z3.ArithRef]] = {}
    for b, ch, i, j in np.ndindex(*shape):
        rows = [r for a in range(kh) if 0 <= (r := i * stride - top + a) < h]
        cols = [s for e in range(kw) if 0 <= (s := j * stride - left + e) < wd]
        windows[b, ch, i, j] = [x[b, ch, r, s] for r in rows for s in cols]
    return shape, windows


def pool_avg(kernel: KernelSize, stride: int, padding: int, x: Tensor,
             count_include_pad: bool) -> Tensor:
    """Average pooling; the divisor is the window size when padded cells count, else the
    number of input cells in the window (graphsub's default)."""
    shape, windows = _pool_windows(kernel, stride, padding, x)
    size = kernel[0] * kernel[1]
    return _build(shape, lambda idx: _sum(windows[idx]) / z3.RealVal(
        size if count_include_pad else len(windows[idx])))


def _maximum(cells: list[z3.ArithRef]) -> z3.ArithRef:
    best = cells[0]
    for cell in cells[1:]:
        best = z3.If(cell > best, cell, best)
    return best


def pool_max(kernel: KernelSize, stride: int, padding: int, x: Tensor) -> Tensor:
    """Max pooling over the input cells of each window (padding never wins)."""
    shape, windows = _pool_windows(kernel, stride, padding, x)
    return _build(shape, lambda idx: _maximum(windows[idx]))


def c_pool(kernel: KernelSize, channels: int) -> Tensor:
    """The depth-wise kernel whose convolution is average pooling with padded cells counted."""
    value = z3.Q(1, kernel[0] * kernel[1])
    return np.full((channels, 1) + kernel, value, dtype=object)


def i_conv(kernel: KernelSize, channels: int) -> Tensor:
    """The kernel whose stride-1 SAME convolution is the identity."""
    centre = ((kernel[0] - 1) // 2, (kernel[1] - 1) // 2)
    return _build((channels, channels) + kernel,
                  lambda idx: _ONE if idx[0] == idx[1] and idx[2:] == centre else _ZERO)


def i_matmul(size: int) -> Tensor:
    return _build((size, size), lambda idx: _ONE if idx[0] == idx[1] else _ZERO)


def i_ewmul(shape: Shape) -> Tensor:
    return np.full(shape, _ONE, dtype=object)


# ---- properties and the instances to check ---------------------------------------------------

ShapeScheme = Mapping[str, tuple[str | int, ...]]
"""Input tensor name -> its shape: sizes, or dimension variables that the enumeration
assigns; a variable used twice is one size. Variables named "H" range over `Bounds.spatial`
(images are square), "K" over `Bounds.kernels` (so are kernels), all others over
`Bounds.dims`."""

Sides = Callable[[SimpleNamespace], tuple[Tensor, Tensor]]
"""Builds both sides of a property from the input tensors and parameter values, given as
attributes named as in the axioms (tensors x, y, z, w; parameters a, s, d, p, c, k, and cip
for average pooling's count_include_pad). Raises ShapeError where an operator is undefined."""

KERNEL_BASE = 1000  # the prover's integer encoding of a kernel (prover._kernel): kh * 1000 + kw


def kernel_of(k: int) -> KernelSize:
    """The (height, width) a kernel parameter encodes."""
    return k // KERNEL_BASE, k % KERNEL_BASE


@dataclass(frozen=True)
class Bounds:
    """Which sizes and parameter values validation enumerates. TASO went up to 4x4x4x4 (a
    million queries, an hour on 128 cores); the defaults, which validate all 43 axioms in
    about a minute on one core, reach 4 only in image height and width: those are where
    padding, stride and dilation interact (even and odd sizes, windows larger than the
    input), while a third channel or matrix row adds cost but no new case."""

    dims: tuple[int, ...] = (1, 2)  # batch, channels, matrix rows and columns
    spatial: tuple[int, ...] = (1, 2, 3, 4)  # image height (= width)
    kernels: tuple[int, ...] = (1, 2, 3)  # kernel and pooling window height (= width)
    strides: tuple[int, ...] = (1, 2)
    dilations: tuple[int, ...] = (1, 2)  # for the axioms stated for any dilation

    def dim_domain(self, var: str) -> tuple[int, ...]:
        return {"H": self.spatial, "K": self.kernels}.get(var, self.dims)

    def param_domain(self, name: str) -> tuple[Any, ...]:
        """Values of the parameter the axioms name so (a: axis, s: stride, d: dilation,
        p: padding, c: activation, k: kernel), or of average pooling's mode (cip)."""
        return {"a": (0, 1), "s": self.strides, "d": self.dilations,
                "p": (PAD_SAME, PAD_VALID), "c": (ACT_NONE, ACT_RELU),
                "k": tuple(k * KERNEL_BASE + k for k in self.kernels),
                "cip": (False, True)}[name]


DEFAULT_BOUNDS = Bounds()


@dataclass(frozen=True)
class Property:
    """An equation to validate: how to build its sides, the input shapes (one or more
    schemes), and the parameters it is quantified over."""

    name: str
    sides: Sides
    shapes: tuple[ShapeScheme, ...]
    params: tuple[str, ...] = ()


def instances(prop: Property, bounds: Bounds) -> Iterator[tuple[dict[str, Any], dict[str, Shape]]]:
    """Every (parameter values, input shapes) combination within the bounds."""
    for scheme in prop.shapes:
        dim_vars = sorted({d for shape in scheme.values() for d in shape if isinstance(d, str)})
        for sizes in product(*(bounds.dim_domain(v) for v in dim_vars)):
            env = dict(zip(dim_vars, sizes))
            shapes = {t: tuple(env[d] if isinstance(d, str) else d for d in shape)
                      for t, shape in scheme.items()}
            for values in product(*(bounds.param_domain(p) for p in prop.params)):
                yield dict(zip(prop.params, values)), shapes


# ---- axioms as symbolic programs -------------------------------------------------------------

@dataclass(frozen=True)
class _Sized:
    """A constant whose size the axioms leave implicit (I_matmul, I_ewmul, C_pool, I_conv):
    made once the operator consuming it knows the size from its other operand."""

    name: str
    make: Callable[[Any], Tensor]


def _concrete(*values: Any) -> None:
    for v in values:
        if isinstance(v, _Sized):
            raise ShapeError(f"nothing determines the size of {v.name} here")


def _dim(t: Tensor, axis: int) -> int:
    if t.ndim < 2:
        raise ShapeError(f"shape {t.shape} has no axis {axis}")
    return t.shape[axis]


def _fit(x: Any, y: Any, size_for_x: Callable[[Tensor], Any],
         size_for_y: Callable[[Tensor], Any]) -> tuple[Tensor, Tensor]:
    """Two operands, a sized constant among them made to the size the other one implies."""
    if isinstance(x, _Sized):
        _concrete(y)
        return x.make(size_for_x(y)), y
    return x, y.make(size_for_y(x)) if isinstance(y, _Sized) else y


def _elementwise(op: Callable[[Tensor, Tensor], Tensor]) -> Callable[..., Tensor]:
    def shape(t: Tensor) -> Shape:
        return t.shape

    return lambda x, y: op(*_fit(x, y, shape, shape))


def _matmul(x: Any, y: Any) -> Tensor:
    return matmul(*_fit(x, y, lambda t: _dim(t, 0), lambda t: _dim(t, 1)))


def _conv(s: int, d: int, p: int, c: int, x: Any, w: Any) -> Tensor:
    _concrete(x)
    return conv(s, d, p, c, x, w.make(_dim(x, 1)) if isinstance(w, _Sized) else w)


def _strict(op: Callable[..., Tensor]) -> Callable[..., Tensor]:
    def apply(*args: Any) -> Tensor:
        _concrete(*args)
        return op(*args)
    return apply


class _Interpreter:
    """Evaluates a term over the axioms' signature on symbolic tensors: tensor and integer
    constants are looked up by name in `env`, which also holds average pooling's mode (cip).
    A split is defined only of a concatenation, cut at the size of its first operand."""

    def __init__(self, env: Mapping[str, Any]) -> None:
        self.env = env
        cip = bool(env.get("cip"))
        self.ops: dict[str, Callable[..., Any]] = {
            "ewadd": _elementwise(ewadd), "ewmul": _elementwise(ewmul),
            "smul": _strict(smul), "transpose": _strict(transpose), "matmul": _matmul,
            "relu": _strict(relu), "concat": _strict(concat), "conv": _conv,
            "enlarge": _strict(lambda k, w: enlarge(kernel_of(k), w)),
            "pool_avg": _strict(lambda k, s, p, x: pool_avg(kernel_of(k), s, p, x, cip)),
            "pool_max": _strict(lambda k, s, p, x: pool_max(kernel_of(k), s, p, x)),
            "c_pool": lambda k: _Sized("C_pool", lambda c: c_pool(kernel_of(k), c)),
            "i_conv": lambda k: _Sized("I_conv", lambda c: i_conv(kernel_of(k), c)),
            "I_matmul": lambda: _Sized("I_matmul", i_matmul),
            "I_ewmul": lambda: _Sized("I_ewmul", i_ewmul),
        }

    def __call__(self, e: z3.ExprRef) -> Any:
        if z3.is_int_value(e):
            return e.as_long()
        name, args = e.decl().name(), e.children()
        if name in ("split0", "split1"):
            return self._split(name, args[0], args[1])
        if not args and name in self.env:
            return self.env[name]
        if name not in self.ops:
            raise ValueError(f"{name} has no symbolic implementation and is not a variable")
        return self.ops[name](*(self(a) for a in args))

    def _split(self, name: str, axis_term: z3.ExprRef, whole: z3.ExprRef) -> Tensor:
        if whole.decl().name() != "concat":
            raise ShapeError(f"{name} of a tensor that is not a concatenation has no cut")
        axis, first = self(axis_term), self(whole.children()[1])
        _concrete(first)
        return (split0 if name == "split0" else split1)(axis, self(whole), first.shape[axis])


def _bound_body(formula: z3.BoolRef) -> tuple[z3.BoolRef, list[tuple[str, z3.SortRef]]]:
    """A universally quantified formula's body, its variables as constants of their names."""
    if not z3.is_quantifier(formula):
        return formula, []
    n = formula.num_vars()
    names = [(formula.var_name(i), formula.var_sort(i)) for i in range(n)]
    consts = [z3.Const(name, sort) for name, sort in reversed(names)]  # de Bruijn order
    return z3.substitute_vars(formula.body(), *consts), names


def _mentions(e: z3.ExprRef, name: str) -> bool:
    return (z3.is_app(e) and e.decl().name() == name) or any(_mentions(c, name)
                                                               for c in e.children())


def formula_property(name: str, formula: z3.BoolRef,
                     shapes: tuple[ShapeScheme, ...]) -> Property:
    """A property checking a (universally quantified) equation over the axioms' signature, as
    written: its integer variables are enumerated as parameters, its tensor variables get the
    shapes given. Average pooling is checked in both modes, padded cells counted or not."""
    body, bound = _bound_body(formula)
    if not z3.is_eq(body):
        raise ValueError(f"{name}: not an equation: {body}")
    ints = tuple(v for v, sort in bound if sort == z3.IntSort())
    tensors = {v for v, sort in bound if sort != z3.IntSort()}
    if any(set(scheme) != tensors for scheme in shapes):
        raise ValueError(f"{name}: shapes must be given for exactly {sorted(tensors)}")
    lhs, rhs = body.children()
    params = ints + (("cip",) if _mentions(body, "pool_avg") else ())

    def sides(v: SimpleNamespace) -> tuple[Tensor, Tensor]:
        run = _Interpreter(vars(v))
        left, right = run(lhs), run(rhs)
        _concrete(left, right)
        return left, right

    return Property(name, sides, shapes, params)


# Shape schemes of the axioms' tensor variables.
_M = ("m", "n")  # any matrix
_EW = ({"x": _M, "y": _M, "z": _M, "w": ()},)  # w: the scale of smul
_BATCHED = ({"x": _M, "y": _M, "w": ()}, {"x": ("b",) + _M, "y": ("b",) + _M, "w": ()})
_PRODUCTS = ({"x": ("m", "n"), "y": ("n", "q"), "z": ("q", "r"), "w": ()},)
_IMAGE, _KERNEL = (1, "c", "H", "H"), ("o", "c", "K", "K")  # ungrouped convolutions
_CONV: tuple[ShapeScheme, ...] = ({"x": _IMAGE, "y": _KERNEL, "z": _KERNEL, "w": ()},)
_TWO = ({"x": _M, "y": ("q", "r")},)  # concatenable along axis 0 or 1, or not at all
_CAT_PAIRS = ({"x": _M, "y": _M, "z": ("q", "r"), "w": ("q", "r")},)  # x|z and y|w
_IMAGES_0 = ({"x": ("n", "c", "H", "H"), "y": ("n2", "c", "H", "H")},)
_IMAGES_1 = ({"x": ("n", "c", "H", "H"), "y": ("n", "c2", "H", "H")},)


def _pick(schemes: tuple[ShapeScheme, ...], names: str) -> tuple[ShapeScheme, ...]:
    """The schemes restricted to the tensor variables (one letter each) an axiom has."""
    return tuple({n: scheme[n] for n in names} for scheme in schemes)


SHAPES: dict[str, tuple[ShapeScheme, ...]] = {
    "ewadd-assoc": _pick(_EW, "xyz"),
    "ewadd-comm": _pick(_EW, "xy"),
    "ewmul-assoc": _pick(_EW, "xyz"),
    "ewmul-comm": _pick(_EW, "xy"),
    "ewmul-ewadd-distrib": _pick(_EW, "xyz"),
    "smul-assoc": ({"x": _M, "y": (), "w": ()},),
    "smul-ewadd-distrib": _pick(_EW, "xyw"),
    "smul-ewmul-comm": _pick(_EW, "xyw"),
    "transpose-involution": _pick(_BATCHED, "x"),
    "transpose-ewadd": _pick(_BATCHED, "xy"),
    "transpose-ewmul": _pick(_BATCHED, "xy"),
    "smul-transpose": _pick(_BATCHED, "xw"),
    "matmul-assoc": _pick(_PRODUCTS, "xyz"),
    "matmul-smul": _pick(_PRODUCTS, "xyw"),
    "matmul-ewadd": ({"x": ("m", "n"), "y": ("n", "q"), "z": ("n", "q")},),
    "transpose-matmul": _pick(_PRODUCTS, "xy"),
    "conv-smul-args": _pick(_CONV, "xyw"),
    "conv-smul-out": _pick(_CONV, "xyw"),
    "conv-ewadd-kernel": _pick(_CONV, "xyz"),
    "conv-ewadd-input": ({"x": _IMAGE, "y": _IMAGE, "z": _KERNEL},),
    "conv-enlarge": _pick(_CONV, "xy"),
    "conv-relu": _pick(_CONV, "xy"),
    "relu-transpose": _pick(_BATCHED, "x"),
    "conv-cpool": _pick(_CONV, "x"),
    "conv-iconv": _pick(_CONV, "x"),
    "matmul-identity": _pick(_EW, "x"),
    "ewmul-identity": _pick(_EW, "x"),
    "split0-concat": _TWO,
    "split1-concat": _TWO,
    "concat-geometry": ({"x": ("m", "n"), "y": ("m", "q"), "z": ("r", "n"), "w": ("r", "q")},),
    "concat-smul": ({"x": _M, "y": ("q", "r"), "w": ()},),
    "concat-ewadd": _CAT_PAIRS,
    "concat-ewmul": _CAT_PAIRS,
    "concat-relu": _TWO,
    "concat-transpose": ({"x": ("m", "n"), "y": ("q", "n")},),  # matrices: axes are absolute
    "concat-matmul-cols": ({"x": ("m", "n"), "y": ("n", "q"), "z": ("n", "r")},),
    "concat-matmul-inner": ({"x": ("m", "n"), "z": ("m", "q"), "y": ("n", "r"),
                             "w": ("q", "r")},),
    "concat-conv-batch": ({"x": _IMAGE, "y": ("n", "c", "H", "H"), "z": _KERNEL},),
    "concat-conv-filters": ({"x": _IMAGE, "y": _KERNEL, "z": ("o2", "c", "K", "K")},),
    "conv-concat-channels": ({"x": _IMAGE, "y": _KERNEL, "z": (1, "c2", "H", "H"),
                              "w": ("o", "c2", "K", "K")},),
    "concat-pool-avg": _IMAGES_1,
    "concat-pool-max-0": _IMAGES_0,
    "concat-pool-max-1": _IMAGES_1,
}
"""The input shapes each axiom is validated on, by axiom name. Matrix operators get matrices
(TASO's "normal matrix multiplication"); so does concat-transpose, which holds for matrices
only (at rank 3, axes 0 and 1 are not the ones transposed). Convolutions are ungrouped (the
filter and channel concatenation axioms do not hold for grouped ones) and get one image
unless concatenated along the batch."""


def axiom_properties() -> dict[str, Property]:
    """Every axiom of `axioms()` as a property, interpreted from its formula."""
    return {a.name: formula_property(a.name, a.formula, SHAPES[a.name]) for a in axioms()}


# ---- validation ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Counterexample:
    """Where a property fails: the instance (a kernel parameter k in the prover's encoding,
    see `kernel_of`), and one output element on which the sides differ, with the values
    Z3's model gives them."""

    params: dict[str, Any]
    shapes: dict[str, Shape]
    index: tuple[int, ...] | None  # None when the sides' shapes already differ
    lhs: str
    rhs: str


@dataclass(frozen=True)
class Validation:
    """The outcome of validating one property: valid (every instance proven), invalid (with a
    counterexample) or unknown (a query timed out, or no instance was well-defined)."""

    name: str
    status: str
    instances: int  # well-defined instances checked
    skipped: int  # combinations on which an operator is undefined
    seconds: float
    counterexample: Counterexample | None = None
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _differences(lhs: Tensor, rhs: Tensor) -> list[tuple[tuple[int, ...], z3.BoolRef]]:
    return [(idx, lhs[idx] != rhs[idx]) for idx in np.ndindex(*lhs.shape)]


def _check_instance(prop: Property, params: dict[str, Any], shapes: dict[str, Shape],
                    timeout_ms: int) -> tuple[str, Counterexample | None]:
    """One instance: "valid", "invalid" (with a counterexample), "unknown" or "undefined"."""
    tensors = {name: variables(name, shape) for name, shape in shapes.items()}
    try:
        lhs, rhs = prop.sides(SimpleNamespace(**tensors, **params))
    except ShapeError:
        return "undefined", None
    if lhs.shape != rhs.shape:
        return "invalid", Counterexample(params, shapes, None, f"shape {lhs.shape}",
                                         f"shape {rhs.shape}")
    diffs = _differences(lhs, rhs)
    solver = z3.Solver()
    solver.set("timeout", timeout_ms)
    solver.add(z3.Or([d for _, d in diffs]))
    result = solver.check()
    if result == z3.unsat:
        return "valid", None
    if result == z3.unknown:
        return "unknown", None
    model = solver.model()
    index = next(idx for idx, d in diffs if z3.is_true(model.eval(d, model_completion=True)))

    def value(t: Tensor) -> str:
        return str(model.eval(t[index], model_completion=True))

    return "invalid", Counterexample(params, shapes, index, value(lhs), value(rhs))


def validate_property(prop: Property, bounds: Bounds = DEFAULT_BOUNDS,
                      timeout_ms: int = 5_000) -> Validation:
    """Check `prop` on every instance within `bounds`, stopping at the first counterexample.
    Use it for candidate properties before they become axioms."""
    start = time.perf_counter()
    checked = skipped = 0
    unknown = ""
    for params, shapes in instances(prop, bounds):
        status, cex = _check_instance(prop, params, shapes, timeout_ms)
        if status == "undefined":
            skipped += 1
            continue
        checked += 1
        if status == "invalid":
            return Validation(prop.name, "invalid", checked, skipped,
                              time.perf_counter() - start, cex)
        if status == "unknown" and not unknown:
            unknown = f"timeout on {params} {shapes}"
    if not checked:
        unknown = "no well-defined instance within the bounds"
    return Validation(prop.name, "unknown" if unknown else "valid", checked, skipped,
                      time.perf_counter() - start, reason=unknown)


def validate_axiom(name: str, bounds: Bounds = DEFAULT_BOUNDS,
                   timeout_ms: int = 5_000) -> Validation:
    """Validate the axiom of that name (see `axioms()`) by symbolic execution."""
    return validate_property(axiom_properties()[name], bounds, timeout_ms)


# ---- consistency and redundancy --------------------------------------------------------------

@dataclass(frozen=True)
class Consistency:
    """Z3's answers (sat | unsat | unknown) on the axiom set.

    `status` is for the axioms alone: unsat would mean they are contradictory. Equations are
    always satisfied by a one-element model, so expect sat; it says little. `distinct` is for
    the axioms plus two tensors that differ: unsat means the axioms collapse all tensors into
    one and would prove any rule, which one wrong axiom (say, concat commutative) suffices
    for. A model there must be infinite (split-of-concat makes concat injective), so expect
    unknown: the check can find a collapse, never rule one out."""

    status: str
    distinct: str
    seconds: float
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _solve(formulas: Sequence[z3.BoolRef], timeout_ms: int) -> tuple[z3.CheckSatResult, str]:
    """Check with model-based quantifier instantiation, which can build finite models."""
    solver = z3.Solver()
    solver.set("timeout", timeout_ms)
    solver.set("mbqi", True)
    solver.add(*formulas)
    result = solver.check()
    return result, solver.reason_unknown() if result == z3.unknown else ""


def _two_distinct_tensors() -> list[z3.BoolRef]:
    """Two different tensors, plus the ground terms E-matching needs to instantiate axioms
    about them: every operator applied once to them (integer parameters 0 or 1), and the
    split parts of their concatenations, marked by a fresh predicate (which changes no
    answer: it can hold everywhere). Without ground terms no collapse proof starts."""
    s = signature()
    t1, t2 = z3.Consts("distinct_1 distinct_2", s.T)
    seen = z3.Function("seen", s.T, z3.BoolSort())
    terms = [s.split0(a, s.concat(a, t1, t2)) for a in (0, 1)]
    terms += [s.split1(a, s.concat(a, t1, t2)) for a in (0, 1)]
    for f in (getattr(s, fld.name) for fld in fields(s)):
        if isinstance(f, z3.FuncDeclRef) and f.arity() and f.range() == s.T:
            domains = [(t1, t2) if f.domain(i) == s.T else (0, 1) for i in range(f.arity())]
            terms += [f(*args) for args in product(*domains)]
    return [t1 != t2] + [seen(t) for t in terms]


def check_consistency(timeout_ms: int = 10_000,
                      axiom_set: Sequence[Axiom] | None = None) -> Consistency:
    """Whether the axioms (default: all of `axioms()`) have a model, and one in which two
    tensors differ; `timeout_ms` per query."""
    start = time.perf_counter()
    formulas = [a.formula for a in (axioms() if axiom_set is None else axiom_set)]
    status, why = _solve(formulas, timeout_ms)
    distinct, why_distinct = _solve(formulas + _two_distinct_tensors(), timeout_ms)
    reason = "; ".join(f"{what}: {r}" for what, r in (("axioms", why), ("distinct", why_distinct))
                       if r)
    return Consistency(str(status), str(distinct), time.perf_counter() - start, reason)


@dataclass(frozen=True)
class Redundancy:
    """Whether the other axioms entail this one: redundant (unsat), independent (sat: Z3 found
    a model of the others violating it) or unknown (timeout)."""

    name: str
    status: str
    seconds: float
    reason: str = ""  # why Z3 gave up, when it did

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_ENTAILMENT = {"unsat": "redundant", "sat": "independent", "unknown": "unknown"}


def check_redundancy(timeout_ms: int = 10_000, axiom_set: Sequence[Axiom] | None = None,
                     names: Collection[str] | None = None,
                     on_progress: Callable[[str], None] | None = None) -> list[Redundancy]:
    """For each axiom in `names` (default: all), whether the rest of `axiom_set` entails it."""
    pool = list(axioms() if axiom_set is None else axiom_set)
    results = []
    for axiom in pool:
        if names is not None and axiom.name not in names:
            continue
        start = time.perf_counter()
        others = [a.formula for a in pool if a is not axiom]
        result, why = _solve(others + [z3.Not(axiom.formula)], timeout_ms)
        results.append(Redundancy(axiom.name, _ENTAILMENT[str(result)],
                                  time.perf_counter() - start, why))
        if on_progress:
            on_progress(f"redundancy {axiom.name}: {results[-1].status}")
    return results


# ---- all checks together ---------------------------------------------------------------------

@dataclass(frozen=True)
class AxiomReport:
    """Validation, consistency and redundancy of the axiom set (for a CLI to print)."""

    validations: list[Validation]
    consistency: Consistency
    redundancy: list[Redundancy]
    bounds: Bounds
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """No axiom refuted or redundant, and no inconsistency or collapse found."""
        return (all(v.status != "invalid" for v in self.validations)
                and "unsat" not in (self.consistency.status, self.consistency.distinct)
                and all(r.status != "redundant" for r in self.redundancy))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: counts per status, then each axiom's result."""
        return {
            "ok": self.ok, "seconds": self.seconds, "bounds": asdict(self.bounds),
            "validation": {**_tally(self.validations, ("valid", "invalid", "unknown")),
                           "axioms": [v.to_dict() for v in self.validations]},
            "consistency": self.consistency.to_dict(),
            "redundancy": {**_tally(self.redundancy, ("redundant", "independent", "unknown")),
                           "axioms": [r.to_dict() for r in self.redundancy]},
        }


def _tally(results: Sequence[Validation | Redundancy], statuses: tuple[str, ...]) -> dict[str, int]:
    return {status: sum(r.status == status for r in results) for status in statuses}


def step_count(redundancy: bool = True) -> int:
    """How often `check_axioms` calls `on_progress`, for sizing a progress bar."""
    return len(axioms()) * (2 if redundancy else 1) + 1


def check_axioms(timeout_ms: int = 10_000, bounds: Bounds = DEFAULT_BOUNDS,
                 instance_timeout_ms: int = 5_000, redundancy: bool = True,
                 on_progress: Callable[[str], None] | None = None) -> AxiomReport:
    """Validate every axiom by symbolic execution, then check the set's consistency and
    (unless `redundancy` is off: it takes up to `timeout_ms` per axiom) its redundancy.
    `on_progress` gets a line after each step (`step_count` of them)."""
    start = time.perf_counter()
    report = on_progress or (lambda _: None)
    validations = []
    for name, prop in axiom_properties().items():
        validations.append(validate_property(prop, bounds, instance_timeout_ms))
        report(f"validate {name}: {validations[-1].status}")
    consistency = check_consistency(timeout_ms)
    report(f"consistency: {consistency.status}, distinct tensors: {consistency.distinct}")
    redundant = check_redundancy(timeout_ms, on_progress=report) if redundancy else []
    return AxiomReport(validations, consistency, redundant, bounds, time.perf_counter() - start)
