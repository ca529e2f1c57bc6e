"""Models converted to float16 by onnxruntime's converter (onnxconverter-common's code): found
rewrites hold within float16's tolerance, keep every value's precision, and a run never ends in
an error."""

from __future__ import annotations

import onnx
import pytest

import graphsub
from graphsub import zoo
from graphsub.pipeline.verify_stage import model_tolerance
from graphsub.runtime import graph_input_specs
from graphsub.verdicts import compare_models
from graphsub.verdicts.equivalence import value_dtypes


def float16_bert(keep_io_types: bool) -> onnx.ModelProto:
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = graphsub.to_onnx(zoo.build("bert:layers=2,hidden=256,seq=64"))
    return convert_float_to_float16(model, keep_io_types=keep_io_types)


@pytest.mark.parametrize("keep_io_types", [False, True])
def test_float16_bert_rewrites_hold_within_its_tolerance_and_keep_its_precision(keep_io_types):
    model = float16_bert(keep_io_types)
    graph = graphsub.load(model)
    assert "float16" in value_dtypes(graph)
    result = graphsub.optimize(graph, cost="analytic", time_limit=10, keep=5)
    rewritten = [c for c in result.candidates if c.trace]
    assert rewritten, "the search found nothing to rewrite"
    best = max(rewritten, key=lambda c: len(c.trace)).graph
    assert {d for d in value_dtypes(best) if d.startswith("float")} <= {
        d for d in value_dtypes(graph) if d.startswith("float")}
    tolerance = model_tolerance(graph)
    comparison = compare_models(model.SerializeToString(), graphsub.to_onnx(best),
                                graph_input_specs(graph), tolerance, trials=3)
    assert comparison.equivalent, [d.describe() for d in comparison.outputs]


def test_a_float16_model_is_optimized_without_an_error(tmp_path):
    model = float16_bert(keep_io_types=False)
    data, report = graphsub.optimize_model(graphsub.load(model), model.SerializeToString(),
                                           time_limit=10, cost="analytic", fission=False)
    assert "failed_candidate" not in report.verification
    written = onnx.load_from_string(data)
    onnx.checker.check_model(written, full_check=True)
    comparison = compare_models(model.SerializeToString(), data,
                                graph_input_specs(graphsub.load(model)),
                                model_tolerance(graphsub.load(model)))
    assert comparison.equivalent
