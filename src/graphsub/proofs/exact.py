"""Graphs evaluated exactly: rational arithmetic, -inf as a value, random functions for what
rational arithmetic cannot compute. The evaluator of `graphsub.proofs.identity`'s tests.

Values are numpy object arrays of `Fraction` (and NEG_INF, what masks hold). Arithmetic in
float32 and float64 is exact, as the axioms take it. What cannot be computed that way (tanh,
erf, a square root, softmax over a row, rounding to a type that does not hold the value,
arithmetic in half precision, which rounds, and an integer mean, which truncates) is a
random function of its exact argument: a keyed hash, the same function wherever the same
operation occurs, so a rule that holds here holds whatever those functions are, the real
ones among them. Where a function has a property rules of a kind rely on, the property is
built in and stated here: relu is idempotent; softmax gives a masked (-inf) position zero;
integer sums, products and quotients wrap and truncate as their type does, exactly;
rounding a whole number in a type's range to that type leaves it; a cast to a type that
holds the value is the identity. Fused operators (attention, GELU, batch normalization) are their definitions
(axioms), each checked against its numpy reference by the tests
(tests/proofs/test_identity.py).

A float32 or float64 constant (a weight, a float32 attribute such as an epsilon) is read as
the simplest rational its type rounds to it: the 1/9 of a 3x3 average, a rewrite folded into
float32 as 0.11111111, is 1/9 again, and a constant such as 1/sqrt(2) is one fixed rational
wherever it occurs. A half-precision constant is read exactly (its grid is too coarse to
stand for a decimal), and so is a float64 attribute (a scale): what rewrites compute of such
values (a scale times a weight's value) is exact in float64.
"""

from __future__ import annotations

import hashlib
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from graphsub.ir import Graph, Value
from graphsub.ops import get_op
from graphsub.ops.attention import causal_mask
from graphsub.ops.quant import _along
from graphsub.tensors.types import Attrs

#: The identity test's points, and random functions' values: eighths in [-SPREAD, SPREAD]
#: (exact in float32, and mostly not whole numbers, so that a rounding whose one built-in
#: property is leaving whole numbers alone is exercised off them), POINTS values in all.
SPREAD, EIGHTHS = 1 << 10, 8
POINTS = 2 * SPREAD * EIGHTHS + 1


class NotExact(Exception):
    """An operator, or a value, the exact evaluator has no semantics for."""


class _NegInf:
    """-inf, exactly: what a mask holds where a score is left out. Sums with it are -inf, as
    is its product with a positive number; anything else (+inf, nan) is not exact here."""

    def __repr__(self) -> str:
        return "-inf"

    def __float__(self) -> float:
        return float("-inf")

    def __add__(self, other: object) -> _NegInf:
        return self

    __radd__ = __add__

    def __sub__(self, other: object) -> _NegInf:
        if other is self:
            raise NotExact("-inf - -inf")
        return self

    def __rsub__(self, other: object) -> _NegInf:
        raise NotExact("+inf")

    def __mul__(self, other: object) -> _NegInf:
        if other is self or not (isinstance(other, numbers.Real) and float(other) > 0):
            raise NotExact("-inf times a number not positive")
        return self

    __rmul__ = __mul__

    def __truediv__(self, other: object) -> _NegInf:
        return self.__mul__(other)


NEG_INF = _NegInf()


# ---- reading numbers -------------------------------------------------------------------------

def simplest_between(lo: Fraction, hi: Fraction) -> Fraction:
    """The rational with the smallest denominator (then numerator) in [lo, hi]."""
    if lo <= 0 <= hi:
        return Fraction(0)
    if hi < 0:
        return -simplest_between(-hi, -lo)
    if math.ceil(lo) <= hi:
        return Fraction(math.ceil(lo))
    floor = math.floor(lo)
    return floor + 1 / simplest_between(1 / (hi - floor), 1 / (lo - floor))


def read_float(x: float, dtype: str = "float32") -> Fraction | _NegInf:
    """The simplest rational that type `dtype` rounds to `x` (-inf as NEG_INF); a half
    precision value exactly, as its grid is too coarse to stand for a rational."""
    if x == float("-inf"):
        return NEG_INF
    if not math.isfinite(x):
        raise NotExact(f"the value {x}")
    # bfloat16 has no nextafter in numpy: its values are read in float32's finer grid
    kind = np.dtype(dtype) if dtype in ("float16", "float32", "float64") else np.dtype(np.float32)
    value = kind.type(x)
    if value == 0:
        return Fraction(0)
    exact = Fraction(float(value))
    if dtype in HALF:
        return exact  # a coarse grid: 0.7 in float16 is 0.70019..., not 7/10
    with np.errstate(over="ignore"):
        below = np.nextafter(value, kind.type(-np.inf), dtype=kind)
        above = np.nextafter(value, kind.type(np.inf), dtype=kind)
    # the largest finite value (a mask's "minus infinity" in many exporters) has no neighbour
    # beyond it: its interval ends at itself
    for share in (2, 4):  # half the gap to each neighbour; a quarter where a tie went away
        low = exact + (Fraction(float(below)) - exact) / share if np.isfinite(below) else exact
        high = exact + (Fraction(float(above)) - exact) / share if np.isfinite(above) else exact
        read = simplest_between(low, high)
        if kind.type(float(read)) == value:
            break
    return read


def read_attribute(x: float, declared: str) -> Fraction | _NegInf:
    """A float attribute: one declared float32 (an epsilon) as `read_float` reads a float32
    weight, so that the weight a rewrite makes of it reads the same; one in float64 (a
    scale) exactly, as the products of such values a rewrite computes are exact there."""
    return read_float(x, "float32") if declared == "float32" else Fraction(x)


def exact_array(a: np.ndarray) -> np.ndarray:
    """An array read exactly: integers as they are, floats as `read_float` reads them."""
    a = np.asarray(a)
    if a.dtype == object:
        return a
    out = np.empty(a.shape, dtype=object)
    dtype = str(a.dtype)
    for index in np.ndindex(a.shape):
        item = a[index].item()
        out[index] = (Fraction(int(item)) if a.dtype.kind in "biu"
                      else read_float(float(item), dtype))
    return out


def to_floats(a: np.ndarray) -> np.ndarray:
    return np.asarray([float(v) for v in a.flat], dtype=np.float64).reshape(a.shape)


# ---- random functions --------------------------------------------------------------------------

#: How many random-function values this process has computed: `exact_run` tells from it
#: whether an evaluation went through one.
_USES = [0]


def _canonical(part: Any) -> object:
    """A value as the hash reads it: the same number the same way, however it was made (a
    Python int from a sum's start, a Fraction from a product)."""
    if isinstance(part, tuple):
        return tuple(_canonical(p) for p in part)
    return part if isinstance(part, (str, _NegInf)) else Fraction(part)


def hashed(key: str, *parts: object, whole: bool = False) -> Fraction:
    """A random function's value at `parts`: a keyed hash onto POINTS values, eighths in
    [-SPREAD, SPREAD], or whole numbers as many (`whole`: a value of an integer type)."""
    _USES[0] += 1
    text = repr((key, _canonical(parts)))
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    k = int.from_bytes(digest, "little") % POINTS - SPREAD * EIGHTHS
    return Fraction(k) if whole else Fraction(k, EIGHTHS)


def elementwise(key: str, *xs: np.ndarray) -> np.ndarray:
    """A random function applied element by element (operands broadcast together)."""
    parts = np.broadcast_arrays(*xs)
    out = np.empty(parts[0].shape, dtype=object)
    for index in np.ndindex(out.shape):
        args: tuple[Any, ...] = tuple(p[index] for p in parts)
        if any(a is NEG_INF for a in args):
            raise NotExact(f"{key} of -inf")
        out[index] = hashed(key, *args)
    return out


def softmax_rows(x: np.ndarray, axis: int, guarded: bool = False) -> np.ndarray:
    """Softmax along `axis` as a random function of each row, zero where the row holds -inf
    (what masking relies on). A row of -inf alone is zeros for the guarded softmax and not
    a number for softmax. A scalar is a row of one (numpy reduces a scalar along axis 0)."""
    if x.ndim == 0:
        return softmax_rows(x.reshape(1), 0, guarded).reshape(())
    moved = np.moveaxis(x, axis, -1)
    out = np.empty(moved.shape, dtype=object)
    for index in np.ndindex(moved.shape[:-1]):
        row = tuple(moved[index])
        if all(v is NEG_INF for v in row) and not guarded:
            raise NotExact("softmax of a row of -inf")
        for i, v in enumerate(row):
            out[index + (i,)] = Fraction(0) if v is NEG_INF else hashed("softmax", row, i)
    return np.moveaxis(out, -1, axis)


# ---- the operators ---------------------------------------------------------------------------

FLOAT_WIDTH = {"float16": 1, "bfloat16": 1, "float32": 2, "float64": 3}
HALF = frozenset({"float16", "bfloat16"})
INTEGER_RANGE = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767),
                 "uint16": (0, 65535), "int32": (-2 ** 31, 2 ** 31 - 1)}


def holds(to: str, exact_in: str) -> bool:
    """Whether type `to` holds every value of type `exact_in` (float16 in float32)."""
    return to == exact_in or (to in FLOAT_WIDTH and exact_in in FLOAT_WIDTH and
                              FLOAT_WIDTH[to] > FLOAT_WIDTH[exact_in] and
                              {to, exact_in} != HALF)


def rounded(x: np.ndarray, to: str) -> np.ndarray:
    """A value rounded to type `to`: a random function of the exact value (the same from
    whatever type held it, since the value itself is exact)."""
    return elementwise(f"round to {to}", x)


def _activation(name: str, x: np.ndarray) -> np.ndarray:
    return x if name == "none" else elementwise(name, x)


def _matmul(attrs: Mapping[str, Any], xs: Sequence[np.ndarray]) -> np.ndarray:
    return _activation(attrs.get("activation", "none"), np.matmul(xs[0], xs[1]))


def _conv(attrs: Mapping[str, Any], xs: Sequence[np.ndarray]) -> np.ndarray:
    from graphsub.ops.conv import conv2d_reference, resolve_pads, window_out

    x, w = xs[0], xs[1]
    pads = resolve_pads(attrs["padding"], x.shape[2:], w.shape[2:], attrs["stride"],
                        attrs["dilation"])
    top, left, bottom, right = pads
    size = tuple(int(window_out(n, k, s, d, lo, hi, "conv2d")) for n, k, s, d, lo, hi in
                 zip(x.shape[2:], w.shape[2:], attrs["stride"], attrs["dilation"],
                     (top, left), (bottom, right)))
    # padded here with exact zeros (the reference pads with 0.0, a float among fractions)
    padded = np.pad(  # type: ignore[call-overload]  # numpy's stubs: no object fill value
        x, ((0, 0), (0, 0), (top, bottom), (left, right)), constant_values=Fraction(0))
    out = conv2d_reference(padded, w, xs[2] if len(xs) > 2 else None, attrs["stride"],
                           (0, 0, 0, 0), attrs["dilation"], size)
    return _activation(attrs.get("activation", "none"), out)


def _avg_pool(attrs: Mapping[str, Any], xs: Sequence[np.ndarray]) -> Any:
    """Window sums over the kernel's area; padded cells count as zeros where
    count_include_pad says so (elsewhere the divisor varies: not modelled)."""
    from graphsub.ops.conv import resolve_pads

    (kh, kw), (sh, sw), x = attrs["kernel"], attrs["stride"], xs[0]
    top, left, bottom, right = resolve_pads(attrs["padding"], x.shape[2:], (kh, kw),
                                            (sh, sw), (1, 1))
    if any((top, left, bottom, right)) and not attrs.get("count_include_pad"):
        raise NotExact("average pooling that leaves padded cells out")
    x = np.pad(  # type: ignore[call-overload]  # numpy's stubs: no object fill value
        x, ((0, 0), (0, 0), (top, bottom), (left, right)), constant_values=Fraction(0))
    ho, wo = (x.shape[2] - kh) // sh + 1, (x.shape[3] - kw) // sw + 1
    out = np.empty(x.shape[:2] + (ho, wo), dtype=object)
    for i in range(ho):
        for j in range(wo):
            out[:, :, i, j] = x[:, :, i * sh:i * sh + kh, j * sw:j * sw + kw].sum(axis=(2, 3))
    return out / (kh * kw)


def _dequantize(attrs: Mapping[str, Any], xs: Sequence[np.ndarray]) -> Any:
    q, axis = xs[0], attrs["axis"]
    shifted = q - _along(xs[2], axis, q.ndim) if len(xs) > 2 else q
    return shifted * _along(xs[1], axis, q.ndim)


def _quantize(attrs: Mapping[str, Any], xs: Sequence[np.ndarray]) -> np.ndarray:
    """round(x / scale) + zero point, saturated to the type: an integer in the type's range
    is left as it is (what rounding and saturating do to one); anything else is a random
    function of it."""
    x, axis, dtype = xs[0], attrs["axis"], attrs["dtype"]
    if dtype not in INTEGER_RANGE:
        raise NotExact(f"quantizing to {dtype}")
    low, high = INTEGER_RANGE[dtype]
    zero = _along(xs[2], axis, x.ndim) if len(xs) > 2 else np.asarray(Fraction(0), dtype=object)
    ratio, zero = np.broadcast_arrays(x / _along(xs[1], axis, x.ndim), zero)
    out = np.empty(ratio.shape, dtype=object)
    for index in np.ndindex(out.shape):
        t: Any = ratio[index]
        z: Any = zero[index]
        if t is NEG_INF:
            raise NotExact("quantizing -inf")
        whole = Fraction(t).denominator == 1
        value = t + z
        out[index] = value if whole and low <= value <= high else hashed(
            f"quantize {dtype}", t, z, whole=True)
    return out


def _attention(attrs: Mapping[str, Any], xs: Sequence[np.ndarray]) -> Any:
    """Its definition (ops.attention's numpy reference): softmax(scale * q k^T + mask) v, keys
    and values repeated over grouped heads, left out where a boolean mask or the causal flag
    says so."""
    q, k, v = xs[:3]
    group = q.shape[-3] // k.shape[-3]
    k, v = np.repeat(k, group, axis=-3), np.repeat(v, group, axis=-3)
    scores = np.matmul(q, np.swapaxes(k, -1, -2)) * read_attribute(attrs["scale"], "float64")
    keep = np.ones(scores.shape, dtype=bool)
    if attrs["causal"]:
        keep &= causal_mask(*scores.shape[-2:])
    if len(xs) > 3:
        if xs[3].dtype == bool:  # exact_evaluate hands a boolean mask over as one
            keep &= xs[3]
        else:
            scores = scores + xs[3]
    scores = np.where(keep, scores, NEG_INF)  # type: ignore[call-overload]  # an object scalar
    return np.matmul(softmax_rows(scores, -1, guarded=True), v)


def _batch_norm(attrs: Mapping[str, Any], xs: Sequence[np.ndarray]) -> Any:
    """(x - mean) * scale / sqrt(var + epsilon) + bias over the channel axis."""
    x, scale, bias, mean, var = xs
    shape = (1, -1) + (1,) * (x.ndim - 2)
    root = elementwise("sqrt", var + read_attribute(attrs["epsilon"], "float32"))
    inv = scale / root
    return (x - mean.reshape(shape)) * inv.reshape(shape) + bias.reshape(shape)


#: GELU's constants: 1/sqrt(2), sqrt(2/pi) and the cubic's 0.044715, read in float32.
INV_SQRT2, TANH_SCALE, TANH_CUBIC = (read_float(c) for c in
                                     (1 / math.sqrt(2), math.sqrt(2 / math.pi), 0.044715))


def _gelu(attrs: Mapping[str, Any], xs: Sequence[np.ndarray]) -> Any:
    """Its definition: x/2 (1 + erf(x / sqrt 2)), or with tanh(sqrt(2/pi) (x + 0.044715 x^3))."""
    x = xs[0]
    if attrs["approximate"] == "tanh":
        inner = elementwise("tanh", x * TANH_SCALE * (1 + TANH_CUBIC * x * x))
    else:
        inner = elementwise("erf", x * INV_SQRT2)
    return x * Fraction(1, 2) * (1 + inner)


#: An operator's exact semantics: its result as numpy's object arithmetic makes it, an array
#: or, from 0-d operands, a bare value (`_run` makes it an array).
Exact = Callable[[Mapping[str, Any], Sequence[np.ndarray]], Any]


def _random_function(name: str) -> Exact:
    return lambda attrs, xs: elementwise(name, *xs)


class _ReluValue(Fraction):
    """A value relu gave: relu leaves it as it is. Arithmetic on it gives a plain Fraction, so
    the mark stays only where the value is moved, not computed with."""


def _relu(attrs: Mapping[str, Any], xs: Sequence[np.ndarray]) -> np.ndarray:
    """Relu as a random function, with its idempotence built in (relu(relu(x)) = relu(x), what
    rules that drop a repeated relu rely on): a value relu gave is left as it is."""
    x = np.asarray(xs[0], dtype=object)
    out = np.empty(x.shape, dtype=object)
    for index in np.ndindex(x.shape):
        v = x[index]
        out[index] = v if isinstance(v, _ReluValue) else _ReluValue(hashed("relu", v))
    return out


#: Operators whose numpy reference moves elements without arithmetic: exact on object arrays.
MOVES = frozenset({"concat", "split", "reshape", "transpose", "expand", "squeeze",
                   "unsqueeze", "identity", "enlarge", "slice"})

EXACT: dict[str, Exact] = {
    "add": lambda attrs, xs: xs[0] + xs[1],
    "sub": lambda attrs, xs: xs[0] - xs[1],
    "mul": lambda attrs, xs: xs[0] * xs[1],
    "smul": lambda attrs, xs: xs[0] * xs[1],
    "div": lambda attrs, xs: xs[0] / xs[1],
    "neg": lambda attrs, xs: -xs[0],
    "dropout": lambda attrs, xs: xs[0],  # inference: the identity
    "flatten": lambda attrs, xs: xs[0].reshape(
        math.prod(xs[0].shape[:attrs["axis"]]), math.prod(xs[0].shape[attrs["axis"]:])),
    "matmul": _matmul,
    "conv2d": _conv,
    "avg_pool2d": _avg_pool,
    "dequantize": _dequantize,
    "quantize": _quantize,
    "attention": _attention,
    "batch_norm": _batch_norm,
    "gelu": _gelu,
    "softmax": lambda attrs, xs: softmax_rows(xs[0], attrs["axis"]),
    "guarded_softmax": lambda attrs, xs: softmax_rows(xs[0], attrs["axis"], guarded=True),
    "relu": _relu,
    **{name: _random_function(name) for name in ("sigmoid", "tanh", "erf", "sqrt", "exp")},
}

def _run(op: str, attrs: Attrs, args: list[np.ndarray]) -> tuple[np.ndarray, ...]:
    """One operator's exact outputs. A case its exact semantics does not meet (a softmax over
    a scalar) leaves the instance untested rather than ending the verification."""
    try:
        if op in EXACT:
            return (np.asarray(EXACT[op](attrs, args), dtype=object),)
        return tuple(np.asarray(r, dtype=object) for r in get_op(op).evaluate(attrs, args))
    except (ValueError, IndexError, TypeError, np.exceptions.AxisError) as exc:
        raise NotExact(f"{op} on operands of shapes "
                       f"{', '.join(str(a.shape) for a in args)} ({exc})") from None


def integer_range(dtype: str) -> tuple[int, int] | None:
    """The values an integer type holds (every width, signed and unsigned: a uint32 difference
    2 - 3 wraps, it is not -1), None for a type that is not an integer's."""
    try:
        kind = np.dtype(dtype)
    except TypeError:
        return None
    if kind.kind not in "iu":
        return None
    info = np.iinfo(kind)
    return int(info.min), int(info.max)


#: Operators whose integer results wrap exactly: sums and products (a ring's operations, so
#: the exact result modulo 2**bits is what wrapping arithmetic computes, in whatever order it
#: sums) and the truncating quotient.
WRAPPING = frozenset({"add", "sub", "mul", "neg", "matmul", "reduce_sum", "div"})


def _wrapped(v: Fraction, op: str, low: int, high: int) -> Fraction:
    """An integer operator's result as its type holds it: a quotient truncated toward zero
    (ONNX's integer division), then wrapped into the type's range."""
    whole = math.trunc(v) if op == "div" else int(v)
    return Fraction((whole - low) % (high - low + 1) + low)


def _in_type(op: str, x: np.ndarray, dtype: str) -> np.ndarray:
    """An operator's exact result as its type holds it. Arithmetic in float32 and float64 is
    exact, as the axioms take it; in half precision it rounds (graphsub's operators compute
    in float32 there and round), a random function of the exact result, so moving work into
    half precision is not equal; in an integer type a result that is a whole number in the
    type's range is itself, a sum, a product or a quotient (WRAPPING) wraps and truncates as
    the type does, exactly, and anything else (an integer mean) is a random function of it,
    one per operator."""
    if dtype in HALF:
        return rounded(x, dtype)
    if (bounds := integer_range(dtype)) is None:
        return x
    low, high = bounds
    out = np.empty(x.shape, dtype=object)
    for index in np.ndindex(x.shape):
        v: Any = x[index]
        if v is NEG_INF:
            out[index] = hashed(f"{op} in {dtype}", v, whole=True)
        elif Fraction(v).denominator == 1 and low <= v <= high:
            out[index] = v
        elif op in WRAPPING and (op == "div" or Fraction(v).denominator == 1):
            out[index] = _wrapped(Fraction(v), op, low, high)
        else:
            out[index] = hashed(f"{op} in {dtype}", v, whole=True)
    return out


def exact_run(graph: Graph, feeds: Mapping[str, np.ndarray]
              ) -> tuple[dict[str, np.ndarray], bool]:
    """exact_evaluate's outputs, and whether any went through a random function (where
    not, they must agree with the numpy reference to rounding)."""
    before = _USES[0]
    outputs = exact_evaluate(graph, feeds)
    return outputs, _USES[0] != before


def exact_evaluate(graph: Graph, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The graph's outputs computed exactly from the given inputs and its own weights. Each
    value carries the narrowest type that holds it exactly, which decides whether a cast
    rounds; an operator in half precision that goes through a random function rounds its
    result (graphsub's operators compute in float32 there and round, runtime.reference)."""
    values: dict[Value, np.ndarray] = {}
    exact_in: dict[Value, str] = {}
    for nid in graph.topo_order():
        node = graph[nid]
        dtypes = [t.dtype for t in node.outputs]
        if node.op == "input":
            outs: tuple[np.ndarray, ...] = (exact_array(feeds[node.attrs["name"]]),)
        elif node.op == "weight":
            outs = (exact_array(node.attrs["value"].array),)
        elif node.op == "causal_mask":  # a constant of its sizes, as a weight is
            shaped = [np.empty(values[v].shape) for v in node.inputs]
            outs = (exact_array(get_op("causal_mask").evaluate(node.attrs, shaped)[0]),)
        else:
            args = [values[v] for v in node.inputs]
            attrs = node.attrs
            if node.op == "attention" and len(args) > 3 and exact_in[node.inputs[3]] == "bool":
                args[3] = to_floats(args[3]).astype(bool)
            if node.op == "cast":
                to, source = attrs["to"], exact_in[node.inputs[0]]
                outs = (args[0],) if holds(to, source) else (rounded(args[0], to),)
                dtypes[0] = source if holds(to, source) else to
            elif node.op in EXACT or node.op in MOVES:
                outs = _run(node.op, attrs, args)
            else:
                raise NotExact(f"operator {node.op}")
            if node.op not in MOVES and node.op != "cast":
                outs = tuple(_in_type(node.op, out, t) for out, t in zip(outs, dtypes))
        for i, out in enumerate(outs):
            if any(isinstance(v, float) for v in out.flat):
                raise NotExact(f"{node.op}: a float among the exact values")
            values[Value(nid, i)] = out
            exact_in[Value(nid, i)] = dtypes[i]
    return {name: values[v] for name, v in zip(graph.output_names, graph.outputs)}
