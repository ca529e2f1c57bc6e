"""The generator's operators (TASO Table 1) and the tensors they work on.

Every operator has two semantics. The *exact* one runs on integers modulo a prime and gives
the fingerprints (TASO section 2, after [37]): graphs that compute the same polynomial of their
inputs give identical residues, free of floating-point noise; division (average pooling, the
pooling constant) is multiplication by a modular inverse. relu is replaced there by the
non-linear x(x+1)+1, so that its zeros do not make unrelated graphs look equal. The *float* one
is graphsub's own operator (`graphsub.ops`), used for the random tests that decide candidates,
so a generated rule is tested against exactly the semantics the optimizer rewrites.

Split needs to know where to cut: as in TASO, tensors carry the *seams* left by concat along
each axis, propagated through operators that preserve them, and split cuts at a seam. Tensors
also carry their dimensions as rule expressions over the input variables, which become the
split sizes and constant shapes of emitted rules.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from graphsub.errors import GraphsubError
from graphsub.tensors.types import Attrs, TensorType
from graphsub.ops import get_op
from graphsub.ops.conv import pad_nchw, resolve_pads, windows
from graphsub.rules.ast import Call, Lit

#: The modulus of exact evaluation: products of two residues summed over a few thousand terms
#: stay inside int64.
PRIME = 1_000_003

Seam = tuple[int, Any]  # (position, symbolic position as a rule expression)
Seams = tuple[tuple[Seam, ...], ...]
Dims = tuple[Any, ...]


@dataclass(frozen=True)
class GenTensor:
    """A tensor during enumeration: exact value (mod PRIME), float test values (filled only
    when a graph is replayed for testing), dimensions as rule expressions, and seams."""

    shape: tuple[int, ...]
    exact: np.ndarray                      # int64, reduced mod PRIME
    tests: tuple[np.ndarray, ...] = ()     # float64, one per test case
    dims: Dims = ()
    seams: Seams = ()
    role: str = ""  # "data", "kernel" or "constant" for the enumeration's inputs

    def seams_on(self, axis: int) -> tuple[Seam, ...]:
        return self.seams[axis] if axis < len(self.seams) else ()


ExactKernel = Callable[[Sequence[np.ndarray], dict[str, Any]], tuple[np.ndarray, ...]]
Restriction = Callable[[Sequence[GenTensor], dict[str, Any]], bool]


@dataclass(frozen=True)
class GenOp:
    """One generator operator: the graphsub operator it stands for, its attribute variants,
    its exact semantics and how it moves seams and dimensions."""

    key: str                 # the generator's name (--ops)
    op: str                  # graphsub operator
    arity: int
    exact: ExactKernel | None          # None: graphsub's evaluation on int64, then mod
    attr_variants: tuple[dict[str, Any], ...] = ({},)
    commutative: bool = False
    outputs: int = 1
    restrict: Restriction = lambda ins, attrs: True
    seams: Callable[[Sequence[GenTensor], dict[str, Any]], tuple[Seams, ...]] = \
        lambda ins, attrs: ((),)
    dims: Callable[[Sequence[GenTensor], dict[str, Any]], tuple[Dims, ...]] = \
        lambda ins, attrs: (ins[0].dims,)
    description: str = ""


def inverse(n: int) -> int:
    return pow(int(n), PRIME - 2, PRIME)


def fake_relu(x: np.ndarray) -> np.ndarray:
    y: np.ndarray = np.mod(x * (x + 1) + 1, PRIME)
    return y


# ---- restrictions (TASO's generator conventions) ---------------------------------------------

def _same_shape(ins: Sequence[GenTensor], attrs: dict[str, Any]) -> bool:
    return ins[0].shape == ins[1].shape  # TASO's element-wise ops do not broadcast


def _scalar_second(ins: Sequence[GenTensor], attrs: dict[str, Any]) -> bool:
    return ins[1].shape == () and ins[0].shape != ()


def _rank2(ins: Sequence[GenTensor], attrs: dict[str, Any]) -> bool:
    return len(ins[0].shape) == 2


def _at_one_seam(ins: Sequence[GenTensor], attrs: dict[str, Any]) -> bool:
    return len(ins[0].seams_on(attrs["axis"])) == 1  # split_{0,1}: one seam to cut at


def _conv_operands(ins: Sequence[GenTensor], attrs: dict[str, Any]) -> bool:
    """TASO's conventions: input kernels are never a convolution's data, and data inputs
    (images) are never its kernel. Computed tensors can be either, and the group count follows
    the shapes, as in graphsub's conv2d (TASO's rules 99 and 130 merge two convolutions into
    one with two groups)."""
    return ins[0].role not in ("kernel", "constant") and ins[1].role != "data"


def _enlarge_input(ins: Sequence[GenTensor], attrs: dict[str, Any]) -> bool:
    # enlarge only applies to input kernels (TASO section 2), and only to smaller ones
    t = ins[0]
    k = attrs["kernel"]
    return t.role == "kernel" and len(t.shape) == 4 and t.shape[2] <= k[0] \
        and t.shape[3] <= k[1] and t.shape[2:] != tuple(k)


# ---- seams and dimensions ---------------------------------------------------------------------

def _keep_seams(ins: Sequence[GenTensor], attrs: dict[str, Any]) -> tuple[Seams, ...]:
    return (ins[0].seams,)


def _shared_seams(ins: Sequence[GenTensor], attrs: dict[str, Any]) -> tuple[Seams, ...]:
    # An element-wise result keeps a seam when every input that has seams has the same ones.
    with_seams = [t.seams for t in ins if any(t.seams)]
    return ((with_seams[0] if with_seams and all(s == with_seams[0] for s in with_seams) else ()),)


def _batch_channel_seams(ins: Sequence[GenTensor], attrs: dict[str, Any]) -> tuple[Seams, ...]:
    """Pooling and enlarge keep the blocks of axes 0 and 1."""
    return ((ins[0].seams_on(0), ins[0].seams_on(1)),)


def _matmul_seams(ins: Sequence[GenTensor], attrs: dict[str, Any]) -> tuple[Seams, ...]:
    a, b = ins
    rank = len(a.shape)
    seams: list[tuple[Seam, ...]] = [()] * rank
    seams[rank - 2] = a.seams_on(rank - 2)  # row blocks of the left operand
    seams[rank - 1] = b.seams_on(rank - 1)  # column blocks of the right operand
    return (tuple(seams),)


def _matmul_dims(ins: Sequence[GenTensor], attrs: dict[str, Any]) -> tuple[Dims, ...]:
    return (ins[0].dims[:-1] + ins[1].dims[-1:],)


def _transpose_seams(ins: Sequence[GenTensor], attrs: dict[str, Any]) -> tuple[Seams, ...]:
    s = list(ins[0].seams) + [()] * (len(ins[0].shape) - len(ins[0].seams))
    s[-1], s[-2] = s[-2], s[-1]
    return (tuple(s),)


def _transpose_dims(ins: Sequence[GenTensor], attrs: dict[str, Any]) -> tuple[Dims, ...]:
    d = list(ins[0].dims)
    d[-1], d[-2] = d[-2], d[-1]
    return (tuple(d),)


def _concat_seams(ins: Sequence[GenTensor], attrs: dict[str, Any]) -> tuple[Seams, ...]:
    a, b = ins
    ax = attrs["axis"]
    seams: list[tuple[Seam, ...]] = [()] * len(a.shape)
    joined = list(a.seams_on(ax)) + [(a.shape[ax], a.dims[ax])]
    joined += [(a.shape[ax] + pos, Call("+", (a.dims[ax], e))) for pos, e in b.seams_on(ax)]
    seams[ax] = tuple(joined)
    return (tuple(seams),)


def _concat_dims(ins: Sequence[GenTensor], attrs: dict[str, Any]) -> tuple[Dims, ...]:
    a, b = ins
    ax = attrs["axis"]
    dims = list(a.dims)
    dims[ax] = Call("+", (a.dims[ax], b.dims[ax]))
    return (tuple(dims),)


def _conv_seams(ins: Sequence[GenTensor], attrs: dict[str, Any]) -> tuple[Seams, ...]:
    x, w = ins
    groups = x.shape[1] // w.shape[1]
    # batch blocks of the data; filter blocks of an ungrouped kernel become channel blocks
    return ((x.seams_on(0), w.seams_on(0) if groups == 1 else ()),)


def _conv_dims(ins: Sequence[GenTensor], attrs: dict[str, Any]) -> tuple[Dims, ...]:
    x, w = ins
    if attrs["stride"] == (1, 1) and attrs["padding"] == "same":
        return ((x.dims[0], w.dims[0], x.dims[2], x.dims[3]),)
    return ((x.dims[0], w.dims[0], None, None),)  # spatial sizes: never split, never named


def _pool_dims(ins: Sequence[GenTensor], attrs: dict[str, Any]) -> tuple[Dims, ...]:
    x = ins[0]
    if attrs["stride"] == (1, 1) and attrs["padding"] == "same":
        return (x.dims,)
    return (x.dims[:2] + (None, None),)


def _enlarge_dims(ins: Sequence[GenTensor], attrs: dict[str, Any]) -> tuple[Dims, ...]:
    k = attrs["kernel"]
    return (ins[0].dims[:2] + (Lit(k[0]), Lit(k[1])),)


# ---- exact kernels ----------------------------------------------------------------------------

def _mod_of(fn: Callable[..., np.ndarray]) -> ExactKernel:
    return lambda xs, attrs: (np.mod(fn(*xs), PRIME),)


@lru_cache(maxsize=None)
def _conv_plan(x_shape: tuple[int, ...], w_shape: tuple[int, ...], frozen: tuple[tuple[str, Any], ...]
               ) -> tuple[tuple[int, int, int, int], np.ndarray, tuple[int, int]]:
    """Padding, output size and gather indices (im2col) of one convolution geometry."""
    a = _attrs("conv2d", frozen, (x_shape, w_shape))
    out = get_op("conv2d").infer(a, (TensorType(x_shape, "float32"), TensorType(w_shape, "float32")))
    ho, wo = out[0].shape[2:]
    kh, kw = w_shape[2:]
    (sh, sw), (dh, dw) = a["stride"], a["dilation"]
    t, left, b, r = resolve_pads(a["padding"], x_shape[2:], (kh, kw), (sh, sw), (dh, dw))
    hp, wp = x_shape[2] + t + b, x_shape[3] + left + r
    rows = np.arange(kh)[:, None] * dh + np.arange(ho)[None, :] * sh  # (kh, ho)
    cols = np.arange(kw)[:, None] * dw + np.arange(wo)[None, :] * sw  # (kw, wo)
    flat = rows[:, None, :, None] * wp + cols[None, :, None, :]       # (kh, kw, ho, wo)
    return (t, left, hp, wp), flat.reshape(kh * kw, ho * wo), (ho, wo)


def _conv_exact(xs: Sequence[np.ndarray], attrs: dict[str, Any]) -> tuple[np.ndarray, ...]:
    x, w = xs
    (t, left, hp, wp), idx, (ho, wo) = _conv_plan(x.shape, w.shape, _freeze(attrs))
    n, c, h, wd = x.shape
    padded = np.zeros((n, c, hp, wp), dtype=np.int64)
    padded[:, :, t:t + h, left:left + wd] = x
    cout, cin_g = w.shape[:2]
    groups = c // cin_g
    cols = padded.reshape(n, c, hp * wp)[:, :, idx]             # (n, c, kh*kw, ho*wo)
    cols = cols.reshape(n, groups, cin_g * idx.shape[0], ho * wo)
    wg = w.reshape(groups, cout // groups, cin_g * idx.shape[0])
    out = np.mod(np.matmul(wg, cols), PRIME).reshape(n, cout, ho, wo)
    return (fake_relu(out) if attrs.get("activation") == "relu" else out,)


def _avg_pool_exact(xs: Sequence[np.ndarray], attrs: dict[str, Any]) -> tuple[np.ndarray, ...]:
    x = xs[0]
    kernel, stride = attrs["kernel"], attrs["stride"]
    pads = resolve_pads(attrs["padding"], x.shape[2:], kernel, stride)
    out_t = get_op("avg_pool2d").infer(_attrs("avg_pool2d", _freeze(attrs), (x.shape,)),
                                       (TensorType(x.shape, "float32"),))[0]
    out_hw = out_t.shape[2:]
    sums = windows(pad_nchw(x, pads), kernel, stride, (1, 1), out_hw).sum(axis=(-2, -1))
    ones = np.ones((1, 1) + x.shape[2:], dtype=np.int64)
    counts = windows(pad_nchw(ones, pads), kernel, stride, (1, 1), out_hw).sum(axis=(-2, -1))
    inv = np.vectorize(inverse, otypes=[np.int64])(counts)
    return (np.mod(np.mod(sums, PRIME) * inv, PRIME),)


def _structural(name: str) -> ExactKernel:
    """Operators that only move values: graphsub's evaluation runs on int64 unchanged."""
    def kernel(xs: Sequence[np.ndarray], attrs: dict[str, Any]) -> tuple[np.ndarray, ...]:
        a = _attrs(name, _freeze(attrs), tuple(x.shape for x in xs))
        return tuple(np.asarray(o, dtype=np.int64) for o in get_op(name).evaluate(a, xs))
    return kernel


def _freeze(attrs: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(attrs.items()))


@lru_cache(maxsize=None)
def _attrs(name: str, frozen: tuple[tuple[str, Any], ...], shapes: tuple[tuple[int, ...], ...]
           ) -> Attrs:
    """graphsub's canonical attributes for this operator on inputs of these shapes."""
    return get_op(name).make_attrs(dict(frozen), tuple(TensorType(s, "float32") for s in shapes))


@lru_cache(maxsize=None)
def infers(name: str, frozen: tuple[tuple[str, Any], ...],
           shapes: tuple[tuple[int, ...], ...]) -> tuple[tuple[int, ...], ...] | None:
    """Output shapes of graphsub's operator on these input shapes, or None when it does not
    apply (the generic validity test, memoized by shapes)."""
    try:
        a = _attrs(name, frozen, shapes)
        return tuple(t.shape for t in get_op(name).infer(a, tuple(
            TensorType(s, "float32") for s in shapes)))
    except (GraphsubError, ValueError, KeyError, TypeError, IndexError, ZeroDivisionError):
        return None


def float_eval(name: str, attrs: dict[str, Any], xs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    a = _attrs(name, _freeze(attrs), tuple(x.shape for x in xs))
    return tuple(np.asarray(o, dtype=np.float64) for o in get_op(name).evaluate(a, xs))


def _div_exact(xs: Sequence[np.ndarray], attrs: dict[str, Any]) -> tuple[np.ndarray, ...]:
    inv = np.vectorize(inverse, otypes=[np.int64])(xs[1])
    return (np.mod(xs[0] * inv, PRIME),)


def _opaque_unary(x: np.ndarray) -> np.ndarray:
    y: np.ndarray = np.mod(x * (x + 2) + 3, PRIME)
    return y


def _reduce_sum_exact(xs: Sequence[np.ndarray], attrs: dict[str, Any]) -> tuple[np.ndarray, ...]:
    return (np.mod(xs[0].sum(axis=1, keepdims=True), PRIME),)


def _reduce_seams(ins: Sequence[GenTensor], attrs: dict[str, Any]) -> tuple[Seams, ...]:
    return ((ins[0].seams_on(0), ()),)


def _reduce_dims(ins: Sequence[GenTensor], attrs: dict[str, Any]) -> tuple[Dims, ...]:
    return ((ins[0].dims[0], Lit(1)),)


# ---- constants (TASO's C_pool, I_conv, I_matmul, I_ewmul) --------------------------------------

def _c_pool(attrs: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    c, k = attrs["channels"], attrs["kernel"]
    n = k[0] * k[1]
    shape = (c, 1) + tuple(k)
    return np.full(shape, inverse(n), dtype=np.int64), np.full(shape, 1.0 / n)


def _i_conv(attrs: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    c, k = attrs["channels"], attrs["kernel"]
    w = np.zeros((c, c) + tuple(k))
    for i in range(c):
        w[i, i, k[0] // 2, k[1] // 2] = 1.0
    return w.astype(np.int64), w


def _i_matmul(attrs: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    eye = np.eye(attrs["size"])
    return eye.astype(np.int64), eye


def _i_ewmul(attrs: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    ones = np.ones(tuple(attrs["shape"]))
    return ones.astype(np.int64), ones


# ---- the table --------------------------------------------------------------------------------

_CONV_TASO = tuple({"stride": (1, 1), "padding": "same", "activation": a} for a in ("none", "relu"))
_CONV_EXTRA = tuple({"stride": s, "padding": p, "activation": a}
                    for s in ((1, 1), (2, 2)) for p in ("same", "valid") for a in ("none", "relu")
                    if (s, p) != ((1, 1), "same"))
_POOL_TASO = ({"kernel": (3, 3), "stride": (1, 1), "padding": "same"},)


def _op_table() -> dict[str, GenOp]:
    ops = [
        GenOp("ewadd", "add", 2, _mod_of(np.add), commutative=True, restrict=_same_shape,
              seams=_shared_seams, description="element-wise addition (no broadcasting)"),
        GenOp("ewmul", "mul", 2, _mod_of(np.multiply), commutative=True, restrict=_same_shape,
              seams=_shared_seams, description="element-wise multiplication (no broadcasting)"),
        GenOp("smul", "smul", 2, _mod_of(np.multiply), restrict=_scalar_second,
              seams=_keep_seams, description="multiplication by a scalar tensor"),
        GenOp("relu", "relu", 1, lambda xs, a: (fake_relu(xs[0]),), seams=_keep_seams,
              description="relu (x(x+1)+1 in fingerprints)"),
        GenOp("transpose", "transpose", 1, _structural("transpose"),
              attr_variants=({"perm": (1, 0)},), restrict=_rank2, seams=_transpose_seams,
              dims=_transpose_dims, description="transpose of a matrix"),
        GenOp("matmul", "matmul", 2, _mod_of(np.matmul), seams=_matmul_seams,
              dims=_matmul_dims, description="matrix multiplication"),
        GenOp("conv", "conv2d", 2, _conv_exact, attr_variants=_CONV_TASO,
              restrict=_conv_operands, seams=_conv_seams, dims=_conv_dims,
              description="convolution, stride 1, SAME, activation none/relu (grouped when "
                          "the kernel has fewer input channels)"),
        GenOp("conv-strided", "conv2d", 2, _conv_exact, attr_variants=_CONV_EXTRA,
              restrict=_conv_operands, seams=_conv_seams, dims=_conv_dims,
              description="convolution, stride 1/2 x SAME/VALID other than stride-1 SAME"),
        GenOp("enlarge", "enlarge", 1, _structural("enlarge"),
              attr_variants=({"kernel": (3, 3)},), restrict=_enlarge_input,
              seams=_batch_channel_seams, dims=_enlarge_dims,
              description="zero-pad an input kernel to 3x3"),
        GenOp("avg-pool", "avg_pool2d", 1, _avg_pool_exact, attr_variants=_POOL_TASO,
              seams=_batch_channel_seams, dims=_pool_dims,
              description="3x3 average pooling, stride 1, SAME"),
        GenOp("max-pool", "max_pool2d", 1, _structural("max_pool2d"), attr_variants=_POOL_TASO,
              seams=_batch_channel_seams, dims=_pool_dims,
              description="3x3 max pooling, stride 1, SAME"),
        GenOp("concat", "concat", 2, _structural("concat"),
              attr_variants=({"axis": 0}, {"axis": 1}), seams=_concat_seams, dims=_concat_dims,
              description="concatenation of two tensors on axis 0 or 1"),
        GenOp("split", "split", 1, None, attr_variants=({"axis": 0}, {"axis": 1}), outputs=2,
              restrict=_at_one_seam, description="split in two at a concatenation seam"),
        # Extension: the operator-fission primitives, each with an exact integer semantics.
        GenOp("sub", "sub", 2, _mod_of(np.subtract), restrict=_same_shape, seams=_shared_seams,
              description="element-wise subtraction (extension)"),
        GenOp("div", "div", 2, _div_exact, restrict=_same_shape, seams=_shared_seams,
              description="element-wise division: times the modular inverse (extension)"),
        GenOp("exp", "exp", 1, lambda xs, a: (_opaque_unary(xs[0]),), seams=_keep_seams,
              description="exp, modelled in fingerprints as an opaque non-linear function, so "
                          "identities of exp's own algebra are not found (extension)"),
        GenOp("reduce-sum", "reduce_sum", 1, _reduce_sum_exact,
              attr_variants=({"axes": (1,), "keepdims": True},), restrict=_rank2,
              seams=_reduce_seams, dims=_reduce_dims,
              description="sum over the last axis of a matrix, kept (extension)"),
    ]
    return {op.key: op for op in ops}


OPS: dict[str, GenOp] = _op_table()

#: Constant tensors, added as zero-input operators (TASO Table 1). Their shapes follow the
#: configuration's tensors; see `GeneratorConfig.constants`.
CONSTANTS: dict[str, Callable[[dict[str, Any]], tuple[np.ndarray, np.ndarray]]] = {
    "c-pool": _c_pool, "i-conv": _i_conv, "i-matmul": _i_matmul, "i-ewmul": _i_ewmul,
}

DEFAULT_OPS = ("ewadd", "ewmul", "smul", "relu", "transpose", "matmul", "conv", "enlarge",
               "avg-pool", "max-pool", "concat", "split")
