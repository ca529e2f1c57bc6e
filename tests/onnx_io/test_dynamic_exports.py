"""Models exported with dynamic sizes, as people export them, go through import and export
without --input-shape: the written file keeps its symbolic inputs and outputs, passes the ONNX
checker, and equals the original at five or more bindings of its sizes (the smallest, each
largest, odd ones)."""

from __future__ import annotations

import pytest

import graphsub
from graphsub.runtime import graph_input_specs
from graphsub.verdicts import compare_models
from graphsub.runtime.check_sizes import MIN_BINDINGS, check_bindings, parse_profile
from graphsub.verdicts.equivalence import Tolerance
from tests.dynamic_models import EXPORTERS, TEXT_MODELS, export_cnn, export_ocr, export_text
from tests.markers import requires_torch, requires_transformers

pytestmark = [pytest.mark.slow, requires_torch]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("dynamic")


def _check(path, symbols: set[str]):
    import onnx

    original = onnx.load(str(path))
    graph = graphsub.load(original)
    assert set(graph.facts.symbols) == symbols
    exported = graphsub.to_onnx(graph)
    for before, after in ((original.graph.input, exported.graph.input),
                          (original.graph.output, exported.graph.output)):
        assert [_dims(v) for v in before] == [_dims(v) for v in after]
    # what graphsub writes, graphsub (and onnxruntime's symbolic inference) reads back
    assert set(graphsub.load(exported).facts.symbols) == symbols
    bindings = check_bindings(graph.facts.symbols)
    assert len(bindings) >= MIN_BINDINGS
    for binding in bindings:
        result = compare_models(original.SerializeToString(), exported,
                                graph_input_specs(graph, binding), Tolerance(rtol=1e-4))
        assert result.equivalent, (binding, [d.describe() for d in result.outputs])
    return graph


def _dims(value_info):
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


@requires_transformers
@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("kind", TEXT_MODELS)
def test_text_models_keep_batch_and_sequence(folder, kind, exporter):
    graph = _check(export_text(kind, exporter, folder), {"batch", "seq"})
    ops = {graph[n].op for n in graph.topo_order()}
    assert {"matmul", "reshape", "guarded_softmax"} <= ops


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_a_cnn_keeps_its_batch(folder, exporter):
    graph = _check(export_cnn(folder, exporter), {"batch"})
    assert "opaque" not in {graph[n].op for n in graph.topo_order()}


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_an_ocr_model_keeps_its_width(folder, exporter):
    graph = _check(export_ocr(folder, exporter), {"batch", "width"})
    assert graph.facts.symbols["width"].low == 2  # its pooling needs two columns


def _exported(kind: str, exporter: str, folder):
    if kind in TEXT_MODELS:
        return export_text(kind, exporter, folder)
    return (export_cnn if kind == "cnn" else export_ocr)(folder, exporter)


@pytest.mark.parametrize("kind, exporter", [
    pytest.param(k, e, marks=requires_transformers) for k in TEXT_MODELS for e in EXPORTERS
] + [("cnn", "dynamo"), ("ocr", "legacy")])
def test_optimize_writes_a_model_that_keeps_its_sizes_and_equals_the_original(folder, kind,
                                                                              exporter):
    """The main job on the dynamic file, without --input-shape: whatever it writes (the
    optimized model or the original) keeps the symbolic inputs and outputs and computes the
    original's outputs at every check binding."""
    import onnx

    from graphsub.onnx_io.importer import model_data
    from graphsub.runtime.ort_sessions import DetachedModel

    path = _exported(kind, exporter, folder)
    original = onnx.load(str(path))
    graph = graphsub.load(original)
    data, report = graphsub.optimize_model(graph, model_data(path), kind, cost="analytic",
                                           time_limit=20)
    written = onnx.load_from_string(data.proto if isinstance(data, DetachedModel) else data)
    for before, after in ((original.graph.input, written.graph.input),
                          (original.graph.output, written.graph.output)):
        assert [_dims(v) for v in before] == [_dims(v) for v in after]
    assert report.shapes["symbols"].keys() == graph.facts.symbols.keys()
    bindings = check_bindings(graph.facts.symbols, [{n: v for n, v in p.binding}
                                                      for p in map(parse_profile,
                                                                   report.shapes["profile"])])
    assert len(bindings) >= MIN_BINDINGS
    for binding in bindings:
        result = compare_models(model_data(path), data, graph_input_specs(graph, binding),
                                Tolerance(rtol=1e-3))
        assert result.equivalent, (binding, [d.describe() for d in result.outputs])
    if not report.kept_original:
        assert len(report.shapes["verified_at"]) >= MIN_BINDINGS
