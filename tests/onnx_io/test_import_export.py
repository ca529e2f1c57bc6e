"""ONNX import and export: mappings, folding, opaque ops, names, opsets and bad input."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import helper

import graphsub
from graphsub.errors import CycleError, ExportError, ModelLoadError
from graphsub.ir import GraphBuilder
from graphsub.runtime import evaluate, graph_input_specs, random_feeds, run
from graphsub.verdicts import compare_models
from graphsub.verdicts.equivalence import Tolerance
from tests.onnx_io.helpers import init, make_model, vi


def assert_round_trip(model, input_shapes=None, rtol=1e-4):
    """Load then save: same outputs in onnxruntime; the reference evaluator agrees too."""
    g = graphsub.load(model, input_shapes)
    exported = graphsub.to_onnx(g)
    specs = graph_input_specs(g)
    result = compare_models(model.SerializeToString(), exported, specs, Tolerance(rtol=rtol))
    assert result.equivalent, [d.describe() for d in result.outputs] + list(result.problems)
    feeds = random_feeds(specs, seed=5)
    ref = evaluate(g, feeds)
    ort = run(exported, feeds)
    for name in ref:
        np.testing.assert_allclose(ref[name], ort[name], rtol=1e-3, atol=1e-4)
    return g, exported


def test_gemm_with_transposes_alpha_beta_imports_to_matmul():
    rng = np.random.default_rng(0)
    model = make_model(
        [helper.make_node("Gemm", ["x", "w", "c"], ["y"], transA=1, transB=1, alpha=0.5, beta=2.0)],
        [vi("x", [4, 3])], [vi("y", [3, 5])],
        [init("w", rng.standard_normal((5, 4)).astype(np.float32)),
         init("c", rng.standard_normal((5,)).astype(np.float32))])
    g, exported = assert_round_trip(model)
    ops = {g[n].op for n in g.topo_order()}
    assert "matmul" in ops and "opaque" not in ops
    # the transpose of the weight is weight-only, so it is folded at export
    assert "Transpose" in {n.op_type for n in exported.graph.node}  # transA of the input stays
    assert sum(n.op_type == "Transpose" for n in exported.graph.node) == 1


def test_torch_style_dynamic_reshape_is_folded_to_a_concrete_shape():
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape, as torch.onnx exports flatten."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "axes0"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    model = make_model(nodes, [vi("x", ["batch", 3, 4])], [vi("y", ["batch", 12])],
                       [init("zero", np.array(0, np.int64)), init("axes0", np.array([0], np.int64)),
                        init("minus1", np.array([-1], np.int64))])
    g, _ = assert_round_trip(model, {"x": (2, 3, 4)})
    assert [g[n].op for n in g.topo_order()] == ["input", "reshape"]
    assert g.type_of(g.outputs[0]).shape == (2, 12)


def test_input_shapes_fix_symbolic_inputs_and_bad_ones_are_clear_errors():
    model = make_model([helper.make_node("Relu", ["pixels"], ["y"])],
                       [vi("pixels", ["N", 3, 224, 224])], [vi("y", ["N", 3, 224, 224])])
    g = graphsub.load(model, {"pixels": (1, 3, 224, 224)})
    assert g.type_of(g.outputs[0]).shape == (1, 3, 224, 224)
    with pytest.raises(ModelLoadError, match="unknown input.*'nope'"):
        graphsub.load(model, {"nope": (1,)})
    with pytest.raises(ModelLoadError, match="does not fit"):
        graphsub.load(model, {"pixels": (1, 4, 224, 224)})


def test_unknown_op_becomes_opaque_and_still_round_trips():
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Hardmax", ["r"], ["h"], axis=-1),
             helper.make_node("LRN", ["x4"], ["l"], size=3),
             helper.make_node("Add", ["h", "x"], ["y"])]
    model = make_model(nodes, [vi("x", [2, 5]), vi("x4", [1, 4, 3, 3])],
                       [vi("y", [2, 5]), vi("l", [1, 4, 3, 3])])
    g, exported = assert_round_trip(model)
    opaque = sorted(g[n].attrs["op_type"] for n in g.topo_order() if g[n].op == "opaque")
    assert opaque == ["Hardmax", "LRN"]
    assert {n.op_type for n in exported.graph.node} >= {"Hardmax", "LRN"}


def test_opaque_op_over_weights_is_folded_at_export():
    model = make_model([helper.make_node("Hardmax", ["w"], ["hw"]),
                        helper.make_node("Mul", ["x", "hw"], ["y"])],
                       [vi("x", [2, 3])], [vi("y", [2, 3])],
                       [init("w", np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32))])
    g, exported = assert_round_trip(model)
    assert [n.op_type for n in exported.graph.node] == ["Mul"]


def test_graph_with_a_cycle_is_a_clear_error():
    nodes = [helper.make_node("Add", ["x", "b"], ["a"], name="first"),
             helper.make_node("Relu", ["a"], ["b"], name="second")]
    model = make_model(nodes, [vi("x", [2])], [vi("b", [2])])
    with pytest.raises(CycleError, match="cycle: .*first.*second|cycle: .*second.*first"):
        graphsub.load(model)


def test_undefined_value_is_a_clear_error():
    model = make_model([helper.make_node("Relu", ["ghost"], ["y"])], [vi("x", [2])], [vi("y", [2])])
    with pytest.raises(ModelLoadError, match="'ghost'"):
        graphsub.load(model)


def test_truncated_and_non_onnx_files_are_clear_errors(tmp_path):
    b = GraphBuilder()
    x = b.input("x", (1, 3, 8, 8))
    b.output(b.conv2d(x, b.he_weight((4, 3, 3, 3))), "y")
    good = tmp_path / "good.onnx"
    graphsub.save(b.build(), good)
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(ModelLoadError, match="truncated.onnx.*not a valid ONNX model"):
        graphsub.load(truncated)
    text = tmp_path / "notes.onnx"
    text.write_text("this is not a model\n")
    with pytest.raises(ModelLoadError, match="not a valid ONNX model"):
        graphsub.load(text)
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    with pytest.raises(ModelLoadError, match="not a valid ONNX model"):
        graphsub.load(empty)
    with pytest.raises(ModelLoadError, match="no such file"):
        graphsub.load(tmp_path / "missing.onnx")


def test_names_and_order_of_inputs_and_outputs_are_kept():
    nodes = [helper.make_node("Add", ["b_in", "a_in"], ["z_out"]),
             helper.make_node("Sub", ["a_in", "b_in"], ["a_out"])]
    model = make_model(nodes, [vi("b_in", [3]), vi("a_in", [3])],
                       [vi("z_out", [3]), vi("a_in", [3]), vi("a_out", [3])])
    g, exported = assert_round_trip(model)
    assert [i.name for i in exported.graph.input] == ["b_in", "a_in"]
    assert [o.name for o in exported.graph.output] == ["z_out", "a_in", "a_out"]


def test_graph_output_that_is_an_input_or_a_weight_or_repeated():
    b = GraphBuilder()
    x = b.input("x", (3,))
    w = b.weight(np.arange(3, dtype=np.float32))
    r = b.relu(x)
    b.output(x, "same_as_input")
    b.output(w, "a_weight")
    b.output(r, "first")
    b.output(r, "second")
    b.output(b.exp(w), "folded")
    g = b.build()
    model = graphsub.to_onnx(g)
    assert [o.name for o in model.graph.output] == ["same_as_input", "a_weight", "first",
                                                    "second", "folded"]
    feeds = {"x": np.array([-1, 0, 2], np.float32)}
    out = run(model, feeds)
    np.testing.assert_array_equal(out["same_as_input"], feeds["x"])
    np.testing.assert_array_equal(out["a_weight"], [0, 1, 2])
    np.testing.assert_array_equal(out["second"], [0, 0, 2])
    np.testing.assert_allclose(out["folded"], np.exp([0, 1, 2]), rtol=1e-6)


@pytest.mark.parametrize("opset", [13, 15, 17, 18, 19, 20, 21, 22, 23])
def test_every_supported_opset_round_trips(opset):
    nodes = [helper.make_node("ReduceSum", ["x", "axes"], ["s"], keepdims=1),
             helper.make_node("Softmax", ["x"], ["p"], axis=-1),
             helper.make_node("Add", ["s", "p"], ["y"])]
    model = make_model(nodes, [vi("x", [2, 5])], [vi("y", [2, 5])],
                       [init("axes", np.array([-1], np.int64))], opset=opset)
    g, exported = assert_round_trip(model)
    assert exported.opset_import[0].version == opset
    assert {g[n].op for n in g.topo_order()} == {"input", "reduce_sum", "softmax", "add"}


def test_exported_models_use_only_the_standard_domain():
    from graphsub import zoo

    model = graphsub.to_onnx(zoo.build("light_squeezenet"))
    assert {n.domain for n in model.graph.node} <= {""}
    assert [o.domain for o in model.opset_import] == [""]


def test_save_is_atomic_and_failure_leaves_nothing_behind(tmp_path):
    b = GraphBuilder()
    x = b.input("x", (2,))
    b.output(b.relu(x), "y")
    g = b.build()
    target = tmp_path / "model.onnx"
    target.write_bytes(b"previous content")
    with pytest.raises(ExportError, match="opset 99"):
        graphsub.save(g, target, opset=99)
    assert target.read_bytes() == b"previous content"
    graphsub.save(g, target)
    onnx.checker.check_model(str(target), full_check=True)
    assert sorted(os.listdir(tmp_path)) == ["model.onnx"]
    with pytest.raises(ExportError, match="does not exist"):
        graphsub.save(g, tmp_path / "no" / "such" / "dir.onnx")


@pytest.mark.parametrize("axis", range(-3, 4))
def test_flatten_of_every_axis_imports_as_onnx_defines_it(axis):
    """A negative axis counts from the back over the rank: Flatten(axis=-1) on (2, 3, 4) is
    (6, 4). It was imported as axis % (rank + 1), (24, 1), which turned a following MatMul
    into a shape error (found by the differential fuzzer)."""
    rows = int(np.prod((2, 3, 4)[:axis + 3 if axis < 0 else axis]))
    cols = 24 // rows
    model = make_model([helper.make_node("Flatten", ["x"], ["f"], axis=axis),
                        helper.make_node("MatMul", ["f", "w"], ["y"])],
                       [vi("x", [2, 3, 4])], [vi("y", [rows, 5])],
                       [init("w", np.random.default_rng(0).standard_normal((cols, 5))
                             .astype(np.float32))])
    onnx.checker.check_model(model, full_check=True)
    g = graphsub.load(model)
    (flat,) = g.nodes_by_op("flatten")
    assert g[flat].type.shape == (rows, cols)
    assert_round_trip(model)


def test_an_opaque_nodes_output_type_is_what_onnxruntime_computes():
    """MaxPool with ceil_mode stays opaque; ONNX shape inference gives it 6 rows here, while
    onnxruntime drops the last window (it starts in the padding) and computes 5. A Slice with
    a negative start after it was then imported against the wrong length (fuzzer finding)."""
    model = make_model(
        [helper.make_node("MaxPool", ["x"], ["p"], ceil_mode=1, kernel_shape=[5, 2],
                          pads=[2, 1, 4, 0], strides=[2, 2]),
         helper.make_node("Slice", ["p", "s", "e", "a"], ["y"])],
        [vi("x", [1, 1, 8, 5])], [vi("y", None)],
        [init("s", np.array([-1], np.int64)), init("e", np.array([2**62], np.int64)),
         init("a", np.array([2], np.int64))])
    g = graphsub.load(model)
    (pool,) = g.nodes_by_op("opaque")
    assert g[pool].type.shape == (1, 1, 5, 3)
    assert_round_trip(model)


def test_save_writes_what_optimize_model_returns(tmp_path):
    """One API: the ONNX model `optimize_model` returns (bytes here) is saved like a graph."""
    from graphsub.optimizer import optimize_model

    b = GraphBuilder(seed=0)
    x = b.input("x", (4, 16))
    b.output(b.relu(b.matmul(b.relu(b.matmul(x, b.he_weight((16, 16)))),
                             b.he_weight((16, 16)))), "y")
    graph = b.build()
    data, report = optimize_model(graph, None, "m", time_limit=4, cost="analytic",
                                  target="ort-cpu", threads=1)
    path = graphsub.save(data, tmp_path / "out.onnx")
    assert path.read_bytes() == bytes(data) and sorted(os.listdir(tmp_path)) == ["out.onnx"]
    feeds = random_feeds(graph_input_specs(graph))
    np.testing.assert_allclose(run(str(path), feeds)["y"], evaluate(graph, feeds)["y"],
                               rtol=1e-4, atol=1e-5)
    with pytest.raises(ExportError, match="ONNX already"):
        graphsub.save(data, tmp_path / "again.onnx", opset=18)
    assert not (tmp_path / "again.onnx").exists()
