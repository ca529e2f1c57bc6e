"""Old and new opsets (issue 51): a model is brought to the opsets graphsub models only where
onnx's version converter keeps its meaning, else read and written at its own opset with its
operators as they are; a model the target cannot run is refused, one way everywhere."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.reference
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

import graphsub
from graphsub.cli import app

runner = CliRunner()


def prelu_opset6() -> onnx.ModelProto:
    """PRelu with a per-channel slope of shape [C], as opset 6 reads it (opset 7 broadcasts a
    slope of [C] over the last axis instead, and onnxruntime then rejects the model)."""
    slope = numpy_helper.from_array(np.array([0.1, 0.2, 0.3], np.float32), "slope")
    graph = helper.make_graph(
        [helper.make_node("PRelu", ["x", "slope"], ["y"])], "prelu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 5]),
         helper.make_tensor_value_info("slope", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 4, 5])],
        initializer=[slope])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 6)])
    model.ir_version = 3
    return model


def reference(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    return onnx.reference.ReferenceEvaluator(model).run(None, {"x": x})[0]


def test_an_opset_6_prelu_is_written_back_with_its_meaning(tmp_path):
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(prelu_opset6(), src)
    loaded = graphsub.open_model(src)
    assert "opset 6 kept" in loaded.graph.facts.opset_kept
    graphsub.save(loaded.graph, out)
    written = onnx.load(out)
    assert written.opset_import[0].version == 6
    x = np.random.default_rng(0).standard_normal((1, 3, 4, 5)).astype(np.float32)
    np.testing.assert_allclose(reference(written, x), reference(prelu_opset6(), x))


def test_a_model_the_target_cannot_run_is_refused_in_one_line_and_nothing_is_written(
        tmp_path):
    """onnxruntime has no kernel for PRelu-6: refused whether or not the search found
    anything (it finds nothing here), exit 2, no file."""
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(prelu_opset6(), src)
    r = runner.invoke(app, ["optimize", str(src), "-o", str(out), "--target", "ort-cpu",
                            "--time-limit", "3"])
    assert r.exit_code == 2, r.output
    assert "ort-cpu cannot run the original model" in r.output and "PRelu" in r.output
    assert not out.exists()


def test_a_model_of_the_ml_domain_alone_needs_no_conversion():
    """An ai.onnx.ml pipeline imports no opset of ONNX's default domain (it was read as
    opset 1 and refused)."""
    node = helper.make_node("Normalizer", ["x"], ["y"], domain="ai.onnx.ml", norm="L2")
    graph = helper.make_graph([node], "ml", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [2, 3])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("ai.onnx.ml", 1)])
    model.ir_version = 8
    graph_ = graphsub.load(model)
    assert not graph_.facts.opset_kept
    assert [n.op for n in graph_.nodes.values() if n.op not in ("input",)] == ["opaque"]
