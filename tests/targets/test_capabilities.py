"""Targets are told apart by the capabilities they declare, never by their names: a new
onnxruntime provider (here a test-only stand-in named like the real ones) gets the stages its
capabilities call for, with no change anywhere else."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from graphsub.targets import capabilities, get_target, target_statuses
from graphsub.cli import app
from graphsub.errors import GraphsubError
from graphsub.pipeline import Settings, verify_stage
from graphsub.pipeline.settings import parse_target_option
from graphsub.optimizer import optimize_model
from tests.targets import stand_in_target
from tests.report.conftest import Slowed, transposes_model

SRC = Path(__file__).resolve().parents[2] / "src"


def test_no_stage_reads_a_target_name():
    pattern = re.compile(r'startswith\("(ort|torch)-|== "torch-cuda"|== "ort-c')
    found = [f"{p.relative_to(SRC)}:{n}" for p in SRC.rglob("*.py")
             for n, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not found, found


def test_the_stand_in_is_a_registered_target_with_its_own_capabilities():
    statuses = {s.name: s for s in target_statuses()}
    assert statuses[stand_in_target.NAME].available
    caps = capabilities(stand_in_target.NAME)
    assert caps.runs == "onnx" and not caps.vendor_operators and not caps.is_reference
    assert capabilities("ort-cpu").is_reference and capabilities("ort-cpu").vendor_operators
    target = get_target(stand_in_target.NAME, threads=1)
    assert target.device().target == stand_in_target.NAME


def test_vendor_operators_follow_the_capability_not_the_name(tmp_path):
    with pytest.raises(GraphsubError, match="not on ort-stand-in"):
        Settings.make(ort_fusions=True, target=stand_in_target.NAME)
    result = CliRunner().invoke(app, ["optimize", "nasrnn", "-o", str(tmp_path / "out.onnx"),
                                      "--target", stand_in_target.NAME, "--ort-fusions"])
    assert result.exit_code == 2 and "not on ort-stand-in" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "out.onnx").exists()


def test_an_option_the_target_lacks_is_refused():
    """The message names the target that has the option even where torch is not installed
    (the registry declares what the torch targets are)."""
    with pytest.raises(GraphsubError,
                       match="cuda_graphs is an option of torch-cuda, not of ort-cpu"):
        Settings.make(target="ort-cpu", cuda_graphs=False)
    with pytest.raises(GraphsubError, match="has no option allow_tf32"):
        get_target("ort-cpu", allow_tf32=True)
    with pytest.raises(GraphsubError, match="the ort-cpu target has no option 'cuda_graphs'.*"
                                            "cuda_graphs is an option of torch-cuda"):
        parse_target_option("ort-cpu", "cuda_graphs=false")
    assert parse_target_option("torch-cuda", "cuda-graphs=false") == ("cuda_graphs", False)
    with pytest.raises(GraphsubError, match="'often' is not a value of bool"):
        parse_target_option("torch-cuda", "allow_tf32=often")
    torch_cuda = Settings.make(target="torch-cuda", cuda_graphs=False, time_limit=5)
    assert torch_cuda.target_options == {"cuda_graphs": False}
    assert torch_cuda.as_dict()["cuda_graphs"] is False
    with pytest.raises(GraphsubError, match="torch-cuda target's allow_tf32 takes bool"):
        Settings.make(target="torch-cuda", allow_tf32="yes")


def test_the_torch_targets_capabilities_are_known_without_importing_torch():
    """So that the plain install (no torch) names torch-cuda's options as torch-cuda's."""
    code = ("import sys; from graphsub.targets import capabilities; "
            "caps = capabilities('torch-cuda'); "
            "assert 'cuda_graphs' in caps.option_names and caps.runs == 'torch', caps; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(SRC)})
    assert done.returncode == 0, done.stderr


def slowed(target):
    """The target, with the original model sleeping in every run (see tests/report)."""
    prepare = target.prepare

    def slow_original(graph, onnx=None, label="", session=None):
        runnable = prepare(graph, onnx, label, session=session)
        return Slowed(runnable) if label == "original" else runnable

    target.prepare = slow_original
    return target


@pytest.mark.parametrize("name,on_target", [(stand_in_target.NAME, True), ("ort-cpu", False)])
def test_a_kept_model_is_verified_on_a_target_that_is_not_the_reference(monkeypatch, name,
                                                                        on_target):
    calls = []
    check = verify_stage.check_equivalence_on_target

    def recorded(*args, **kwargs):
        calls.append(args)
        return check(*args, **kwargs)

    monkeypatch.setattr(verify_stage, "check_equivalence_on_target", recorded)
    target = slowed(get_target(name, threads=1))
    _, report = optimize_model(transposes_model(), None, "transposes", time_limit=8,
                               measure_limit=5, cost="analytic", target=target, threads=1,
                               evidence=False)
    assert report.outcome == "faster", report.verdict
    assert bool(calls) == on_target
    assert report.verification["equivalent"]
