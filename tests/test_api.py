"""The Python API does what the command line does on a model: input shapes and values,
custom-op libraries, the model written as `graphsub optimize` writes it (external data
included) and the report saved as --report saves it."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

import graphsub
from graphsub.errors import GraphsubError
from graphsub.onnx_io import external, importer
from graphsub.report.files import load_report
from graphsub.report.optimize import OptimizeReport
from graphsub.runtime.ort_sessions import run
from tests.runtime.test_probe import rate_model


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHSUB_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def rate_file(tmp_path):
    path = tmp_path / "rate.onnx"
    onnx.save_model(rate_model(), str(path))
    return path


def test_a_model_file_is_parsed_once(rate_file, monkeypatch):
    calls = []
    read = importer._read_model
    monkeypatch.setattr(importer, "_read_model", lambda source: calls.append(source) or
                        read(source))
    model = graphsub.open_model(rate_file)
    assert [c for c in calls if not isinstance(c, onnx.ModelProto)] == [rate_file]  # bodies
    assert model.original == rate_file.read_bytes() and model.label == "rate.onnx"
    assert [model.graph[i].attrs["name"] for i in model.graph.inputs] == ["x", "sr"]


def test_input_values_go_with_the_model_and_the_run_is_searched_there(rate_file, tmp_path):
    """The model runs only at sr=16000: given in Python as on the command line, the probe has
    nothing to find, and the written model computes what the original computes there."""
    model = graphsub.open_model(rate_file, input_values={"sr": 16000})
    assert model.graph.facts.input_values["sr"] == np.int64(16000)
    data, report = graphsub.optimize_model(model, cost="analytic", time_limit=5)
    assert not any("fails on graphsub's default inputs" in n for n in report.notes)
    assert report.model == "rate.onnx"
    out = graphsub.save(data, tmp_path / "rate.opt.onnx")
    feeds = {"x": np.arange(4, dtype=np.float32), "sr": np.array(16000, dtype=np.int64)}
    np.testing.assert_allclose(run(str(out), feeds)["y"], run(str(rate_file), feeds)["y"])


def test_input_values_are_numbers_arrays_or_text_and_a_misfit_is_named(rate_file):
    for value in (16000, np.array(16000), "16000"):
        model = graphsub.open_model(rate_file, input_values={"sr": value})
        assert int(model.graph.facts.input_values["sr"]) == 16000
    with pytest.raises(GraphsubError, match="expected 1 comma-separated number"):
        graphsub.open_model(rate_file, input_values={"sr": [1, 2]})
    with pytest.raises(GraphsubError, match="not an input of the model"):
        graphsub.open_model(rate_file, input_values={"rate": 1})


def test_models_from_protos_bytes_and_the_zoo():
    proto = rate_model()
    proto.graph.name = "detector"
    assert graphsub.open_model(proto).label == "detector"
    from_bytes = graphsub.open_model(proto.SerializeToString())
    assert from_bytes.original == proto.SerializeToString()
    zoo = graphsub.open_model("resnet_blocks:n=1")
    assert zoo.label == "resnet_blocks:n=1" and onnx.load_from_string(zoo.original).graph.node
    with pytest.raises(GraphsubError, match="zoo models have fixed shapes"):
        graphsub.open_model("resnet_blocks:n=1", input_shapes={"x": (1, 3, 8, 8)})


def test_a_custom_op_library_that_is_not_there_is_a_clear_error(rate_file, tmp_path):
    with pytest.raises(GraphsubError, match="no such file"):
        graphsub.open_model(rate_file, custom_ops=[tmp_path / "libmissing.so"])


def test_the_report_saves_as_the_command_line_saves_it(rate_file, tmp_path):
    model = graphsub.open_model(rate_file, input_values={"sr": 16000})
    _, report = graphsub.optimize_model(model, cost="analytic", time_limit=4, evidence=True)
    saved = report.save(tmp_path / "report.json")
    assert OptimizeReport.from_dict(load_report(saved)).verdict == report.verdict
    assert json.loads(saved.read_text())["model"] == "rate.onnx"
    assert "<html" in report.save(tmp_path / "report.html").read_text().lower()
    with pytest.raises(GraphsubError, match="the format follows the suffix"):
        report.save(tmp_path / "report.txt")
    assert not (tmp_path / "report.txt").exists()


def test_what_optimize_model_returns_saves_with_its_weights_apart_on_request(tmp_path):
    rng = np.random.default_rng(0)
    b = graphsub.GraphBuilder(seed=1)
    x = b.input("x", (4, 256))
    b.output(b.relu(b.matmul(x, b.weight(rng.standard_normal((256, 256)).astype(np.float32)))),
             "y")
    graph = b.build()
    data, _ = graphsub.optimize_model(graph, cost="analytic", time_limit=3)
    out = graphsub.save(data, tmp_path / "apart.onnx", external_data=True)
    assert (tmp_path / "apart.onnx.data").is_file()
    assert external.has_external_data(onnx.load(str(out), load_external_data=False))
    feeds = {"x": rng.standard_normal((4, 256)).astype(np.float32)}
    np.testing.assert_allclose(run(str(out), feeds)["y"], run(data, feeds)["y"], rtol=1e-6)
    with pytest.raises(GraphsubError, match="opset applies to a graph"):
        graphsub.save(data, tmp_path / "other.onnx", opset=17)
