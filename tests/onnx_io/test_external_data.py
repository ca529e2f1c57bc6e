"""Models with external data (issue 29): weights mapped, never copied, shared by every
candidate and session; outputs written with their data file, atomically; large-model
behaviour exercised on a small model by lowering the thresholds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from typer.testing import CliRunner

import graphsub
from graphsub.cli import app
from graphsub.errors import ExportError, ModelLoadError
from graphsub.ir import GraphBuilder
from graphsub.tensors.types import mapped_region
from graphsub.onnx_io import external, load, to_model_data, write_model
from graphsub.onnx_io.importer import model_data
from graphsub.optimizer import optimize_model
from graphsub.pipeline import Settings
from graphsub.pipeline import run as pipeline_run
from graphsub.progress import StepLog, reporting
from graphsub.runtime import graph_input_specs
from graphsub.verdicts import compare_models
from graphsub.runtime.ort_sessions import DetachedModel, make_session

runner = CliRunner()


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHSUB_CACHE_DIR", str(tmp_path / "cache"))


def _graph():
    """Two layers of the same block: a product, a bias, a reshape pair graphsub folds."""
    b = GraphBuilder(seed=3)
    x = b.input("x", (4, 64))
    for _ in range(2):
        h = b.add(b.matmul(x, b.he_weight((64, 64))), b.uniform_weight((64,), -0.5, 0.5))
        h = b.reshape(b.reshape(h, shape=(4, 8, 8)), shape=(4, 64))
        x = b.relu(h)
    b.output(x, "y")
    return b.build()


@pytest.fixture
def stored(tmp_path) -> Path:
    """The model saved as exporters save large ones: every tensor in one data file."""
    path = tmp_path / "model.onnx"
    proto = onnx.load_from_string(graphsub.onnx_io.to_onnx_bytes(_graph()))
    onnx.save_model(proto, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="model.onnx.data", size_threshold=1024)
    return path


def _feeds_equal(a, b, graph) -> None:
    result = compare_models(a, b, graph_input_specs(graph))
    assert result.equivalent, [d.describe() for d in result.outputs]


def test_weights_are_views_of_the_mapped_data_file_and_sessions_share_them(stored):
    graph = load(stored)
    weights = [n.attrs["value"] for n in graph.nodes.values() if n.op == "weight"]
    big = [w for w in weights if w.array.nbytes >= external.MIN_EXTERNAL_TENSOR]
    assert big and all(mapped_region(w.array) is not None for w in big)
    assert all(not w.array.flags.writeable for w in big)
    assert graph.facts.external_data
    original = model_data(stored)
    assert isinstance(original, DetachedModel)
    exported = to_model_data(graph)
    assert isinstance(exported, DetachedModel)
    # the export hands the graph's own arrays on: no weight is copied for a candidate
    assert sum(any(np.shares_memory(a, w.array) for w in big)
               for a in exported.weights.values()) == len(big)
    _feeds_equal(str(stored), exported, graph)
    _feeds_equal(original, exported, graph)


def test_a_written_model_keeps_its_weights_in_its_own_aligned_data_file(stored, tmp_path):
    graph = load(stored)
    out = tmp_path / "out" / "written.onnx"
    out.parent.mkdir()
    write_model(to_model_data(graph), out)
    assert sorted(p.name for p in out.parent.iterdir()) == ["written.onnx",
                                                            "written.onnx.data"]
    proto = onnx.load(str(out), load_external_data=False)
    infos = [{e.key: e.value for e in t.external_data} for t in proto.graph.initializer
             if external.is_external(t)]
    assert infos and all(i["location"] == "written.onnx.data" for i in infos)
    assert all(int(i["offset"]) % external.ALIGNMENT == 0 for i in infos)
    onnx.checker.check_model(str(out), full_check=True)
    _feeds_equal(str(stored), str(out), graph)


def test_a_failed_write_leaves_neither_file(stored, tmp_path, monkeypatch):
    data = to_model_data(load(stored))
    out = tmp_path / "fail"
    out.mkdir()

    def broken(array, size=0):
        yield memoryview(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(external, "_chunks", broken)
    with pytest.raises(OSError, match="disk full"):
        write_model(data, out / "m.onnx")
    assert list(out.iterdir()) == []
    with pytest.raises(ExportError, match="does not exist"):
        write_model(data, tmp_path / "missing" / "m.onnx")


def test_a_missing_data_file_is_a_clear_load_error(stored):
    Path(str(stored) + ".data").unlink()
    with pytest.raises(ModelLoadError, match="keep the model's data file beside it"):
        load(stored)


def test_loading_counts_its_nodes(stored):
    log = StepLog()
    with reporting(log):
        load(stored)
    count = log.steps["load"]
    assert count.unit == "nodes" and count.done == count.total > 0


def test_optimize_writes_external_data_where_the_input_has_it(stored, tmp_path):
    out = tmp_path / "opt.onnx"
    r = runner.invoke(app, ["optimize", str(stored), "-o", str(out), "--cost", "analytic",
                            "--time-limit", "30", "--threads", "1"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert (tmp_path / "opt.onnx.data").is_file()
    proto = onnx.load(str(out), load_external_data=False)
    assert external.has_external_data(proto)
    make_session(str(out))  # onnxruntime reads it from the path, data file beside it
    _feeds_equal(str(stored), str(out), load(stored))


def test_external_data_on_request_and_above_the_threshold(tmp_path, monkeypatch):
    small = tmp_path / "small.onnx"
    graphsub.save(_graph(), small)
    assert not external.has_external_data(onnx.load(str(small)))
    out = tmp_path / "asked.onnx"
    r = runner.invoke(app, ["optimize", str(small), "-o", str(out), "--cost", "analytic",
                            "--time-limit", "30", "--threads", "1", "--external-data"],
                      catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert (tmp_path / "asked.onnx.data").is_file()
    _feeds_equal(str(small), str(out), _graph())
    # a graph whose weights exceed the threshold is detached without being asked
    monkeypatch.setattr(external, "EXTERNAL_DATA_BYTES", 1000)
    assert isinstance(to_model_data(_graph()), DetachedModel)


def test_a_large_model_times_one_candidate_against_the_original(stored, monkeypatch):
    monkeypatch.setattr(pipeline_run, "LARGE_MODEL_BYTES", 1000)
    graph = load(stored)
    assert pipeline_run.start_run(graph, Settings.make(cost="analytic")).large
    data, report = optimize_model(graph, model_data(stored), "stored", cost="analytic",
                                  time_limit=30, threads=1, candidates=3)
    assert len(report.candidates) <= 1
    assert any("only the best candidate is timed" in n for n in report.notes)
    assert isinstance(data, DetachedModel)
    _feeds_equal(model_data(stored), data, graph)
    assert report.steps["timing"]["unit"] == "rounds"


def test_weights_graphsub_computes_are_spilled_to_a_mapped_file(stored, tmp_path, monkeypatch):
    """A candidate's computed weights (here two products' weights merged: their concat) are
    moved into a mapped temporary file, so that a session's pages of them can be given back
    like those of the original's data file; the file is gone once mapped, the model runs and
    is written as before."""
    import os
    import tempfile

    from graphsub.runtime.ort_sessions import _release_mapped_pages, file_mapping

    monkeypatch.setattr(external, "SPILL_BYTES", 0)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    b = GraphBuilder(seed=5)
    x = b.input("x", (4, 64))
    w = b.concat(b.he_weight((64, 32)), b.he_weight((64, 32)), axis=1)  # weight-only
    b.output(b.relu(b.matmul(x, w)), "y")
    graph = b.build()
    data = to_model_data(graph, external_data=True)
    assert isinstance(data, DetachedModel)
    merged = [a for a in data.weights.values() if a.shape == (64, 64)]
    assert merged and all(file_mapping(a) is not None for a in merged)
    assert not any(p.name.startswith("graphsub-weights-") for p in tmp_path.iterdir())
    session = make_session(data)
    _release_mapped_pages(data.weights.values())  # the pages come back from the file
    plain = to_model_data(graph, external_data=False)
    _feeds_equal(plain, data, graph)
    del session
    out = tmp_path / "spilled.onnx"
    write_model(data, out)
    _feeds_equal(plain, str(out), graph)
    assert os.path.getsize(str(out) + ".data") >= 64 * 64 * 4
