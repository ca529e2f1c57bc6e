"""ONNX models in bfloat16: they load, evaluate (graphsub's reference computes in float32 and
rounds), are written back in bfloat16, and are optimized for the torch targets, which run
them; onnxruntime's CPU provider, which has few bfloat16 kernels, is refused with a way out."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphsub
from graphsub.ir import GraphBuilder
from graphsub.onnx_io import load, to_onnx_bytes
from graphsub.runtime import evaluate, graph_input_specs, random_feeds


def bf16_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((16, 16)).astype("bfloat16"), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"]),
             helper.make_node("Relu", ["y"], ["z"]),
             helper.make_node("Transpose", ["z"], ["t"], perm=[1, 0]),
             helper.make_node("Transpose", ["t"], ["out"], perm=[1, 0])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.BFLOAT16, [4, 16])], [helper.make_tensor_value_info(
            "out", TensorProto.BFLOAT16, [4, 16])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_bfloat16_model_loads_evaluates_and_round_trips():
    graph = load(bf16_model().SerializeToString())
    assert {t.dtype for n in graph.nodes.values() for t in n.outputs} == {"bfloat16"}
    feeds = random_feeds(graph_input_specs(graph), seed=1)
    assert feeds["x"].dtype == np.dtype("bfloat16")
    out = evaluate(graph, feeds)["out"]
    x, w = feeds["x"].astype(np.float32), graph_weights(graph)
    want = np.maximum(x @ w, 0).astype("bfloat16")
    np.testing.assert_array_equal(out, want)  # float32 inside, rounded once
    again = load(to_onnx_bytes(graph))
    np.testing.assert_array_equal(evaluate(again, feeds)["out"], out)
    assert graph.structural_hash() == again.structural_hash()


def graph_weights(graph) -> np.ndarray:
    (nid,) = graph.nodes_by_op("weight")
    return graph[nid].attrs["value"].array.astype(np.float32)


def test_bfloat16_weights_hash_by_their_bytes():
    a = GraphBuilder()
    a.output(a.add(a.input("x", (2,), "bfloat16"), a.weight(np.ones(2, "bfloat16"))), "y")
    b = GraphBuilder()
    b.output(b.add(b.input("x", (2,), "bfloat16"), b.weight(np.full(2, 2, "bfloat16"))), "y")
    assert a.build().structural_hash() != b.build().structural_hash()


def run_cli(args, tmp_path):
    env = {**os.environ, "GRAPHSUB_CACHE_DIR": str(tmp_path / "cache"), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-c", "from graphsub.cli import main; main()",
                           *args], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=600)


def test_ort_cpu_refuses_bfloat16_with_the_targets_that_run_it(tmp_path):
    path = tmp_path / "bf16.onnx"
    onnx.save(bf16_model(), path)
    proc = run_cli(["optimize", str(path), "-o", str(tmp_path / "out.onnx"), "--target",
                    "ort-cpu", "--time-limit", "10"], tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "bfloat16" in proc.stderr and "--target torch-cpu" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "out.onnx").exists()


def test_bfloat16_models_are_optimized_for_torch_and_verified_by_the_reference(tmp_path):
    pytest.importorskip("torch")
    from graphsub.targets import get_target
    from graphsub.pipeline.verify_stage import check_equivalence_by_reference

    graph = load(bf16_model().SerializeToString())
    result = graphsub.optimize(graph, time_limit=5, target="torch-cpu")
    assert result.rules_used()["fold-transpose-pair"] == 1
    target = get_target("torch-cpu")
    runnable = target.prepare(result.graph, None, "candidate")
    specs = [graph_input_specs(graph)]
    assert check_equivalence_by_reference(graph, result.graph, runnable, specs).equivalent
    # a candidate that computes something else is caught
    b = GraphBuilder()
    b.output(b.relu(b.input("x", (4, 16), "bfloat16")), "out")
    wrong = b.build()
    bad = check_equivalence_by_reference(graph, wrong, target.prepare(wrong, None, "wrong"),
                                         specs)
    assert not bad.equivalent
    onnx.save(bf16_model(), tmp_path / "m.onnx")
    proc = run_cli(["optimize", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o.onnx"),
                    "--target", "torch-cpu", "--time-limit", "10"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    written = onnx.load(tmp_path / "o.onnx")
    assert written.graph.input[0].type.tensor_type.elem_type == TensorProto.BFLOAT16
