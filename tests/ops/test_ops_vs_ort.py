"""Every operator: numpy reference semantics against onnxruntime, on random shapes and
attributes (broadcasting, grouped/strided/dilated convolutions, padding modes, negative axes),
at the opsets whose export differs."""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from graphsub.errors import ShapeError
from graphsub.ops import all_ops
from tests.ops.helpers import check_op

OPSETS = st.sampled_from([13, 17, 21, 23])
dims = st.integers(1, 5)
shapes = st.lists(dims, min_size=0, max_size=4).map(tuple)
seeds = st.integers(0, 2 ** 31 - 1)


def rand(shape, seed, low=None, high=None, dtype=np.float32) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if low is not None:
        return rng.uniform(low, high, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


@st.composite
def broadcast_pair(draw):
    """Two shapes that broadcast: the second drops leading dims and sets some to 1."""
    out = draw(st.lists(dims, min_size=1, max_size=4))
    def variant():
        keep = draw(st.integers(0, len(out)))
        shape = out[len(out) - keep:]
        return tuple(1 if draw(st.booleans()) else d for d in shape)
    a, b = variant(), variant()
    if draw(st.booleans()):
        a = tuple(out)
    return a, b


UNARY = {
    "relu": None, "sigmoid": None, "tanh": None, "erf": None, "exp": None, "neg": None,
    "identity": None, "log": (0.1, 3.0), "sqrt": (0.0, 3.0), "reciprocal": (0.5, 3.0),
}


@pytest.mark.parametrize("op", sorted(UNARY))
@given(shape=shapes, seed=seeds)
def test_unary(op, shape, seed):
    rng = UNARY[op]
    x = rand(shape, seed, *(rng or (None, None)))
    check_op(op, [x])


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "pow"])
@given(pair=broadcast_pair(), seed=seeds)
def test_binary_broadcasting(op, pair, seed):
    a_shape, b_shape = pair
    a = rand(a_shape, seed, 0.5, 2.0) if op == "pow" else rand(a_shape, seed)
    b = rand(b_shape, seed + 1, 0.5, 2.0) if op in ("div", "pow") else rand(b_shape, seed + 1)
    check_op(op, [a, b])


def test_binary_shapes_that_do_not_broadcast_are_rejected():
    with pytest.raises(ShapeError, match="do not broadcast"):
        check_op("add", [rand((2, 3), 0), rand((4, 3), 1)])


@given(shape=shapes, seed=seeds)
def test_smul(shape, seed):
    check_op("smul", [rand(shape, seed), np.array(1.7, np.float32)], weights=[1])


@given(shape=shapes, seed=seeds, approximate=st.sampled_from(["none", "tanh"]), opset=OPSETS)
def test_gelu(shape, seed, approximate, opset):
    check_op("gelu", [rand(shape, seed)], {"approximate": approximate}, opset=opset)


@given(shape=shapes, seed=seeds, alpha=st.floats(0.0, 0.5))
def test_leaky_relu(shape, seed, alpha):
    check_op("leaky_relu", [rand(shape, seed)], {"alpha": alpha})


@given(shape=shapes, seed=seeds, lo=st.none() | st.floats(-1, 0), hi=st.none() | st.floats(0, 1))
def test_clip(shape, seed, lo, hi):
    check_op("clip", [rand(shape, seed)], {"min": lo, "max": hi})


@given(shape=shapes, seed=seeds, to=st.sampled_from(["float32", "int64", "int32", "float64"]))
def test_cast(shape, seed, to):
    check_op("cast", [rand(shape, seed) * 10], {"to": to})


@given(shape=shapes, seed=seeds)
def test_dropout_is_identity_at_inference(shape, seed):
    x = rand(shape, seed)
    (y,) = check_op("dropout", [x], {"ratio": 0.3})
    np.testing.assert_array_equal(x, y)


@st.composite
def matmul_shapes(draw):
    m, k, n = draw(dims), draw(dims), draw(dims)
    batch = draw(st.lists(dims, max_size=2))
    a = tuple(batch) + (m, k)
    b = tuple(1 if draw(st.booleans()) else d for d in batch) + (k, n)
    if draw(st.booleans()):
        b = b[len(b) - 2:]  # broadcast a plain matrix over a's batch
    if draw(st.integers(0, 5)) == 0:
        a = (k,)  # vector on the left
    elif draw(st.integers(0, 5)) == 0:
        b = (k,)  # vector on the right
    return a, b


@given(shapes_=matmul_shapes(), seed=seeds, act=st.sampled_from(["none", "relu", "sigmoid", "tanh"]))
def test_matmul(shapes_, seed, act):
    a, b = shapes_
    check_op("matmul", [rand(a, seed), rand(b, seed + 1)], {"activation": act})


@st.composite
def conv_cases(draw):
    n, groups = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    cin_g, cout_g = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    h, w = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    dilation = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    padding = draw(st.sampled_from(["same", "valid", "explicit"]))
    if padding == "explicit":
        padding = tuple(draw(st.integers(0, 2)) for _ in range(4))
    attrs = dict(stride=stride, dilation=dilation, padding=padding,
                 activation=draw(st.sampled_from(["none", "relu", "sigmoid", "tanh"])))
    bias = draw(st.booleans())
    return (n, groups * cin_g, h, w), (groups * cout_g, cin_g, kh, kw), attrs, bias


@given(case=conv_cases(), seed=seeds)
def test_conv2d(case, seed):
    x_shape, w_shape, attrs, bias = case
    inputs = [rand(x_shape, seed), rand(w_shape, seed + 1)]
    if bias:
        inputs.append(rand((w_shape[0],), seed + 2))
    try:
        check_op("conv2d", inputs, attrs)
    except ShapeError:
        assume(False)  # kernel larger than the padded input: rejected, as it should be


def test_conv2d_group_count_comes_from_shapes():
    from graphsub.ir.builder import GraphBuilder

    b = GraphBuilder()
    x = b.input("x", (1, 8, 5, 5))
    y = b.conv2d(x, b.he_weight((4, 2, 3, 3)))  # 8 / 2 = 4 groups
    assert b.type_of(y).shape == (1, 4, 5, 5)
    with pytest.raises(ShapeError, match="not a multiple"):
        b.conv2d(x, b.he_weight((4, 3, 3, 3)))
    with pytest.raises(ShapeError, match="not divisible by the group count"):
        b.conv2d(x, b.he_weight((6, 2, 3, 3)))


@given(seed=seeds, kernel=st.tuples(st.integers(1, 3), st.integers(1, 3)),
       grow=st.tuples(st.integers(0, 2), st.integers(0, 2)))
def test_enlarge(seed, kernel, grow):
    k = (kernel[0] + 2 * grow[0], kernel[1] + 2 * grow[1])
    (y,) = check_op("enlarge", [rand((3, 2) + kernel, seed)], {"kernel": k})
    assert y.shape == (3, 2) + k


@given(seed=seeds, kernel=st.sampled_from([(1, 1), (3, 3), (1, 3)]), stride=st.integers(1, 2))
def test_enlarged_kernel_computes_the_same_same_convolution(seed, kernel, stride):
    """TASO/MetaFlow's premise: a SAME conv with a zero-padded kernel is the same conv."""
    from graphsub.ir.builder import GraphBuilder
    from graphsub.runtime import evaluate

    b = GraphBuilder(seed)
    x = b.input("x", (1, 2, 7, 7))
    w = b.he_weight((3, 2) + kernel)
    y1 = b.conv2d(x, w, stride=stride)
    y2 = b.conv2d(x, b.enlarge(w, kernel=(5, 5)), stride=stride)
    b.output(y1, "a")
    b.output(y2, "b")
    out = evaluate(b.build(), {"x": rand((1, 2, 7, 7), seed)})
    np.testing.assert_allclose(out["a"], out["b"], rtol=1e-5, atol=1e-5)


@st.composite
def pool_cases(draw):
    kernel = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    padding = draw(st.sampled_from(["same", "valid", "explicit"]))
    if padding == "explicit":
        padding = (draw(st.integers(0, kernel[0] - 1)), draw(st.integers(0, kernel[1] - 1)),
                   draw(st.integers(0, kernel[0] - 1)), draw(st.integers(0, kernel[1] - 1)))
    shape = (draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(3, 8)),
             draw(st.integers(3, 8)))
    return shape, dict(kernel=kernel, stride=stride, padding=padding)


@given(case=pool_cases(), seed=seeds)
def test_max_pool2d(case, seed):
    shape, attrs = case
    try:
        check_op("max_pool2d", [rand(shape, seed)], attrs)
    except ShapeError:
        assume(False)


@given(case=pool_cases(), seed=seeds, include=st.booleans())
def test_avg_pool2d(case, seed, include):
    shape, attrs = case
    try:
        check_op("avg_pool2d", [rand(shape, seed)], {**attrs, "count_include_pad": include})
    except ShapeError:
        assume(False)


@given(shape=st.lists(dims, min_size=3, max_size=5).map(tuple), seed=seeds)
def test_global_avg_pool(shape, seed):
    check_op("global_avg_pool", [rand(shape, seed)])


@given(shape=st.lists(dims, min_size=1, max_size=4).map(tuple), seed=seeds, data=st.data())
def test_concat_negative_axes(shape, seed, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    n = data.draw(st.integers(1, 4))
    parts = []
    for i in range(n):
        s = list(shape)
        s[axis] = data.draw(dims)
        parts.append(rand(tuple(s), seed + i))
    check_op("concat", parts, {"axis": axis})


@given(shape=st.lists(dims, min_size=1, max_size=4).map(tuple), seed=seeds, data=st.data())
def test_split(shape, seed, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    size = shape[axis]
    cuts = sorted(data.draw(st.lists(st.integers(0, size), max_size=3)))
    sizes = [b - a for a, b in zip([0] + cuts, cuts + [size])]
    outs = check_op("split", [rand(shape, seed)], {"axis": axis, "sizes": sizes})
    assert [o.shape[axis] for o in outs] == sizes


@given(shape=shapes, seed=seeds, data=st.data())
def test_transpose(shape, seed, data):
    perm = data.draw(st.permutations(range(len(shape))))
    perm = [p - len(shape) if data.draw(st.booleans()) else p for p in perm]  # negative too
    check_op("transpose", [rand(shape, seed)], {"perm": perm})


@given(shape=shapes, seed=seeds, data=st.data())
def test_reshape(shape, seed, data):
    target = data.draw(st.permutations(list(shape)))
    check_op("reshape", [rand(shape, seed)], {"shape": tuple(target) + (1,)})


@given(shape=st.lists(st.integers(1, 3), min_size=1, max_size=3).map(tuple), seed=seeds,
       data=st.data())
def test_expand(shape, seed, data):
    """Axes of size 1 repeated, new leading axes added (what grouped-query attention's copies
    of the keys do)."""
    lead = data.draw(st.lists(st.integers(1, 3), max_size=2))
    target = tuple(lead) + tuple(data.draw(st.integers(1, 4)) if d == 1 else d for d in shape)
    check_op("expand", [rand(shape, seed)], {"shape": target})


@given(shape=st.lists(dims, min_size=1, max_size=4).map(tuple), seed=seeds, data=st.data())
def test_flatten(shape, seed, data):
    axis = data.draw(st.integers(-len(shape), len(shape)))
    check_op("flatten", [rand(shape, seed)], {"axis": axis})


@given(shape=st.lists(st.integers(1, 3), min_size=1, max_size=4).map(tuple), seed=seeds,
       data=st.data())
def test_squeeze(shape, seed, data):
    ones = [i for i, d in enumerate(shape) if d == 1]
    axes = data.draw(st.none() | st.lists(st.sampled_from(ones), unique=True, min_size=1)
                     if ones else st.none())
    if axes:
        axes = [a - len(shape) if data.draw(st.booleans()) else a for a in axes]
    check_op("squeeze", [rand(shape, seed)], {"axes": axes})


@given(shape=shapes, seed=seeds, data=st.data())
def test_unsqueeze(shape, seed, data):
    rank = len(shape) + data.draw(st.integers(1, 2))
    axes = data.draw(st.lists(st.integers(-rank, rank - 1), min_size=rank - len(shape),
                              max_size=rank - len(shape)))
    assume(len({a % rank for a in axes}) == len(axes))
    check_op("unsqueeze", [rand(shape, seed)], {"axes": axes})


@given(shape=st.lists(st.integers(1, 6), min_size=1, max_size=3).map(tuple), seed=seeds,
       data=st.data())
def test_slice(shape, seed, data):
    rank = len(shape)
    axes = data.draw(st.lists(st.integers(-rank, rank - 1), min_size=1, max_size=rank,
                              unique_by=lambda a: a % rank))
    starts = [data.draw(st.integers(-8, 8)) for _ in axes]
    ends = [data.draw(st.integers(-8, 8) | st.just(2 ** 62)) for _ in axes]
    steps = [data.draw(st.sampled_from([1, 2, 3, -1, -2])) for _ in axes]
    check_op("slice", [rand(shape, seed)], {"starts": starts, "ends": ends, "axes": axes,
                                            "steps": steps})


@given(shape=st.lists(st.integers(2, 4), min_size=1, max_size=4).map(tuple), seed=seeds,
       data=st.data(), mode=st.sampled_from(["constant", "reflect", "edge"]))
def test_pad(shape, seed, data, mode):
    rank = len(shape)
    low = 0 if mode != "constant" else -1
    pads = [data.draw(st.integers(low, 1 if mode == "reflect" else 2)) for _ in range(2 * rank)]
    check_op("pad", [rand(shape, seed)], {"pads": pads, "mode": mode, "value": 0.5})


@pytest.mark.parametrize("op", ["reduce_sum", "reduce_mean", "reduce_max"])
@given(shape=st.lists(dims, min_size=1, max_size=4).map(tuple), seed=seeds, data=st.data(),
       opset=OPSETS)
def test_reductions(op, shape, seed, data, opset):
    rank = len(shape)
    axes = data.draw(st.none() | st.lists(st.integers(-rank, rank - 1), min_size=1,
                                          max_size=rank, unique_by=lambda a: a % rank))
    check_op(op, [rand(shape, seed)], {"axes": axes, "keepdims": data.draw(st.booleans())},
             opset=opset)


@given(shape=st.lists(dims, min_size=1, max_size=4).map(tuple), seed=seeds, data=st.data())
def test_softmax(shape, seed, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    check_op("softmax", [rand(shape, seed) * 3], {"axis": axis})


@given(shape=st.lists(dims, min_size=1, max_size=4).map(tuple), seed=seeds, data=st.data())
def test_guarded_softmax(shape, seed, data):
    """Scores with -inf in about a third of the places and, along the axis, some rows all -inf
    (a fully masked query): their NaN rows become zeros, the others are the softmax."""
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    rng = np.random.default_rng(seed)
    x = rand(shape, seed) * 3
    x[rng.random(shape) < 0.3] = -np.inf
    masked_rows = np.moveaxis(x, axis, -1)  # a view: rows along the axis
    masked_rows[rng.random(masked_rows.shape[:-1]) < 0.3] = -np.inf
    check_op("guarded_softmax", [x], {"axis": axis})


@given(shape=st.lists(dims, min_size=1, max_size=4).map(tuple), seed=seeds, data=st.data(),
       scale=st.sampled_from([1.0, 3.0, 30.0]))
def test_log_softmax(shape, seed, data, scale):
    """Logits spread from near-uniform to far apart (where a naive log(softmax) underflows to
    -inf and the shifted form must not)."""
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    check_op("log_softmax", [rand(shape, seed) * scale], {"axis": axis}, rtol=1e-4, atol=1e-4)


@given(shape=st.lists(dims, min_size=1, max_size=4).map(tuple), seed=seeds, data=st.data(),
       opset=OPSETS)
def test_layer_norm(shape, seed, data, opset):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    norm_shape = shape[axis:]
    inputs = [rand(shape, seed), rand(norm_shape, seed + 1)]
    if data.draw(st.booleans()):
        inputs.append(rand(norm_shape, seed + 2))
    check_op("layer_norm", inputs, {"axis": axis, "epsilon": 1e-5}, opset=opset, rtol=1e-3,
             atol=1e-4)


@given(shape=st.lists(dims, min_size=1, max_size=4).map(tuple), seed=seeds, data=st.data(),
       opset=st.sampled_from([17, 18, 23]))
def test_rms_norm(shape, seed, data, opset):
    """RMSNormalization from opset 23, its primitives before (ReduceMean's axes an input from
    18)."""
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    norm_shape = shape[axis:]
    scale_shape = norm_shape[data.draw(st.integers(0, len(norm_shape))):]  # broadcasts
    inputs = [rand(shape, seed), rand(scale_shape, seed + 1)]
    check_op("rms_norm", inputs, {"axis": axis, "epsilon": 1e-5}, opset=opset, rtol=1e-3,
             atol=1e-4)


@given(seed=seeds, data=st.data(), opset=st.sampled_from([18, 23]))
def test_attention(seed, data, opset):
    """Grouped-query heads, causal masks, boolean and additive masks, rank 3 (heads first)
    and 4; a boolean mask may hide every key of a query, which gives zeros. Before opset 23
    the export is primitives, and a mask there only without grouped heads."""
    rank = data.draw(st.sampled_from([3, 4]))
    kv_heads = data.draw(st.integers(1, 3))
    group = data.draw(st.integers(1, 3))
    queries, keys, size = (data.draw(st.integers(1, 6)) for _ in range(3))
    lead = (data.draw(st.integers(1, 2)),) if rank == 4 else ()
    q = rand(lead + (kv_heads * group, queries, size), seed)
    k = rand(lead + (kv_heads, keys, size), seed + 1)
    v = rand(lead + (kv_heads, keys, data.draw(st.integers(1, 5))), seed + 2)
    inputs = [q, k, v]
    mask = data.draw(st.sampled_from(["none", "bool", "float"] if group == 1 or opset >= 23
                                     else ["none"]))
    if mask == "bool":
        inputs.append(rand((queries, keys), seed + 3) > -0.5)
    elif mask == "float":
        inputs.append(rand((queries, keys), seed + 3))
    attrs = {"causal": data.draw(st.booleans())}
    if data.draw(st.booleans()):
        attrs["scale"] = 0.3
    check_op("attention", inputs, attrs, opset=opset, rtol=1e-4, atol=1e-5)


def test_attention_gives_zeros_for_a_query_whose_keys_are_all_masked():
    q, k, v = rand((2, 3, 4), 0), rand((2, 5, 4), 1), rand((2, 5, 4), 2)
    keep = np.ones((3, 5), bool)
    keep[1] = False
    for opset in (18, 23):
        (out,) = check_op("attention", [q, k, v, keep], opset=opset)
        assert np.all(out[:, 1] == 0) and np.all(np.abs(out[:, 0]) > 0)


def _softmax_times_body(rank: int):
    """A generated kernel's body: a scaled softmax along the last axis, times a vector,
    writing the product and the exponentials (two outputs, one read inside too)."""
    from graphsub.tensors.types import Attrs
    from graphsub.ops.fused import body_of

    last = Attrs({"axes": (rank - 1,), "keepdims": True})
    nodes = [("reduce_max", last, [("in", 0)]), ("sub", Attrs(), [("in", 0), ("node", 0, 0)]),
             ("exp", Attrs(), [("node", 1, 0)]), ("reduce_sum", last, [("node", 2, 0)]),
             ("div", Attrs(), [("node", 2, 0), ("node", 3, 0)]),
             ("mul", Attrs(), [("node", 4, 0), ("in", 1)])]
    return body_of(nodes, [("node", 5, 0), ("node", 2, 0)])


@pytest.mark.parametrize("opset", [13, 23])
def test_fused(opset):
    """A generated kernel: replayed in numpy, written out as its primitives for onnxruntime,
    compiled by inductor for torch."""
    x, w = rand((3, 5, 7), 0), rand((7,), 1)
    check_op("fused", [x, w], {"body": _softmax_times_body(3)}, opset=opset)


@given(shape=st.lists(dims, min_size=2, max_size=4).map(tuple), seed=seeds)
def test_batch_norm(shape, seed):
    c = shape[1]
    inputs = [rand(shape, seed), rand((c,), seed + 1), rand((c,), seed + 2),
              rand((c,), seed + 3), rand((c,), seed + 4, 0.5, 2.0)]
    check_op("batch_norm", inputs, {"epsilon": 1e-5}, rtol=1e-3, atol=1e-4)


TESTED_HERE = {
    *UNARY, "add", "sub", "mul", "div", "pow", "smul", "gelu", "leaky_relu", "clip", "cast",
    "dropout", "matmul", "conv2d", "enlarge", "max_pool2d", "avg_pool2d", "global_avg_pool",
    "concat", "split", "transpose", "reshape", "expand", "flatten", "squeeze", "unsqueeze", "slice",
    "pad", "reduce_sum", "reduce_mean", "reduce_max", "softmax", "guarded_softmax",
    "log_softmax", "layer_norm", "rms_norm", "batch_norm", "attention", "fused",
}


#: Operators with a test module of their own, tests/ops/test_<operator>.py, or named by a test
#: module's OPERATORS (a family tested together) (an operator added as a module of its own
#: brings its tests along, and this file does not change).
TESTED_APART = {path.stem.removeprefix("test_")
                for path in Path(__file__).parent.glob("test_*.py")} | {
    op for path in Path(__file__).parent.glob("test_*.py")
    for op in getattr(importlib.import_module(f"tests.ops.{path.stem}"), "OPERATORS", ())}


def test_every_operator_is_tested_against_onnxruntime():
    """input and weight are the graph's leaves; opaque is tested through ONNX import."""
    untested = set(all_ops()) - TESTED_HERE - TESTED_APART - {"input", "weight", "opaque"}
    assert not untested, f"operators without an onnxruntime test: {sorted(untested)}"
