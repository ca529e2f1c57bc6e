"""The `causal_mask` operator: the lower triangle at the sizes its inputs carry, boolean or
additive, the same in the numpy reference, in onnxruntime (ConstantOfShape, Trilu, Expand)
and in its torch lowering, at several lengths."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import graphsub
from graphsub.errors import ShapeError
from graphsub.ir import GraphBuilder
from graphsub.ops import get_op
from graphsub.runtime import evaluate, run
from graphsub.tensors.symbolic import size_symbol
from tests.markers import requires_torch

SEQ = size_symbol("seq")


def expected(n: int, dtype: str, fill: float) -> np.ndarray:
    keep = np.tril(np.ones((n, n), dtype=bool))[None, None]
    return keep if dtype == "bool" else np.where(keep, 0.0, fill).astype(dtype)


@pytest.mark.parametrize("dtype,fill", [("bool", 0.0), ("float32", -3.0e38),
                                        ("float32", float("-inf"))])
def test_causal_mask_matches_onnxruntime_at_several_lengths(dtype, fill):
    b = GraphBuilder()
    x = b.input("x", (1, 3, SEQ, 4))
    y = b.causal_mask(x, shape=(1, 1, SEQ, SEQ), dtype=dtype, fill=fill,
                      sources=(("seq", 0, 2),))
    b.output(y, "y")
    g = b.build()
    assert g.type_of(y).dtype == dtype
    exported = graphsub.to_onnx(g)
    for n in (2, 5, 17):
        feeds = {"x": np.zeros((1, 3, n, 4), np.float32)}
        np.testing.assert_array_equal(evaluate(g, feeds)["y"], expected(n, dtype, fill))
        np.testing.assert_array_equal(run(exported, feeds)["y"], expected(n, dtype, fill))


def test_causal_mask_needs_two_axes_and_a_mask_type():
    b = GraphBuilder()
    x = b.input("x", (SEQ, 4))
    with pytest.raises(ShapeError, match="two axes"):
        b.causal_mask(x, shape=(SEQ,), sources=(("seq", 0, 0),))
    with pytest.raises(ShapeError, match="bool or a float"):
        b.causal_mask(x, shape=(SEQ, SEQ), dtype="int64", sources=(("seq", 0, 0),))
    with pytest.raises(ShapeError, match="no source"):
        b.causal_mask(x, shape=(SEQ, SEQ), sources=(("seq", 0, 3),))


@requires_torch
@pytest.mark.parametrize("dtype,fill", [("bool", 0.0), ("float32", -3.0e38)])
def test_the_torch_lowering_reads_the_length_from_the_shapes_it_is_given(dtype, fill):
    import torch

    lowering = SimpleNamespace(torch=torch, device="cpu", dtype=lambda name: getattr(torch, name))
    attrs = get_op("causal_mask").make_attrs(
        {"shape": (1, 1, SEQ, SEQ), "dtype": dtype, "fill": fill,
         "sources": (("seq", 0, 1),)}, ())
    fn = get_op("causal_mask").torch(lowering, attrs, (), ())
    for n in (2, 9):
        (y,) = fn(torch.zeros(1, n))
        np.testing.assert_array_equal(y.numpy(), expected(n, dtype, fill))
