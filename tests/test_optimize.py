"""graphsub optimize end to end: the written model is checked, the report says what happened,
and a wrong rewrite is caught before anything is written."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from typer.testing import CliRunner

import graphsub
from graphsub.cli import app
from graphsub.ir import GraphBuilder
from graphsub.optimizer import VerificationError, optimize_model
from graphsub.rules import parse_rules
from graphsub.runtime import graph_input_specs
from graphsub.verdicts import compare_models
from graphsub.verdicts.equivalence import Comparison, Tolerance, diff_arrays
from tests.markers import requires_torch

runner = CliRunner()


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHSUB_CACHE_DIR", str(tmp_path / "cache"))


def test_optimize_command_on_a_zoo_model(tmp_path):
    out, report = tmp_path / "opt.onnx", tmp_path / "report.json"
    # bounded by work, with room for the operator timings of a fresh cache on a busy machine
    # (there a 15 s limit went to pricing the original, leaving nothing to measure)
    r = runner.invoke(app, ["optimize", "resnet_blocks:n=1", "-o", str(out), "--budget", "30",
                            "--time-limit", "120", "--report", str(report), "--threads", "1"],
                      catch_exceptions=False)
    assert r.exit_code == 0, r.output
    onnx.checker.check_model(str(out), full_check=True)
    data = json.loads(report.read_text())
    assert data["latency_before_ms"] > 0 and data["latency_after_ms"] > 0
    assert data["search"]["explored"] >= 1
    assert data["verification"]["equivalent"] is True
    assert ("unchanged" in r.stdout) == data["kept_original"]
    original = graphsub.to_onnx(graphsub.zoo.build("resnet_blocks:n=1")).SerializeToString()
    specs = graph_input_specs(graphsub.zoo.build("resnet_blocks:n=1"))
    assert compare_models(original, out.read_bytes(), specs, Tolerance(1e-3, 1e-4)).equivalent


def test_optimize_an_onnx_file_with_json_output(tmp_path):
    b = GraphBuilder(seed=0)
    x = b.input("x", (1, 64))
    y = b.matmul(b.matmul(x, b.he_weight((64, 512))), b.he_weight((512, 64)))
    b.output(y, "y")
    src = tmp_path / "chain.onnx"
    graphsub.save(b.build(), src)
    out = tmp_path / "chain.opt.onnx"
    r = runner.invoke(app, ["optimize", str(src), "-o", str(out), "--json", "--time-limit", "10",
                            "--cost", "analytic"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["predicted_ms_after"] <= data["predicted_ms_before"]
    assert out.exists()


def wrong_rule_model():
    b = GraphBuilder(seed=0)
    x = b.input("x", (64, 512))
    y = x
    for _ in range(4):
        y = b.matmul(y, b.he_weight((512, 512)))
    b.output(y, "y")
    return b.build()


def test_a_wrong_rewrite_is_caught_reported_and_the_original_kept(tmp_path):
    """A rule that drops a matmul (wrong, but faster) must never reach the user: the run
    reports the bug loudly and hands back the original."""
    (bad,) = parse_rules("rule drop-matmul: (matmul ?x ?w) => ?x where (eq (shape ?w) [512 512])")
    g = wrong_rule_model()
    original = graphsub.to_onnx(g).SerializeToString()
    with pytest.warns(RuntimeWarning, match="graphsub bug: verification failed.*drop-matmul"):
        data, report = optimize_model(g, original, rules=[bad], rules_only=True,
                                      cost="analytic", time_limit=10, measure_seconds=0.5)
    assert data == original and report.kept_original
    failed = report.verification["failed_candidate"]
    assert not failed["equivalent"] and failed["rules"][0] == "drop-matmul"
    assert "bug of graphsub's" in report.verdict
    assert any("please report" in note for note in report.notes)


def test_cli_reports_a_verification_failure_and_writes_the_original(tmp_path, monkeypatch):
    import graphsub.pipeline

    # a wrong rule, past the numerical check that would refuse it in a rule file
    (bad,) = parse_rules("rule drop-matmul: (matmul ?x ?w) => ?x where (eq (shape ?w) [512 512])")
    monkeypatch.setattr(graphsub.pipeline, "load_rule_files",
                        lambda paths, rules_only: graphsub.pipeline.RuleSet((bad,)))
    src = tmp_path / "m.onnx"
    graphsub.save(wrong_rule_model(), src)
    out = tmp_path / "out.onnx"
    r = runner.invoke(app, ["optimize", str(src), "-o", str(out), "--cost", "analytic",
                            "--time-limit", "10"])
    assert r.exit_code == 0, r.output
    assert "verification failed" in r.stderr and "drop-matmul" in r.stderr
    assert out.read_bytes() == src.read_bytes()


def test_nothing_faster_means_the_original_is_written(tmp_path):
    b = GraphBuilder()
    x = b.input("x", (4,))
    b.output(b.relu(x), "y")
    src = tmp_path / "tiny.onnx"
    graphsub.save(b.build(), src)
    out = tmp_path / "tiny.opt.onnx"
    r = runner.invoke(app, ["optimize", str(src), "-o", str(out)], catch_exceptions=False)
    assert r.exit_code == 0
    assert "Wrote the original model, unchanged," in " ".join(r.stdout.split())
    assert out.read_bytes() == src.read_bytes()


@requires_torch
@pytest.mark.parametrize("spec", [pytest.param("squeezenet", marks=pytest.mark.slow),
                                  "bert:layers=1,seq=16,hidden=64,heads=4"])
def test_optimize_for_torch_cpu_is_verified_and_reports_the_target(spec):
    """Measuring gets its own limit: within a 10 s whole-run limit, a loaded machine timing
    torch-cpu operators from an empty cache may leave no time to measure the original."""
    graph = graphsub.zoo.build(spec)
    data, rep = optimize_model(graph, label=spec, time_limit=10, measure_limit=60,
                               measure_seconds=0.5, target="torch-cpu", threads=1)
    assert rep.target == "torch-cpu" and rep.device["target"] == "torch-cpu"
    assert rep.device["torch"] and rep.latency_before_ms > 0
    assert rep.verification["equivalent"] is True
    specs = graph_input_specs(graph)
    assert compare_models(graphsub.to_onnx(graph).SerializeToString(), data, specs,
                          Tolerance(1e-3, 1e-4)).equivalent


@requires_torch
def test_search_under_the_torch_target_merges_projections_that_share_an_input():
    """On torch a split is a view, so merging the Q/K/V matmuls pays once the split is free:
    the search finds the merges (under the analytic profile of the target's views)."""
    graph = graphsub.zoo.build("bert:layers=1,seq=16,hidden=64,heads=4")
    result = graphsub.optimize(graph, cost="analytic", target="torch-cpu", time_limit=20)
    assert result.rules_used()["merge-matmuls-shared-input"] == 2
    assert result.final_cost < result.initial_cost


@requires_torch
def test_cli_optimize_and_bench_with_a_target(tmp_path):
    out = tmp_path / "sru.onnx"
    r = runner.invoke(app, ["optimize", "sru", "-o", str(out), "--target", "torch-cpu",
                            "--time-limit", "5", "--json", "--threads", "1"],
                      catch_exceptions=False)
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["target"] == "torch-cpu" and data["device"]["name"]
    r = runner.invoke(app, ["bench", "sru", str(out), "--target", "torch-cpu", "--seconds",
                            "0.3", "--json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    bench = json.loads(r.stdout)
    assert bench["target"] == "torch-cpu" and len(bench["models"]) == 2 and bench["speedup"] > 0


@pytest.mark.parametrize("algorithm", ["pruning", "dpp", "sampling"])
def test_every_algorithm_runs_end_to_end_from_the_cli(tmp_path, algorithm):
    """One interface: the OCGGS algorithms behind `optimize --algorithm`, verified like the
    others, with their statistics in the JSON report."""
    out = tmp_path / "m.onnx"
    r = runner.invoke(app, ["optimize", "resnet_blocks:n=1", "-o", str(out), "--algorithm",
                            algorithm, "--k", "2", "--cost", "analytic", "--time-limit", "20",
                            "--json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["settings"]["algorithm"] == algorithm
    assert report["search"]["stopped_by"] == "exhausted" or algorithm == "sampling"
    onnx.checker.check_model(onnx.load(out))


def test_unknown_algorithm_and_bad_k_are_clear_errors():
    g = GraphBuilder()
    x = g.input("x", (4,))
    g.output(g.relu(x), "y")
    graph = g.build()
    with pytest.raises(graphsub.GraphsubError, match="unknown algorithm 'annealing'"):
        graphsub.optimize(graph, algorithm="annealing", cost="analytic")
    with pytest.raises(graphsub.GraphsubError, match="k must be at least 1"):
        graphsub.optimize(graph, algorithm="dpp", cost="analytic", k=0)


def test_a_shape_mismatch_is_what_the_verification_error_names():
    """When only an output's shape differs, the message named the worst output that passed
    ("max |diff| 0") instead of the shape (fuzzer finding)."""
    passed = diff_arrays("a", np.ones(3), np.ones(3), 1e-3, 1e-4)
    comparison = Comparison(False, (passed,), Tolerance(1e-3, 1e-4), 2,
                            ("output 'b' has shape (4,), expected (3,)",))
    message = str(VerificationError.of(comparison, ["rule-x"]))
    assert "output 'b' has shape (4,), expected (3,)" in message
    assert "max |diff| 0" not in message and "rule-x" in message
