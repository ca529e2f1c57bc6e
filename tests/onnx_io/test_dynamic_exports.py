"""Models exported with dynamic sizes, as people export them, go through import and export
without --input-shape: the written file keeps its symbolic inputs and outputs, passes the ONNX
checker, and equals the original at five or more bindings of its sizes (the smallest, each
largest, odd ones)."""

from __future__ import annotations

import pytest

import graphsub
from graphsub.runtime import compare_models, graph_input_specs
from graphsub.runtime.bindings import MIN_BINDINGS, check_bindings
from graphsub.runtime.equivalence import Tolerance
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
    assert set(graph.meta["symbols"]) == symbols
    exported = graphsub.to_onnx(graph)
    for before, after in ((original.graph.input, exported.graph.input),
                          (original.graph.output, exported.graph.output)):
        assert [_dims(v) for v in before] == [_dims(v) for v in after]
    bindings = check_bindings(graph.meta["symbols"])
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
    assert graph.meta["symbols"]["width"].low == 2  # its pooling needs two columns
