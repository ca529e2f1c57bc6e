"""One model, one operator count: `zoo export`, `info` and `optimize` count the operators of
the ONNX file as graphsub reads it (inputs, weights and what weights alone compute are not
operators; a zoo model's fused conv-relu is two operators in the file)."""

from __future__ import annotations

import re

from typer.testing import CliRunner

import graphsub
from graphsub.cli import app
from graphsub.report.summary import operator_count, summarize


def test_zoo_export_info_and_optimize_give_one_operator_count(tmp_path):
    path = tmp_path / "sq.onnx"
    runner = CliRunner()
    exported = runner.invoke(app, ["zoo", "export", "squeezenet", "-o", str(path)])
    assert exported.exit_code == 0, exported.output
    loaded = graphsub.load(str(path))
    count = operator_count(loaded)
    assert f"{count} operators" in exported.output
    assert count == sum(summarize(loaded).ops.values()) and count < len(loaded)
    info = runner.invoke(app, ["info", str(path)], env={"COLUMNS": "200"})
    assert re.search(rf"operators\s*│\s*{count} ", info.output), info.output
    _, report = graphsub.optimize_model(loaded, path.read_bytes(), cost="analytic",
                                        time_limit=3, fission=False, peers=False)
    assert report.nodes_before == count
