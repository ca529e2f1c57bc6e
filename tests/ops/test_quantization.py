"""The quantization operators against onnxruntime and the torch backend: exact integer
outputs (no tolerance), on random shapes, per-tensor and per-axis parameters, both 8-bit
types, zero points left out, padded and strided integer convolutions, 4-bit weights."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from graphsub.onnx_io import load, to_onnx
from graphsub.runtime import evaluate, run
from tests.ops.helpers import check_op

OPERATORS = ("quantize", "dequantize", "dynamic_quantize", "matmul_integer", "conv_integer",
             "qlinear_matmul", "qlinear_conv", "matmul_nbits")

seeds = st.integers(0, 2 ** 31 - 1)
eight_bit = st.sampled_from(["uint8", "int8"])


def _ints(rng, shape, dtype):
    info = np.iinfo(dtype)
    return rng.integers(info.min, int(info.max) + 1, shape).astype(dtype)


def _weights(rng, shape, dtype, other):
    """Integer operands for a product with an `other`-typed one. uint8 x int8 products
    use 7-bit int8 values, as onnxruntime's quantizer makes them (reduce_range): on x86 without
    VNNI, MLAS sums pairs of uint8 x int8 products in int16 (vpmaddubsw), which saturates
    for full-range weights, so onnxruntime's result there is not the product's (it is on
    VNNI machines); graphsub's reference computes the product."""
    if dtype == "int8" and other == "uint8":
        return rng.integers(-64, 64, shape).astype(np.int8)
    return _ints(rng, shape, dtype)


def _exact(op, inputs, attrs=None, weights=()):
    return check_op(op, inputs, attrs, rtol=0.0, atol=0.0, weights=weights)


@given(seed=seeds, dtype=eight_bit, per_axis=st.booleans(), rank=st.integers(1, 4),
       half=st.booleans())
def test_quantize_and_dequantize_are_exact(seed, dtype, per_axis, rank, half):
    rng = np.random.default_rng(seed)
    shape = tuple(int(d) for d in rng.integers(1, 5, rank))
    axis = int(rng.integers(rank))
    float_type = np.float16 if half else np.float32
    # values spread over the whole range and past it (saturation), with exact halves (ties)
    x = (rng.standard_normal(shape) * 3).astype(float_type)
    x.flat[: x.size // 3] = (np.round(x.flat[: x.size // 3] * 8) / 8).astype(float_type)
    scale_shape = (shape[axis],) if per_axis else ()
    scale = rng.uniform(0.01, 0.1, scale_shape).astype(float_type)
    zero_point = _ints(rng, scale_shape, dtype)
    attrs = {"axis": axis - rank if rng.random() < 0.5 else axis, "dtype": dtype}
    (q,) = _exact("quantize", [x, scale, zero_point], attrs, weights=[1, 2])
    _exact("dequantize", [q, scale, zero_point], {"axis": attrs["axis"]}, weights=[1, 2])


def test_quantize_without_a_zero_point_writes_uint8():
    x = np.linspace(-3, 3, 24, dtype=np.float32).reshape(2, 12)
    (q,) = _exact("quantize", [x, np.array(0.01, np.float32)])
    assert q.dtype == np.uint8 and q.min() == 0 and q.max() == 255


@given(seed=seeds, rank=st.integers(1, 3))
def test_dynamic_quantize_matches_onnxruntime(seed, rank):
    rng = np.random.default_rng(seed)
    shape = tuple(int(d) for d in rng.integers(1, 6, rank))
    x = (rng.standard_normal(shape) * rng.uniform(0.1, 10)).astype(np.float32)
    if rng.random() < 0.3:
        x = np.abs(x)  # a range that does not hold 0: it is widened to
    _exact("dynamic_quantize", [x])


def test_dynamic_quantize_of_zeros_has_scale_one():
    _, scale, zero_point = _exact("dynamic_quantize", [np.zeros((2, 3), np.float32)])
    assert scale == 1.0 and zero_point == 0


@given(seed=seeds, a_type=eight_bit, b_type=eight_bit, zero_points=st.sampled_from(
    ["none", "a", "b", "both", "b-per-column"]), batch=st.booleans())
def test_matmul_integer_is_exact(seed, a_type, b_type, zero_points, batch):
    rng = np.random.default_rng(seed)
    m, k, n = (int(d) for d in rng.integers(1, 7, 3))
    a = _weights(rng, ((2,) if batch else ()) + (m, k), a_type, b_type)
    b = _weights(rng, (k, n), b_type, a_type)
    inputs, weights = [a, b], [1]
    if zero_points in ("a", "both", "b-per-column"):
        inputs.append(_ints(rng, (), a_type))
    if zero_points == "b":  # a's left out: written as an empty input name
        graph = _single("MatMulInteger", [a, b, None, _ints(rng, (), b_type)],
                        out_type=TensorProto.INT32)
        np.testing.assert_array_equal(evaluate(load(graph), {"x0": a})["y"],
                                      run(graph, {"x0": a})["y"])
        return
    if zero_points in ("both", "b-per-column"):
        inputs.append(_ints(rng, (n,) if zero_points == "b-per-column" else (), b_type))
        weights.append(3)
    _exact("matmul_integer", inputs, {"slots": tuple(range(len(inputs)))}, weights=weights)


def _single(op_type, arrays, domain="", out_type=TensorProto.FLOAT, **attrs):
    """A one-node model: the first array a graph input `x0`, the others initializers (None:
    an input left out), its output `y` of `out_type`."""
    names, inits = ["x0"], []
    for i, arr in enumerate(arrays[1:], 1):
        if arr is None:
            names.append("")
            continue
        names.append(f"c{i}")
        inits.append(numpy_helper.from_array(arr, f"c{i}"))
    x = arrays[0]
    node = helper.make_node(op_type, names, ["y"], domain=domain, **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(
            "x0", helper.np_dtype_to_tensor_dtype(x.dtype), list(x.shape))],
        [helper.make_tensor_value_info("y", out_type, None)], initializer=inits)
    opsets = [helper.make_opsetid("", 21)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    model = helper.make_model(graph, opset_imports=opsets)
    return onnx.shape_inference.infer_shapes(model)


def _conv_case(rng, x_type, w_type):
    c_in, c_out = (int(d) for d in rng.integers(1, 5, 2))
    x = _weights(rng, (1, c_in, int(rng.integers(3, 8)), int(rng.integers(3, 8))), x_type, w_type)
    k = int(rng.integers(1, 4))
    w = _weights(rng, (c_out, c_in, k, k), w_type, x_type)
    stride = int(rng.integers(1, 3))
    pads = [int(p) for p in rng.integers(0, 2, 4)]
    return x, w, {"stride": (stride, stride), "padding": tuple(pads)}


@given(seed=seeds, w_type=eight_bit, zero_points=st.booleans())
def test_conv_integer_is_exact(seed, w_type, zero_points):
    """uint8 images (DynamicQuantizeLinear's, what quantize_dynamic writes before it)."""
    x_type = "uint8"
    rng = np.random.default_rng(seed)
    x, w, attrs = _conv_case(rng, x_type, w_type)
    inputs = [x, w] + ([_ints(rng, (), x_type), _ints(rng, (), w_type)] if zero_points else [])
    _exact("conv_integer", inputs, {**attrs, "slots": tuple(range(len(inputs)))},
           weights=[1, 2, 3][:len(inputs) - 1])


#: The type combinations onnxruntime implements: the output is A's type.
QLINEAR_TYPES = st.sampled_from([("uint8", "uint8"), ("uint8", "int8"), ("int8", "int8")])


@given(seed=seeds, types=QLINEAR_TYPES, per_column=st.booleans())
def test_qlinear_matmul_matches_onnxruntime(seed, types, per_column):
    (a_type, b_type), rng = types, np.random.default_rng(seed)
    y_type = a_type
    m, k, n = (int(d) for d in rng.integers(1, 7, 3))
    b_params = (n,) if per_column else ()
    inputs = [_weights(rng, (m, k), a_type, b_type), np.float32(rng.uniform(0.01, 0.1)),
              _ints(rng, (), a_type), _weights(rng, (k, n), b_type, a_type),
              rng.uniform(0.01, 0.1, b_params).astype(np.float32),
              np.full(b_params, int(rng.integers(-3, 4)) + (128 if b_type == "uint8" else 0),
                      b_type),
              np.float32(rng.uniform(0.05, 0.5)), _ints(rng, (), y_type)]
    inputs = [np.asarray(v) for v in inputs]
    _exact("qlinear_matmul", inputs, weights=range(1, 8))


@given(seed=seeds, x_type=eight_bit, per_channel=st.booleans(), bias=st.booleans())
def test_qlinear_conv_matches_onnxruntime(seed, x_type, per_channel, bias):
    rng, y_type = np.random.default_rng(seed), x_type
    x, w, attrs = _conv_case(rng, x_type, "int8")
    c_out = w.shape[0]
    w_params = (c_out,) if per_channel else ()
    inputs = [x, np.float32(rng.uniform(0.01, 0.1)), _ints(rng, (), x_type), w,
              rng.uniform(0.01, 0.1, w_params).astype(np.float32),
              np.zeros(w_params, np.int8),  # onnxruntime: symmetric int8 weights
              np.float32(rng.uniform(0.05, 0.5)), _ints(rng, (), y_type)]
    if bias:
        inputs.append(rng.integers(-500, 500, c_out).astype(np.int32))
    inputs = [np.asarray(v) for v in inputs]
    _exact("qlinear_conv", inputs, attrs, weights=range(1, len(inputs)))


def _nbits_case(rng, k, n, bits, block, zero_points, bias):
    blocks = -(-k // block)
    packed = rng.integers(0, 256, (n, blocks, block * bits // 8)).astype(np.uint8)
    scales = rng.uniform(0.01, 0.1, n * blocks).astype(np.float32)
    arrays = [packed, scales]
    if zero_points:
        arrays.append(rng.integers(0, 256, n * -(-blocks * bits // 8)).astype(np.uint8))
    elif bias:
        arrays.append(None)
    if bias:
        arrays += [None, rng.standard_normal(n).astype(np.float32)]
    return arrays


@pytest.mark.parametrize("bits", [4, 8])
@settings(max_examples=15, deadline=None)
@given(seed=seeds, zero_points=st.booleans(), bias=st.booleans())
def test_matmul_nbits_matches_onnxruntime(bits, seed, zero_points, bias):
    rng = np.random.default_rng(seed)
    block = int(rng.choice([16, 32]))
    k, n = int(rng.integers(1, 3)) * block - int(rng.integers(0, 5)), int(rng.integers(1, 9))
    a = rng.standard_normal((int(rng.integers(1, 4)), k)).astype(np.float32)
    model = _single("MatMulNBits", [a] + _nbits_case(rng, k, n, bits, block, zero_points, bias),
                    domain="com.microsoft", K=k, N=n, bits=bits, block_size=block)
    graph = load(model)
    assert [node.op for node in graph.nodes.values() if node.op not in ("input", "weight")] == [
        "matmul_nbits"]
    expected = run(model, {"x0": a})["y"]
    np.testing.assert_allclose(evaluate(graph, {"x0": a})["y"], expected, rtol=1e-4, atol=1e-4)
    written = to_onnx(graph)
    onnx.checker.check_model(written)
    np.testing.assert_allclose(run(written, {"x0": a})["y"], expected, rtol=1e-5, atol=1e-5)
    from tests.ops.helpers import run_on_torch, torch_devices

    for device in torch_devices():
        got = run_on_torch(graph, {"x0": a}, device)["y"]
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_forms_outside_the_semantics_stay_opaque():
    """Blocked quantization (opset 21) and MatMulNBits with float zero points are run by
    onnxruntime as opaque nodes, and still come out equal."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 8)).astype(np.float32)
    blocked = _single("QuantizeLinear", [x, rng.uniform(0.01, 0.1, (2, 2)).astype(np.float32),
                                         np.zeros((2, 2), np.uint8)], out_type=TensorProto.UINT8,
                      axis=1, block_size=4)
    graph = load(blocked)
    assert [n.attrs["op_type"] for n in graph.nodes.values() if n.op == "opaque"] == ["QuantizeLinear"]
    np.testing.assert_array_equal(run(to_onnx(graph), {"x0": x})["y"], run(blocked, {"x0": x})["y"])
    arrays = _nbits_case(rng, 8, 3, 4, 16, False, False)
    floats = _single("MatMulNBits", [x, *arrays, np.full(3, 8.0, np.float32)],
                     domain="com.microsoft", K=8, N=3, bits=4, block_size=16)
    graph = load(floats)
    assert [n.attrs["op_type"] for n in graph.nodes.values() if n.op == "opaque"] == [
        "com.microsoft.MatMulNBits"]
