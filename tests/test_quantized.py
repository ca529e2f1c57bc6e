"""Quantized models from onnxruntime's own quantizer: QDQ (quantize_static), dynamically
quantized (quantize_dynamic) and QOperator models keep their quantized weights, keep the
patterns onnxruntime fuses, and come out computing what they computed."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphsub
from graphsub.ir import GraphBuilder
from graphsub.rules import apply_match, builtin_rules, find_matches
from graphsub.rules.applier import AT_QUANTIZATION, Rejection
from graphsub.runtime import evaluate, graph_input_specs, random_feeds, run
from graphsub.verdicts import compare_models
from graphsub.verdicts.equivalence import SAME_FUNCTION
from tests.ops.helpers import run_on_torch, torch_devices


def branchy_cnn():
    """Two convolutions reading one input (a merge the search would make in float32), then a
    residual add and a matmul head."""
    b = GraphBuilder(seed=0)
    x = b.input("input", (1, 16, 8, 8))
    left = b.relu(b.conv2d(x, b.he_weight((16, 16, 3, 3)), padding="same"))
    right = b.relu(b.conv2d(x, b.he_weight((16, 16, 3, 3)), padding="same"))
    b.output(b.add(left, right), "output")
    return b.build()


def small_transformer():
    from graphsub import zoo

    return zoo.build("bert:layers=2,hidden=256,seq=64")


def quantized(graph, tmp_path, how: str) -> onnx.ModelProto:
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, quantize_dynamic,
                                          quantize_static)

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = [random_feeds(graph_input_specs(graph), seed=i) for i in range(4)]

        def get_next(self):
            return self.feeds.pop() if self.feeds else None

    src, out = tmp_path / "float.onnx", tmp_path / f"{how}.onnx"
    onnx.save(graphsub.to_onnx(graph), src)
    if how == "nbits":
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

        quantizer = MatMulNBitsQuantizer(onnx.load(src), block_size=32, is_symmetric=False,
                                         bits=4)
        quantizer.process()
        return quantizer.model.model
    if how == "dynamic":
        quantize_dynamic(str(src), str(out))
    else:
        quantize_static(str(src), str(out), Reader(),
                        quant_format=QuantFormat.QDQ if how == "qdq" else QuantFormat.QOperator)
    return onnx.load(out)


def initializer_bytes(model: onnx.ModelProto) -> int:
    return sum(len(t.raw_data) or onnx.numpy_helper.to_array(t).nbytes
               for t in model.graph.initializer)


#: What each quantizer's operators import as: graphsub operators, none left opaque.
QUANTIZED_OPS = {"qdq": {"quantize", "dequantize"}, "qoperator": {"quantize", "qlinear_conv"},
                 "dynamic": {"dynamic_quantize", "matmul_integer"}, "nbits": {"matmul_nbits"}}
OPAQUE_LEFT = {"qoperator": {"com.microsoft.QLinearAdd"}}
CASES = [(branchy_cnn, "qdq"), (branchy_cnn, "qoperator"), (small_transformer, "dynamic"),
         (small_transformer, "nbits")]


@pytest.mark.parametrize("build, how", CASES)
def test_quantized_models_import_as_operators_with_their_semantics(build, how, tmp_path):
    """Every quantization operator is a graphsub operator, and graphsub's reference and torch
    evaluations compute what onnxruntime computes from the quantized file."""
    model = quantized(build(), tmp_path, how)
    graph = graphsub.load(model)
    ops = {node.op for node in graph.nodes.values()}
    opaque = {n.attrs["op_type"] for n in graph.nodes.values() if n.op == "opaque"}
    # QOperator's elementwise ops are onnxruntime's own (com.microsoft QLinearAdd): opaque
    assert QUANTIZED_OPS[how] <= ops and opaque <= OPAQUE_LEFT.get(how, set()), (ops, opaque)
    feeds = random_feeds(graph_input_specs(graph), seed=3)
    expected = run(model, feeds)
    for got in [evaluate(graph, feeds)] + [run_on_torch(graph, feeds, d) for d in torch_devices()]:
        for name, value in expected.items():
            # a float output one quantization step away at most: graphsub's float operators
            # sum in another order than onnxruntime's before a quantization rounds
            step = float(abs(value).max()) / 100 + 1e-3
            assert abs(got[name].astype(float) - value).max() <= step, (how, name)


@pytest.mark.parametrize("build, how", CASES)
def test_quantized_models_keep_their_weights_and_compute_what_they_computed(build, how,
                                                                            tmp_path):
    model = quantized(build(), tmp_path, how)
    graph = graphsub.load(model)
    round_trip = graphsub.to_onnx(graph)
    assert initializer_bytes(round_trip) <= initializer_bytes(model) * 1.01
    data, report = graphsub.optimize_model(graph, model.SerializeToString(), time_limit=10,
                                           cost="analytic", fission=False)
    assert "failed_candidate" not in report.verification
    written = onnx.load_from_string(data)
    onnx.checker.check_model(written, full_check=True)
    assert initializer_bytes(written) <= initializer_bytes(model) * 1.01
    assert compare_models(model.SerializeToString(), data, graph_input_specs(graph),
                          SAME_FUNCTION).equivalent


def test_a_rewrite_of_dequantized_weights_is_refused(tmp_path):
    """Merging the two convolutions of a QDQ model would concatenate dequantized weights: a
    float change that rounds differently once quantized, and the end of onnxruntime's
    DequantizeLinear -> Conv -> QuantizeLinear fusion."""
    graph = graphsub.load(quantized(branchy_cnn(), tmp_path, "qdq"))
    rules = {r.name: r for r in builtin_rules()}
    matches = [m for name in ("merge-convs-shared-input", "merge-convs-enlarge")
               for m in find_matches(graph, rules[name])]
    assert matches
    for match in matches:
        result = apply_match(graph, match)
        assert isinstance(result, Rejection) and result.reason == AT_QUANTIZATION


def _qdq_transpose_model() -> onnx.ModelProto:
    """x -> Q -> DQ -> Transpose -> Q -> DQ -> Relu: the float transpose between two
    quantizations with one scale, as a QDQ quantizer leaves it."""
    from onnx import TensorProto, helper, numpy_helper

    scale = numpy_helper.from_array(np.array(0.05, np.float32), "s")
    zero = numpy_helper.from_array(np.array(120, np.uint8), "z")
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q1"]),
             helper.make_node("DequantizeLinear", ["q1", "s", "z"], ["d1"]),
             helper.make_node("Transpose", ["d1"], ["t"], perm=[0, 2, 1]),
             helper.make_node("QuantizeLinear", ["t", "s", "z"], ["q2"]),
             helper.make_node("DequantizeLinear", ["q2", "s", "z"], ["d2"]),
             helper.make_node("Relu", ["d2"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5, 6])],
        initializer=[scale, zero])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_transpose_between_quantizations_moves_to_the_integers_exactly():
    """transpose-before-dequantize, then quantize-dequantize-pair: the transpose reads
    uint8, one quantization pair is gone, and the output is bit for bit the original's."""
    model = _qdq_transpose_model()
    graph = graphsub.load(model)
    rules = {r.name: r for r in builtin_rules()}
    for name in ("transpose-before-dequantize", "quantize-dequantize-pair"):
        (match,) = find_matches(graph, rules[name])
        graph = apply_match(graph, match)
        assert not isinstance(graph, Rejection), graph
    ops = sorted(n.op for n in graph.nodes.values() if n.op not in ("input", "weight"))
    assert ops == ["dequantize", "quantize", "relu", "transpose"]
    (transpose,) = graph.nodes_by_op("transpose")
    assert graph.input_types(transpose)[0].dtype == "uint8"
    x = np.random.default_rng(0).standard_normal((2, 6, 5)).astype(np.float32) * 4
    np.testing.assert_array_equal(run(graphsub.to_onnx(graph), {"x": x})["y"],
                                  run(model, {"x": x})["y"])


def test_a_pair_with_float16_scales_is_left_alone():
    """(q - z) * s rounded to float16 may not divide back to q - z for 16-bit values: the
    pair rule holds for float32 scales only."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    half = convert_float_to_float16(_qdq_transpose_model(), keep_io_types=True)
    graph = graphsub.load(half)
    rules = {r.name: r for r in builtin_rules()}
    assert [n.op for n in graph.nodes.values()].count("dequantize") == 2
    assert not find_matches(graph, rules["quantize-dequantize-pair"])
