"""Extension by registration: an algorithm, a target or an extractor is declared in one
registry, with its options; the settings, the API and the command line's help read them
from there, and an algorithm added by one module of its own works everywhere."""

from __future__ import annotations

import importlib
import json

import numpy as np
import onnx
import pytest
from typer.testing import CliRunner

import graphsub
from graphsub.targets import capabilities, target_names
from graphsub.cli import app
from graphsub.egraph.extract import EXTRACTORS
from graphsub.egraph.saturation import EqsatOptions
from graphsub.errors import GraphsubError
from graphsub.pipeline import Settings
from graphsub.search import ALGORITHMS, registry
from graphsub.search.registry import DECLARED
from tests.targets import stand_in_target

runner = CliRunner()


@pytest.fixture
def stand_in(monkeypatch):
    """The stand-in algorithm's module imported afresh into a copy of the declarations, so
    that no other test sees it."""
    monkeypatch.setattr(registry, "DECLARED", dict(DECLARED))
    from tests.search import stand_in_algorithm

    return importlib.reload(stand_in_algorithm)


def test_every_built_in_option_says_what_it_does():
    for algorithm in ALGORITHMS.values():
        assert algorithm.summary, algorithm.name
        for spec in algorithm.option_specs():
            assert spec.help, f"{algorithm.name}.{spec.name} has no help"
    for name in target_names():
        assert all(option.help for option in capabilities(name).options), name


def test_the_help_lists_every_registered_algorithm_and_target_and_its_options():
    r = runner.invoke(app, ["optimize", "--help"], env={"COLUMNS": "200"}, terminal_width=200)
    text = " ".join(r.output.split())
    built_in = [n for n in target_names() if n != stand_in_target.NAME]  # a test's, later
    for name in [*DECLARED, *built_in]:
        assert name in text, name
    assert "torch-cuda: cuda_graphs=true, allow_tf32=false" in text
    listed = json.loads(runner.invoke(app, ["info", "--algorithms", "--json"]).stdout)
    assert [a["name"] for a in listed] == list(DECLARED)
    mcts = next(a for a in listed if a["name"] == "mcts")
    assert {"name": "c", "type": "float", "default": 0.5, "least": 0.0,
            "help": "UCB1's exploration constant"} in mcts["options"]
    targets = json.loads(runner.invoke(app, ["info", "--targets", "--json"]).stdout)
    cuda = next(t for t in targets if t["name"] == "torch-cuda")
    assert [o["name"] for o in cuda["options"]] == ["cuda_graphs", "allow_tf32"]


def test_an_option_below_its_least_is_refused_as_the_options_declare_it():
    with pytest.raises(GraphsubError, match="q must be at least 1"):
        Settings.make(algorithm="sampling", q=0)
    with pytest.raises(GraphsubError, match="extract_time must be at least 0"):
        Settings.make(algorithm="eqsat", extract_time=-1.0)


def test_the_extractors_are_one_registry():
    assert EqsatOptions().extractors == tuple(EXTRACTORS)
    with pytest.raises(GraphsubError, match="unknown extractor"):
        Settings.make(algorithm="mcts", extractors=("ilp", "fastest"))
    with pytest.raises(GraphsubError, match="extractors must name at least one"):
        EqsatOptions(extractors=())


def test_an_algorithm_added_by_one_module_works_in_the_api_and_the_command_line(tmp_path,
                                                                              stand_in):
    name = stand_in.NAME
    assert name in ALGORITHMS and ALGORITHMS[name].option_names() == ["steps"]
    graph = graphsub.load(_two_transposes())
    result = graphsub.optimize(graph, algorithm=name, steps=1, cost="analytic", time_limit=5)
    assert [s.rule for s in result.trace].count("first match") == 1
    with pytest.raises(GraphsubError, match="steps must be at least 0"):
        Settings.make(algorithm=name, steps=-1)
    listed = json.loads(runner.invoke(app, ["info", "--algorithms", "--json"]).stdout)
    assert any(a["name"] == name and a["options"][0]["help"] == "rewrites applied"
               for a in listed)
    model = tmp_path / "m.onnx"
    onnx.save_model(_two_transposes(), str(model))
    r = runner.invoke(app, ["optimize", str(model), "-o", str(tmp_path / "out.onnx"),
                            "--algorithm", name, "-O", "steps=2", "--cost", "analytic",
                            "--time-limit", "5", "--no-fission", "--no-peers", "--json"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["settings"]["algorithm"] == name and report["settings"]["steps"] == 2


def _two_transposes() -> onnx.ModelProto:
    from onnx import helper

    from tests.onnx_io.helpers import init, make_model, vi

    w = np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]),
             helper.make_node("Transpose", ["t"], ["u"], perm=[1, 0]),
             helper.make_node("MatMul", ["u", "w"], ["y"])]
    return make_model(nodes, [vi("x", [8, 8])], [vi("y", [8, 8])], [init("w", w)])


def test_a_target_option_from_the_command_line(tmp_path):
    r = runner.invoke(app, ["optimize", "nasrnn", "-o", str(tmp_path / "out.onnx"),
                            "--target", "ort-cpu", "--target-option", "cuda_graphs=false"])
    assert r.exit_code == 2
    assert "the ort-cpu target has no option 'cuda_graphs'" in r.output
    assert "cuda_graphs is an option of torch-cuda" in r.output
    assert not (tmp_path / "out.onnx").exists()


def test_the_command_lines_help_reads_the_registries_without_importing_what_they_name():
    """The help lists every algorithm and target with its options, yet `graphsub --help`
    imports no search, no target, no cost model, neither onnxruntime nor torch."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    src = Path(__file__).resolve().parents[2] / "src"
    code = ("import sys, graphsub.cli; heavy = [m for m in ('graphsub.search.backtracking', "
            "'graphsub.egraph.saturation', 'graphsub.targets.base', 'graphsub.cost', "
            "'onnxruntime', 'torch', 'scipy') if m in sys.modules]; assert not heavy, heavy")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(src)})
    assert done.returncode == 0, done.stderr
