"""Fission and orchestration in the optimizer: a model written in primitives gets the fused
kernels its target has, the target's kernel library follows the model's opset, and the report
says what was chosen."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

import graphsub
from graphsub.ir.facts import GraphFacts
from graphsub.targets import get_target
from graphsub.cli import app
from graphsub.cost import AnalyticCostModel
from graphsub.fission import fission
from graphsub.fission.stage import fission_and_orchestrate
from graphsub.ir.builder import GraphBuilder
from graphsub.optimizer import optimize_model
from graphsub.runtime.reference import evaluate

runner = CliRunner()


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHSUB_CACHE_DIR", str(tmp_path / "cache"))


def _block(opset: int, gelu: str = "none"):
    """A transformer-like block: layer norm, projection, GELU, attention-like softmax."""
    b = GraphBuilder(seed=3)
    x = b.input("x", (8, 32))
    h = b.op("layer_norm", x, b.weight(np.linspace(0.5, 1.5, 32, dtype=np.float32)),
             b.weight(np.linspace(-0.2, 0.2, 32, dtype=np.float32)), epsilon=1e-5)
    h = b.op("gelu", b.matmul(h, b.he_weight((32, 32))), approximate=gelu)
    scores = b.matmul(h, b.op("transpose", h, perm=(1, 0)))
    b.output(b.matmul(b.op("softmax", scores, axis=-1), h), "y")
    return b.build(GraphFacts(opset=opset))


def _primitive_model(opset: int, gelu: str = "none"):
    """The block as an exporter that knows no fused operators writes it: all primitives."""
    return fission(_block(opset, gelu))


def _outputs(graph):
    feeds = {"x": np.random.default_rng(0).standard_normal((8, 32)).astype(np.float32)}
    return evaluate(graph, feeds)["y"]


@pytest.mark.parametrize("op, attrs, first", [("gelu", {}, 20), ("layer_norm", {}, 17),
                                              ("softmax", {"axis": -1}, 13)])
def test_onnxruntime_kernel_library_follows_the_opset(op, attrs, first):
    b = GraphBuilder(seed=0)
    x = b.input("x", (4, 8))
    args = [x] + ([b.weight(np.ones(8, np.float32))] if op == "layer_norm" else [])
    b.output(b.op(op, *args, **attrs))
    graph = b.build()
    target = get_target("ort-cpu")
    assert target.runs_as_one_kernel(graph, first)
    if first > 13:
        assert not target.runs_as_one_kernel(graph, first - 1)


def test_a_model_written_in_primitives_gets_the_fused_kernels_of_its_opset():
    model = _primitive_model(opset=17)
    assert not {"softmax", "layer_norm", "gelu"} & {n.op for n in model.nodes.values()}
    target = get_target("ort-cpu")
    outcome = fission_and_orchestrate(model, AnalyticCostModel(), target.runs_as_one_kernel)
    ops = {n.op for n in outcome.graph.nodes.values()}
    # Gelu is one ONNX operator from opset 20 only: at 17 it stays primitives.
    assert {"softmax", "layer_norm"} <= ops and "gelu" not in ops
    assert outcome.orchestration.status == "optimal"
    kernels = {k["kernel"] for k in outcome.as_dict()["kernels"]}
    assert kernels == {"softmax", "layer_norm"}
    np.testing.assert_allclose(_outputs(outcome.graph), _outputs(model), rtol=1e-4, atol=1e-5)
    at_20 = fission_and_orchestrate(_primitive_model(opset=20), AnalyticCostModel(),
                                    target.runs_as_one_kernel)
    assert "gelu" in {n.op for n in at_20.graph.nodes.values()}


def test_the_tanh_form_of_gelu_is_recognized_too():
    outcome = fission_and_orchestrate(_primitive_model(opset=20, gelu="tanh"),
                                      AnalyticCostModel())
    gelus = [n for n in outcome.graph.nodes.values() if n.op == "gelu"]
    assert [g.attrs["approximate"] for g in gelus] == ["tanh"]


def test_optimize_model_reports_the_kernels_chosen():
    model = _primitive_model(opset=17)
    data, report = optimize_model(model, cost="analytic", time_limit=10, measure_seconds=0.5)
    f = report.fission
    # the search's normal form reads the written-out GELU as one operator (activations.rules),
    # which fission splits again: at opset 17 onnxruntime has no one kernel for it
    assert f["split"] in ({}, {"gelu": 1}) and f["candidates"]["library"] >= 2
    assert {k["kernel"] for k in f["kernels"]} == {"softmax", "layer_norm"}
    assert all(k["replaced"] for k in f["kernels"])
    assert isinstance(f["kept"], bool)
    if f["kept"]:
        assert any(s["kind"] == "fission" for s in report.trace)
    assert report.verification.get("equivalent") is True
    _, without = optimize_model(model, cost="analytic", time_limit=10, measure_seconds=0.5,
                                fission=False)
    assert without.fission == {}


def test_cli_no_fission(tmp_path):
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    graphsub.save(_primitive_model(opset=17), src)
    r = runner.invoke(app, ["optimize", str(src), "-o", str(out), "--cost", "analytic",
                            "--time-limit", "8", "--no-fission", "--json"],
                      catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["fission"] == {}


def test_primitives_written_another_way_are_recognized():
    """A layer norm written with Pow(d, 2) and GELU with a division by sqrt 2, as the legacy
    exporters write them, normalize to the primitives the kernel rules know."""
    b = GraphBuilder(seed=5)
    x = b.input("x", (8, 32))
    scalar = lambda v: b.weight(np.array(v, np.float32))  # noqa: E731
    d = b.op("sub", x, b.op("reduce_mean", x, axes=(-1,)))
    var = b.op("reduce_mean", b.op("pow", d, scalar(2.0)), axes=(-1,))
    norm = b.op("div", d, b.op("sqrt", b.op("add", var, scalar(1e-5))))
    h = b.op("add", b.op("mul", norm, b.weight(np.full(32, 1.1, np.float32))),
             b.weight(np.full(32, 0.1, np.float32)))
    erf = b.op("erf", b.op("div", h, scalar(np.sqrt(2.0))))
    gelu = b.op("mul", b.op("mul", scalar(0.5), h), b.op("add", erf, scalar(1.0)))
    b.output(gelu, "y")
    model = b.build(GraphFacts(opset=20))
    outcome = fission_and_orchestrate(model, AnalyticCostModel(),
                                      get_target("ort-cpu").runs_as_one_kernel)
    assert {"layer_norm", "gelu"} <= {n.op for n in outcome.graph.nodes.values()}
    np.testing.assert_allclose(_outputs(outcome.graph), _outputs(model), rtol=1e-4, atol=1e-5)
