"""The `sizes` operator: size expressions read from its inputs' shapes, the same in the
numpy reference and, written as Shape/Gather/arithmetic, in onnxruntime, at several sizes."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import graphsub
from graphsub.errors import ShapeError
from graphsub.ir import GraphBuilder
from graphsub.tensors.symbolic import floordiv, size_symbol
from graphsub.ops import get_op
from graphsub.runtime import evaluate, run
from tests.markers import requires_torch

BATCH, SEQ = size_symbol("batch"), size_symbol("seq")


@pytest.mark.parametrize("dtype,shape", [("int64", (4,)), ("int32", (2, 2))])
def test_sizes_match_onnxruntime_at_several_bindings(dtype, shape):
    b = GraphBuilder()
    x = b.input("x", (BATCH, SEQ, 4))
    values = (BATCH * SEQ, SEQ + 1, floordiv(SEQ - 3, 2) + 1, 7)
    y = b.sizes(x, values=values, shape=shape, dtype=dtype,
                sources=(("batch", 0, 0), ("seq", 0, 1)))
    b.output(y, "y")
    g = b.build()
    assert g.type_of(y).shape == shape and g.type_of(y).dtype == dtype
    exported = graphsub.to_onnx(g)
    for batch, seq in [(1, 3), (2, 8), (3, 11), (5, 64)]:
        feeds = {"x": np.zeros((batch, seq, 4), np.float32)}
        expected = np.array([batch * seq, seq + 1, (seq - 3) // 2 + 1, 7],
                            dtype=dtype).reshape(shape)
        np.testing.assert_array_equal(evaluate(g, feeds)["y"], expected)
        np.testing.assert_array_equal(run(exported, feeds)["y"], expected)


def test_sizes_needs_a_source_for_each_symbol():
    b = GraphBuilder()
    x = b.input("x", (BATCH, 4))
    with pytest.raises(ShapeError, match="no source"):
        b.sizes(x, values=(BATCH,), shape=(1,), sources=(("batch", 0, 3),))


@requires_torch
def test_the_torch_lowering_reads_the_sizes_from_the_shapes_it_is_given():
    import torch

    lowering = SimpleNamespace(torch=torch, device="cpu", dtype=lambda name: getattr(torch, name))
    attrs = get_op("sizes").make_attrs(
        {"values": (BATCH * SEQ, floordiv(SEQ - 3, 2) + 1), "shape": (2,), "dtype": "int32",
         "sources": (("batch", 0, 0), ("seq", 0, 1))}, ())
    fn = get_op("sizes").torch(lowering, attrs, (), ())
    for batch, seq in [(1, 3), (4, 9)]:
        (y,) = fn(torch.zeros(batch, seq))
        assert y.dtype == torch.int32 and y.tolist() == [batch * seq, (seq - 3) // 2 + 1]
