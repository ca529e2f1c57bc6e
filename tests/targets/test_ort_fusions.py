"""`--ort-fusions`: the original and the best candidate written with onnxruntime's fused
com.microsoft operators (onnxscript's ORT fusions) as candidates of their own, measured,
chosen and verified like the others; off by default, and a clear error where it cannot apply."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

import graphsub
from graphsub.targets import ort_fusions
from graphsub.cli import app
from graphsub.errors import GraphsubError
from graphsub.ir import GraphBuilder
from graphsub.onnx_io import to_onnx_bytes
from graphsub.optimizer import optimize_model
from graphsub.pipeline import Settings
from graphsub.runtime import graph_input_specs
from graphsub.verdicts import compare_models
from graphsub.verdicts.equivalence import Tolerance
from graphsub.search.result import StepKind

D = 32


def residual_block() -> bytes:
    """A projection with its bias, a residual sum and a layer norm after it, then GELU: what
    onnxruntime runs as SkipLayerNormalization."""
    rng = np.random.default_rng(0)
    f = TensorProto.FLOAT
    inits = [numpy_helper.from_array((rng.standard_normal((D, D)) / D ** 0.5).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(D).astype(np.float32), "b"),
             numpy_helper.from_array((1 + 0.1 * rng.standard_normal(D)).astype(np.float32), "g"),
             numpy_helper.from_array(rng.standard_normal(D).astype(np.float32), "beta")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"]),
             helper.make_node("Add", ["y", "b"], ["z"]),
             helper.make_node("Add", ["z", "x"], ["r"]),
             helper.make_node("LayerNormalization", ["r", "g", "beta"], ["n"], axis=-1,
                              epsilon=1e-5),
             helper.make_node("Gelu", ["n"], ["out"])]
    graph = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", f, [1, 64, D])],
                              [helper.make_tensor_value_info("out", f, [1, 64, D])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]).SerializeToString()


def domains(model: bytes) -> set[str]:
    return {n.domain for n in onnx.load_from_string(model).graph.node}


def test_fuse_writes_onnxruntimes_operators_that_compute_the_same():
    original = residual_block()
    fused = ort_fusions.fuse(original)
    assert fused is not None and "com.microsoft" in domains(fused)
    specs = graph_input_specs(graphsub.load(original))
    assert compare_models(original, fused, specs, Tolerance(1e-4, 1e-5)).equivalent


def test_fuse_says_none_where_no_pattern_matches():
    b = GraphBuilder(seed=0)
    b.output(b.relu(b.input("x", (4, 4))), "y")
    assert ort_fusions.fuse(to_onnx_bytes(b.build())) is None


def test_the_fused_forms_are_candidates_measured_and_verified():
    original = residual_block()
    data, report = optimize_model(graphsub.load(original), original, "block", time_limit=10,
                                  target="ort-cpu", cost="analytic", ort_fusions=True)
    fused = [c for c in report.candidates if StepKind.ORT_FUSIONS.label in c.rules]
    assert fused, report.candidates  # at least the original, fused, was measured
    assert report.settings["ort_fusions"] is True
    specs = graph_input_specs(graphsub.load(original))
    assert compare_models(original, data, specs, Tolerance(1e-4, 1e-5)).equivalent
    if any(s["kind"] == StepKind.ORT_FUSIONS for s in report.trace):  # it won:
        assert "com.microsoft" in domains(data)  # the file has onnxruntime's operators


def test_by_default_the_output_is_standard_onnx():
    original = residual_block()
    data, report = optimize_model(graphsub.load(original), original, "block", time_limit=5,
                                  target="ort-cpu", cost="analytic")
    assert not any(StepKind.ORT_FUSIONS.label in c.rules for c in report.candidates)
    assert "com.microsoft" not in domains(data)


def test_ort_fusions_on_a_torch_target_is_a_clear_error():
    pytest.importorskip("torch", reason="the torch targets need torch")
    with pytest.raises(GraphsubError, match="onnxruntime target"):
        Settings.make(ort_fusions=True, target="torch-cpu")


def test_without_onnxscript_the_option_names_the_install(monkeypatch, tmp_path):
    monkeypatch.setattr(ort_fusions, "unavailable_reason",
                        lambda: "onnxscript is not installed; install it with pip install "
                                "'graphsub[ort-fusions]'")
    result = CliRunner().invoke(app, ["optimize", "nasrnn", "-o", str(tmp_path / "out.onnx"),
                                      "--ort-fusions",
                                      "--target", "ort-cpu"])
    assert result.exit_code == 2 and "graphsub[ort-fusions]" in result.output
    assert not (tmp_path / "out.onnx").exists()
