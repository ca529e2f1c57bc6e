"""Quantized models from onnxruntime's own quantizer: QDQ (quantize_static), dynamically
quantized (quantize_dynamic) and QOperator models keep their quantized weights, keep the
patterns onnxruntime fuses, and come out computing what they computed."""

from __future__ import annotations

import onnx
import pytest

import graphsub
from graphsub.ir import GraphBuilder
from graphsub.rules import apply_match, builtin_rules, find_matches
from graphsub.rules.applier import AT_QUANTIZATION, Rejection
from graphsub.runtime import compare_models, graph_input_specs, random_feeds
from graphsub.runtime.equivalence import SAME_FUNCTION


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
    if how == "dynamic":
        quantize_dynamic(str(src), str(out))
    else:
        quantize_static(str(src), str(out), Reader(),
                        quant_format=QuantFormat.QDQ if how == "qdq" else QuantFormat.QOperator)
    return onnx.load(out)


def initializer_bytes(model: onnx.ModelProto) -> int:
    return sum(len(t.raw_data) or onnx.numpy_helper.to_array(t).nbytes
               for t in model.graph.initializer)


@pytest.mark.parametrize("build, how", [(branchy_cnn, "qdq"), (branchy_cnn, "qoperator"),
                                        (small_transformer, "dynamic")])
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
