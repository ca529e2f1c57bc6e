"""The whole generator: tasks on every executor give the same rules, the rule file loads and
verifies, known rules over convolutions are found and proven, and `graphsub optimize` uses a
generated rule set with a numerically checked result."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import graphsub
from graphsub import zoo
from graphsub.cli import app
from graphsub.generate import generate, make_executor, rules_text
from graphsub.generate.recall import canonical_forms
from graphsub.rules import load_rules, parse_rules
from graphsub.runtime import graph_input_specs
from graphsub.verdicts import compare_models
from graphsub.verdicts.equivalence import Tolerance
from graphsub.proofs import verify_rule

runner = CliRunner()
MATRIX_OPS = ["matmul", "ewadd", "transpose"]


def texts(rules) -> list[str]:
    return sorted(" ".join(canonical_forms(r)) for r in rules)


@pytest.fixture(scope="module")
def matrix_rules():
    return generate(2, MATRIX_OPS, executor=make_executor("serial"), timeout_ms=2000)


def test_generated_file_loads_checks_and_marks_every_rule(matrix_rules, tmp_path):
    rules, report = matrix_rules
    path = tmp_path / "gen.rules"
    path.write_text(rules_text(rules, report))
    loaded = load_rules([path])  # the numeric check `graphsub optimize --rules` runs
    assert len(loaded) == len(rules) == report.prune.counts[-1][1] - len(report.dropped)
    counts = report.status_counts
    assert counts["proven"] >= len(rules) - 2 and counts["refuted"] == 0
    for r in loaded:
        assert ("verified: proven by Z3" in r.doc) == (report.verdicts[r.name][0] == "proven")

@pytest.mark.slow
def test_distributivity_is_found_at_three_operators_and_proven():
    (wanted,) = parse_rules("rule d: (add :same-shapes true (matmul :activation none ?a ?b) "
                            "(matmul :activation none ?a ?c)) => (matmul :activation none ?a "
                            "(add :same-shapes true ?b ?c))")
    rules, report = generate(3, ["matmul", "ewadd"], variables=2, executor=make_executor("serial"),
                             verify=False)
    hits = [r for r in rules if set(canonical_forms(r)) & set(canonical_forms(wanted))]
    assert hits and verify_rule(hits[0], timeout_ms=5000).status == "proven"
    assert report.graphs["matrix"][3] > report.graphs["matrix"][2] > report.graphs["matrix"][1]


@pytest.mark.slow
def test_process_pool_and_dask_find_the_same_rules_as_one_process():
    serial, _ = generate(2, MATRIX_OPS, executor=make_executor("serial"), verify=False)
    for kind in ("process", "dask"):
        executor = make_executor(kind, 2)
        try:
            rules, report = generate(2, MATRIX_OPS, executor=executor, verify=False, shards=4)
        finally:
            executor.close()
        assert report.workers == 2 and texts(rules) == texts(serial), kind


def test_convolution_rules_are_found_and_verified():
    rules, report = generate(2, ["conv", "relu"], variables=2, executor=make_executor("serial"),
                             timeout_ms=2000)
    by_form = {f: r for r in rules for f in canonical_forms(r)}
    (fused,) = parse_rules("rule f: (relu (conv2d ?x ?w :stride [1 1] :padding same "
                           ":dilation [1 1] :activation none)) => (conv2d ?x ?w :stride [1 1] "
                           ":padding same :dilation [1 1] :activation relu)")
    hit = [by_form[f] for f in canonical_forms(fused) if f in by_form]
    # verified: the exact test vouches for it (Z3's axioms describe ungrouped convolution
    # only, and a generated rule does not say its convolution is ungrouped)
    assert hit and report.verdicts[hit[0].name][0] in ("proven", "tested")


def test_rules_with_constants_are_written_with_their_shape_and_proven():
    rules, report = generate(2, ["matmul", "ewadd"], variables=2, executor=make_executor("serial"),
                             timeout_ms=2000)
    with_eye = [r for r in rules if ":pattern eye" in str(r.targets)
                or any(":pattern eye" in line for line in rules_text([r], report).splitlines())]
    assert with_eye
    assert any(report.verdicts[r.name][0] == "proven" for r in with_eye)


def test_cli_generate_then_verify(tmp_path):
    path = tmp_path / "gen.rules"
    r = runner.invoke(app, ["generate", "-n", "2", "--ops", "matmul,ewadd", "--variables", "2",
                            "-o", str(path), "--executor", "serial", "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["rules"] == len(load_rules([path])) and data["verification"]["proven"] >= 1
    r = runner.invoke(app, ["verify", str(path), "--executor", "serial", "--json",
                            "--timeout-ms", "2000"])
    assert r.exit_code == 0, r.output
    v = json.loads(r.stdout)
    assert v["total"] == data["rules"] == v["proven"] + v["tested"] + v["unknown"] + v["refuted"]
    assert v["refuted"] == 0 and v["proven"] >= data["verification"]["proven"]


def test_cli_help_lists_every_generator_operator():
    from graphsub.cli.generate import GENERATOR_OPS
    from graphsub.generate.opset import OPS

    assert GENERATOR_OPS.split(", ") == list(OPS)


def test_cli_errors_are_one_line(tmp_path):
    r = runner.invoke(app, ["generate", "-n", "2", "--ops", "matmul,frobnicate",
                            "-o", str(tmp_path / "x.rules")])
    assert r.exit_code == 2 and "frobnicate" in r.output and "Traceback" not in r.output
    r = runner.invoke(app, ["verify", str(tmp_path / "missing.rules")])
    assert r.exit_code == 2 and "does not exist" in r.output


def test_verify_refutes_a_wrong_rule(tmp_path):
    path = tmp_path / "bad.rules"
    path.write_text("rule relu-linear: (relu (add ?x ?y)) => (add (relu ?x) (relu ?y))\n")
    r = runner.invoke(app, ["verify", str(path), "--executor", "serial", "--json",
                            "--timeout-ms", "1000"])
    assert r.exit_code == 1
    assert json.loads(r.stdout)["refuted"] == 1


@pytest.mark.slow  # generation at three operators: minutes (its numerical pruning)
def test_optimize_uses_generated_rules_with_a_checked_result(tmp_path, monkeypatch):
    """TASO figure 2b's merge comes out of the generator and applies to SRU's three matmuls
    that share their input; the optimized graph computes the same outputs."""
    monkeypatch.setenv("GRAPHSUB_CACHE_DIR", str(tmp_path / "cache"))
    rules, _ = generate(3, ["matmul", "concat", "split"], variables=2,
                        executor=make_executor("serial"), verify=False)
    graph = zoo.build("sru:hidden=64,steps=1")
    result = graphsub.optimize(graph, rules=rules, rules_only=True, cost="analytic",
                               time_limit=10, budget=20)
    assert result.stats.matches > 0 and result.stats.generated > 0
    for candidate in result.candidates:
        original = graphsub.to_onnx(graph).SerializeToString()
        rewritten = graphsub.to_onnx(candidate.graph).SerializeToString()
        assert compare_models(original, rewritten, graph_input_specs(graph),
                              Tolerance(1e-3, 1e-4)).equivalent


@pytest.mark.slow
def test_cli_axioms_check_validates_all_axioms():
    r = runner.invoke(app, ["axioms", "check", "--no-redundancy", "--timeout-ms", "2000",
                            "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["ok"] and data["validation"]["valid"] == 43 and data["validation"]["invalid"] == 0
    assert data["consistency"]["status"] in ("sat", "unknown")
    assert "steps, each a Z3 query of at most 2 s" in r.stderr  # its time, said up front


def test_verify_says_a_shared_reason_once(tmp_path):
    """Rules not proven for one reason share a row: the reason is printed once, with them."""
    path = tmp_path / "erf.rules"
    path.write_text("rule e1: (erf (neg ?x)) => (neg (erf ?x))\n"
                    "rule e2: (neg (erf (neg ?x))) => (erf ?x)\n")
    r = runner.invoke(app, ["verify", str(path), "--executor", "serial", "--json",
                            "--timeout-ms", "1000"])
    reasons = {v["reason"] for v in json.loads(r.stdout)["rules"]}
    assert len(reasons) == 1 and json.loads(r.stdout)["unknown"] == 2
    r = runner.invoke(app, ["verify", str(path), "--executor", "serial", "--timeout-ms", "1000"],
                      env={"COLUMNS": "300"}, terminal_width=300)
    assert r.exit_code == 0
    # the reason may wrap inside its cell: read the "why" column's lines back together
    why = "".join("".join(line.split("│")[2].split()) for line in r.stdout.splitlines()
                  if line.count("│") >= 4)
    assert why.count("".join(reasons.pop().split())) == 1, r.stdout
    assert "2: e1, e2" in r.stdout
