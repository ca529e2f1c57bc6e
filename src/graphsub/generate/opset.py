"""The generator's operators (TASO Table 1), each with one semantics that runs on exact
integers modulo a prime (for fingerprints) and on floats (for the random tests).

Integers avoid floating-point noise in fingerprints (TASO section 2, after [37]): two graphs
that compute the same polynomial function of their inputs give identical residues. relu is
replaced by the non-linear x(x+1)+1 (TASO section 2), so that its zeros do not make many
unrelated graphs look equal.

Split needs to know where to cut: as in TASO, tensors carry the *seams* left by concat along
each axis, propagated through operators that preserve them, and split cuts at a seam.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphsub.rules.ast import Call

#: The modulus of integer evaluation: products of two residues and sums of a few thousand of
#: them stay inside int64.
PRIME = 1_000_003


Seam = tuple[int, Any]  # (position, symbolic position as a rule expression)


@dataclass(frozen=True)
class GenTensor:
    """A tensor during enumeration: exact value (mod PRIME), float test values, its dimensions
    as rule expressions over the input variables, and its seams."""

    shape: tuple[int, ...]
    exact: np.ndarray          # int64, reduced mod PRIME
    tests: tuple[np.ndarray, ...]  # float64 values, one per test case
    dims: tuple[Any, ...] = ()     # symbolic size of each axis
    seams: tuple[tuple[Seam, ...], ...] = ()  # per axis: where a concat joined parts

    def seams_on(self, axis: int) -> tuple[Seam, ...]:
        return self.seams[axis] if axis < len(self.seams) else ()


Kernel = Callable[[Sequence[np.ndarray], dict[str, Any], bool], tuple[np.ndarray, ...]]


def _mod(x: np.ndarray, exact: bool) -> np.ndarray:
    return np.mod(x, PRIME) if exact else x


def _fake_relu(x: np.ndarray, exact: bool) -> np.ndarray:
    return _mod(x * (x + 1) + 1, exact)


@dataclass(frozen=True)
class GenOp:
    """One generator operator: graphsub op name, attribute variants, arity, semantics."""

    name: str           # the graphsub operator it stands for
    arity: int
    kernel: Kernel | None  # None: the enumerator evaluates it (split cuts at a seam)
    attr_variants: tuple[dict[str, Any], ...] = field(default_factory=lambda: ({},))
    commutative: bool = False
    outputs: int = 1
    valid: Callable[[Sequence[GenTensor], dict[str, Any]], bool] = lambda ins, attrs: True
    seams: Callable[[Sequence[GenTensor], dict[str, Any]], tuple[tuple[tuple[Seam, ...], ...], ...]] = \
        lambda ins, attrs: ((),)
    dims: Callable[[Sequence[GenTensor], dict[str, Any]], tuple[tuple[Any, ...], ...]] = \
        lambda ins, attrs: (ins[0].dims,)


def _same_shape(ins: Sequence[GenTensor], attrs: dict[str, Any]) -> bool:
    return ins[0].shape == ins[1].shape  # TASO's element-wise ops do not broadcast


def _shared_seams(ins: Sequence[GenTensor], attrs: dict[str, Any]):
    # An element-wise result keeps a seam when every input that has seams has the same ones.
    with_seams = [t.seams for t in ins if any(t.seams)]
    return ((with_seams[0] if with_seams and all(s == with_seams[0] for s in with_seams) else ()),)


def _matmul_valid(ins: Sequence[GenTensor], attrs: dict[str, Any]) -> bool:
    a, b = ins
    return len(a.shape) == len(b.shape) >= 2 and a.shape[-1] == b.shape[-2] and \
        a.shape[:-2] == b.shape[:-2]


def _matmul_seams(ins: Sequence[GenTensor], attrs: dict[str, Any]):
    a, b = ins
    rank = len(a.shape)
    seams = [()] * rank
    seams[rank - 2] = a.seams_on(rank - 2)  # row blocks of the left operand
    seams[rank - 1] = b.seams_on(rank - 1)  # column blocks of the right operand
    return (tuple(seams),)


def _matmul(xs: Sequence[np.ndarray], attrs: dict[str, Any], exact: bool) -> tuple[np.ndarray, ...]:
    return (_mod(np.matmul(xs[0], xs[1]), exact),)


def _transpose_valid(ins: Sequence[GenTensor], attrs: dict[str, Any]) -> bool:
    return len(ins[0].shape) >= 2


def _transpose(xs, attrs, exact):
    return (np.swapaxes(xs[0], -1, -2).copy(),)


def _transpose_seams(ins, attrs):
    s = list(ins[0].seams) + [()] * (len(ins[0].shape) - len(ins[0].seams))
    s[-1], s[-2] = s[-2], s[-1]
    return (tuple(s),)


def _concat_valid(ins, attrs):
    a, b = ins
    ax = attrs["axis"]
    return len(a.shape) == len(b.shape) > ax and all(
        x == y for i, (x, y) in enumerate(zip(a.shape, b.shape)) if i != ax)


def _concat(xs, attrs, exact):
    return (np.concatenate(xs, axis=attrs["axis"]),)


def _concat_seams(ins, attrs):
    a, b = ins
    ax = attrs["axis"]
    seams = [()] * len(a.shape)
    joined = list(a.seams_on(ax)) + [(a.shape[ax], a.dims[ax])]
    joined += [(a.shape[ax] + pos, Call("+", (a.dims[ax], e))) for pos, e in b.seams_on(ax)]
    seams[ax] = tuple(joined)
    return (tuple(seams),)


def _concat_dims(ins, attrs):
    a, b = ins
    ax = attrs["axis"]
    dims = list(a.dims)
    dims[ax] = Call("+", (a.dims[ax], b.dims[ax]))
    return (tuple(dims),)


def _matmul_dims(ins, attrs):
    return (ins[0].dims[:-1] + ins[1].dims[-1:],)


def _transpose_dims(ins, attrs):
    d = list(ins[0].dims)
    d[-1], d[-2] = d[-2], d[-1]
    return (tuple(d),)


def _split_valid(ins, attrs):
    return len(ins[0].seams_on(attrs["axis"])) == 1  # split_{0,1}: exactly one seam to cut at


def _smul_valid(ins, attrs):
    return ins[1].shape == ()


def _scalar_seams(ins, attrs):
    return (ins[0].seams,)


OPS: dict[str, GenOp] = {
    "ewadd": GenOp("add", 2, lambda xs, a, e: (_mod(xs[0] + xs[1], e),), commutative=True,
                   valid=_same_shape, seams=_shared_seams),
    "ewmul": GenOp("mul", 2, lambda xs, a, e: (_mod(xs[0] * xs[1], e),), commutative=True,
                   valid=_same_shape, seams=_shared_seams),
    "smul": GenOp("smul", 2, lambda xs, a, e: (_mod(xs[0] * xs[1], e),), valid=_smul_valid,
                  seams=_scalar_seams),
    "relu": GenOp("relu", 1, lambda xs, a, e: (_fake_relu(xs[0], e),), seams=_scalar_seams),
    "transpose": GenOp("transpose", 1, _transpose, valid=_transpose_valid, seams=_transpose_seams,
                       dims=_transpose_dims),
    "matmul": GenOp("matmul", 2, _matmul, valid=_matmul_valid, seams=_matmul_seams,
                    dims=_matmul_dims),
    "concat": GenOp("concat", 2, _concat, attr_variants=({"axis": 0}, {"axis": 1}),
                    valid=_concat_valid, seams=_concat_seams, dims=_concat_dims),
    "split": GenOp("split", 1, None, attr_variants=({"axis": 0}, {"axis": 1}), outputs=2,
                   valid=_split_valid),
}

DEFAULT_OPS = ("ewadd", "ewmul", "smul", "relu", "transpose", "matmul", "concat", "split")
