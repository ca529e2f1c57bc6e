"""Execution targets: selection and its errors, device descriptions that key the cost cache,
the measured cost model on each available target, cold and hot weights, layouts of views."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from graphsub import zoo
from graphsub.targets import (TargetUnavailableError, default_target_name, get_target,
                               target_names, target_statuses, unavailable_reason)
from graphsub.targets.base import cold_replicas, last_level_cache_bytes, signature_graph
from graphsub.cli import app
from graphsub.cost import MeasuredCostModel, make_cost_model, node_signature
from graphsub.errors import GraphsubError
from graphsub.ir import GraphBuilder
from graphsub.runtime import graph_input_specs, random_feeds, time_runnables
from tests.markers import HAVE_TORCH, requires_torch, targets

runner = CliRunner()


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHSUB_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def torch_sees_gpu() -> bool:
    if not HAVE_TORCH:
        return False
    import torch

    return bool(torch.cuda.is_available())


def test_every_target_is_listed_with_a_reason_when_unavailable():
    statuses = {s.name: s for s in target_statuses()}
    assert list(statuses) == target_names()
    assert {"ort-cpu", "ort-cuda", "torch-cpu", "torch-cuda"} <= set(statuses)
    assert statuses["ort-cpu"].available
    for s in statuses.values():
        assert s.description
        assert s.available or s.reason, s
    assert sum(s.default for s in statuses.values()) == 1
    assert statuses[default_target_name()].default


def test_default_target_follows_the_gpu():
    assert default_target_name() == ("torch-cuda" if torch_sees_gpu() else "ort-cpu")


def test_unknown_and_unavailable_targets_are_clear_errors():
    with pytest.raises(GraphsubError, match="unknown target 'tpu'.*ort-cpu"):
        get_target("tpu")
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        with pytest.raises(TargetUnavailableError, match="ort-cuda.*onnxruntime-gpu"):
            get_target("ort-cuda")
    if not HAVE_TORCH:
        for name in ("torch-cpu", "torch-cuda"):
            with pytest.raises(TargetUnavailableError, match=f"{name} needs torch.*pip install"):
                get_target(name)
    elif not torch_sees_gpu():
        with pytest.raises(TargetUnavailableError, match="torch-cuda.*no CUDA device"):
            get_target("torch-cuda")
        reason = unavailable_reason("torch-cuda")
        assert "no CUDA device" in reason or "no NVIDIA GPU driver" in reason, reason


def test_cli_lists_targets_and_refuses_an_unavailable_one():
    r = runner.invoke(app, ["info", "--targets", "--json"])
    assert r.exit_code == 0, r.output
    data = {d["name"]: d for d in json.loads(r.stdout)}
    assert data["ort-cpu"]["available"] is True
    if not data["ort-cuda"]["available"]:
        r = runner.invoke(app, ["bench", "sru", "--target", "ort-cuda"])
        assert r.exit_code == 2
        assert "ort-cuda" in r.stderr and "onnxruntime-gpu" in r.stderr
        assert "Traceback" not in r.output


@pytest.mark.parametrize("name", targets("ort-cpu", "torch-cpu"))
def test_device_description_keys_the_cache(name):
    target = get_target(name, threads=1)
    info = target.device()
    assert info.target == name and info.name
    assert name in info.key() and "threads=1" in info.key()
    other = get_target(name, threads=2)
    assert other.device().key() != info.key()


def conv_relu_graph():
    b = GraphBuilder(seed=0)
    x = b.input("x", (1, 8, 16, 16))
    b.output(b.relu(b.conv2d(x, b.he_weight((8, 8, 3, 3)))), "y")
    return b.build()


@requires_torch
@pytest.mark.parametrize("name", ["ort-cpu", "torch-cpu"])
def test_measured_cost_on_each_target_is_cached_per_device(name, cache_dir):
    g = conv_relu_graph()
    target = get_target(name, threads=1)
    first = MeasuredCostModel(target=target)
    cost = first.graph_cost(g)
    assert cost > 0 and first.measured == 2 and first.cold_weights is False
    first.cache.close()
    again = MeasuredCostModel(target=get_target(name, threads=1))
    assert again.graph_cost(g) == pytest.approx(cost) and again.measured == 0
    other = "torch-cpu" if name == "ort-cpu" else "ort-cpu"
    elsewhere = MeasuredCostModel(target=get_target(other, threads=1))
    elsewhere.graph_cost(g)
    assert elsewhere.measured == 2  # another target's timings do not apply


@pytest.mark.parametrize("cache_mib", [8, 32, 260])
def test_models_larger_than_the_cache_are_priced_with_cold_weights(monkeypatch, cache_mib):
    """The decision follows the device's cache size (set here: machines differ, from 32 MiB
    of L3 on one to 260 MiB on another) against the model's weights."""
    target = get_target("ort-cpu", threads=1)
    monkeypatch.setattr(target, "cache_bytes", lambda: cache_mib << 20)
    big = zoo.build("nasrnn")  # 84 MB of weights
    held = sum(big[n].type.nbytes for n in big.nodes_by_op("weight"))
    model = MeasuredCostModel(target=target, cache=False)
    model.decide_weights(big)
    assert model.cold_weights is (held > cache_mib << 20)
    small = MeasuredCostModel(target=target, cache=False)
    small.decide_weights(conv_relu_graph())
    assert small.cold_weights is False


def test_the_last_level_cache_size_is_read_from_the_machine():
    assert last_level_cache_bytes() >= 1 << 20


def test_cold_timing_uses_replicas_with_weights_of_their_own():
    g = zoo.build("nasrnn")
    mm = g.nodes_by_op("matmul")[0]
    sig = node_signature(g, mm)
    r = cold_replicas(sig, 32 << 20)
    assert 3 <= r <= 64
    graph, feeds = signature_graph(sig, r)
    weights = [graph[n].attrs["value"] for n in graph.nodes_by_op("weight")]
    assert len(weights) == r and len(set(weights)) == r  # different data per replica
    assert len(graph.outputs) == r and len(feeds) == 1
    target = get_target("ort-cpu", threads=1)
    assert target.time_op(sig, cold_weights=True) > 0


@requires_torch
def test_torch_signatures_carry_the_strides_of_views():
    b = GraphBuilder(seed=0)
    x = b.input("x", (16, 32))
    y = b.matmul(b.transpose(x, perm=(1, 0)), b.input("z", (16, 8)))
    b.output(y, "y")
    g = b.build()
    torch_model = make_cost_model("measured", target=get_target("torch-cpu", threads=1))
    ort_model = make_cost_model("measured", target=get_target("ort-cpu", threads=1))
    mm = g.outputs[0].node
    torch_sig = node_signature(g, mm, torch_model.layouts)
    assert torch_sig.layouts == ((1, 32), None) and "strides=1,32;" in torch_sig.key()
    assert node_signature(g, mm, ort_model.layouts).layouts is None
    assert torch_model.graph_cost(g) > 0


@requires_torch
def test_analytic_cost_frees_the_targets_views():
    g = zoo.build("bert:layers=1")
    torch_analytic = make_cost_model("analytic", target=get_target("torch-cpu", threads=1))
    ort_analytic = make_cost_model("analytic", target=get_target("ort-cpu", threads=1))
    transpose = g.nodes_by_op("transpose")[0]
    assert torch_analytic.node_cost(g, transpose) == 0.0
    assert ort_analytic.node_cost(g, transpose) > 0.0


@pytest.mark.parametrize("name", targets("ort-cpu", "torch-cpu"))
def test_targets_run_and_time_a_model_and_agree(name):
    g = zoo.build("sru")
    target = get_target(name, threads=1)
    runnable = target.prepare(g)
    feeds = random_feeds(graph_input_specs(g))
    (timing,) = time_runnables([runnable], feeds, rounds=2, block=2)
    assert len(timing.samples) == 4 and timing.median > 0
    from graphsub.runtime import evaluate

    ref = evaluate(g, feeds)
    got = runnable.run(feeds)
    for k in ref:
        np.testing.assert_allclose(got[k], ref[k], rtol=1e-3, atol=1e-4)
