"""Forms other exporters write (Paddle2ONNX's -1 and '?' dimensions, inputs that pick a
branch) and what graphsub does with them: import, run, never a traceback, nothing written
where the user did not ask."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from typer.testing import CliRunner

import graphsub
from graphsub.cli import app
from graphsub.errors import GraphsubError
from graphsub.onnx_io import to_onnx_bytes
from graphsub.onnx_io.sizes import symbolic_inference
from graphsub.runtime import graph_input_specs, random_feeds
from graphsub.verdicts import compare_models
from graphsub.verdicts.equivalence import SAME_FUNCTION
from graphsub.runtime.inputs import GivenInput, given_values
from tests.markers import requires_ort_extensions
from tests.onnx_io.helpers import init, make_model, vi

runner = CliRunner()


def conv_model(dims) -> onnx.ModelProto:
    """Conv -> HardSigmoid -> Mul over an input declared with `dims` (-1 as dim_value)."""
    x = vi("x", [1, 3, 8, 8])
    for d, value in zip(x.type.tensor_type.shape.dim, dims):
        d.Clear()
        if isinstance(value, int):
            d.dim_value = value
        else:
            d.dim_param = value
    w = np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("HardSigmoid", ["c"], ["h"]),
             helper.make_node("Mul", ["c", "h"], ["y"])]
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    return make_model(nodes, [x], [out], [init("w", w)])


@pytest.mark.parametrize("dims", [[-1, 3, 8, 8], [-1, 3, "?", "?"]])
def test_minus_one_and_question_mark_dimensions_import_and_optimize(dims, tmp_path):
    model = conv_model(dims)
    graph = graphsub.load(model)
    symbols = sorted(graph.facts.symbols)
    assert len(symbols) == dims.count(-1) + dims.count("?")
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(model, src)
    r = runner.invoke(app, ["optimize", str(src), "-o", str(out), "--cost", "analytic",
                            "--time-limit", "5"])
    assert r.exit_code == 0, r.output
    written = graphsub.load(out.read_bytes())
    binding = {s: 6 for s in symbols}
    assert compare_models(model.SerializeToString(), out.read_bytes(),
                          graph_input_specs(written, binding), SAME_FUNCTION).equivalent


def test_onnxruntime_symbolic_inference_writes_nothing_into_the_current_folder(tmp_path,
                                                                                monkeypatch):
    """onnxruntime's own `infer_shapes` saves an incompletely inferred model into the folder
    it runs in; graphsub's use of it must not litter the user's folder."""
    monkeypatch.chdir(tmp_path)
    model = make_model([helper.make_node("NonZero", ["x"], ["nz"]),
                        helper.make_node("Transpose", ["nz"], ["y"])],
                       [vi("x", ["n", 4])], [helper.make_tensor_value_info(
                           "y", TensorProto.INT64, None)])
    inferred = symbolic_inference(model, merge=True)
    assert inferred.graph.node
    assert os.listdir(tmp_path) == []


def test_scalar_inputs_are_fed_as_arrays():
    feeds = random_feeds([("flag", graphsub.TensorType((), "bool")),
                          ("n", graphsub.TensorType((), "int64")),
                          ("x", graphsub.TensorType((), "float32"))], seed=1)
    assert all(isinstance(v, np.ndarray) and v.shape == () for v in feeds.values())


def branch_by_rate() -> onnx.ModelProto:
    """y = x * 2 if sr == 16000 else x / 0 (a branch random data would pick wrongly)."""
    then = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["t"])], "t", [],
                             [vi("t", [4])])
    other = helper.make_graph([helper.make_node("Div", ["x", "zero"], ["e"])], "e", [],
                              [vi("e", [4])])
    nodes = [helper.make_node("Equal", ["sr", "rate"], ["is16k"]),
             helper.make_node("If", ["is16k"], ["y"], then_branch=then, else_branch=other)]
    return make_model(nodes, [vi("x", [4]), vi("sr", [], TensorProto.INT64)], [vi("y", [4])],
                      [init("two", np.float32(2)), init("zero", np.float32(0)),
                       init("rate", np.int64(16000))])


def test_input_values_are_fed_as_given_everywhere_the_model_runs(tmp_path):
    graph = graphsub.load(branch_by_rate())
    graph = graph.with_facts(input_values=given_values(graph, {"sr": "16000"}))
    specs = dict(graph_input_specs(graph))
    assert isinstance(specs["sr"], GivenInput) and int(specs["sr"].value) == 16000
    for seed in range(3):
        assert int(random_feeds(list(specs.items()), seed)["sr"]) == 16000
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(branch_by_rate(), src)
    r = runner.invoke(app, ["optimize", str(src), "-o", str(out), "--cost", "analytic",
                            "--time-limit", "5", "--input-value", "sr=16000", "--json"])
    assert r.exit_code == 0, r.output
    assert out.exists()


@pytest.mark.parametrize("given, message", [
    ({"rate": "1"}, "not an input of the model"),
    ({"sr": "1,2"}, "expected 1 comma-separated number"),
    ({"sr": "fast"}, "expected 1 comma-separated number"),
])
def test_bad_input_values_are_clear_errors(given, message):
    graph = graphsub.load(branch_by_rate())
    with pytest.raises(GraphsubError, match=message):
        given_values(graph, given)


def custom_op_model(declared: bool) -> onnx.ModelProto:
    """A matrix inverse from onnxruntime-extensions' domain between two matmuls, its output
    type declared in value_info (or not)."""
    eye = np.eye(4, dtype=np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["a"]),
             helper.make_node("MatMul", ["x", "w2"], ["a2"]),
             helper.make_node("Inverse", ["a"], ["inv"], domain="ai.onnx.contrib"),
             helper.make_node("Add", ["inv", "a2"], ["y"])]
    graph = helper.make_graph(nodes, "custom", [vi("x", [4, 4])], [vi("y", [4, 4])],
                              initializer=[init("w", eye * 2 + 0.1), init("w2", eye)],
                              value_info=[vi("inv", [4, 4])] if declared else [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("ai.onnx.contrib", 1)])
    model.ir_version = 8
    return model


def test_an_unknown_op_is_typed_by_its_declared_shapes_and_kept_opaque():
    graph = graphsub.load(custom_op_model(declared=True))
    (opaque,) = [n for n in graph.nodes.values() if n.op == "opaque"]
    assert opaque.attrs["op_type"] == "ai.onnx.contrib.Inverse"
    assert str(opaque.outputs[0]) == "float32[4x4]"
    exported = graphsub.to_onnx(graph)
    assert {(o.domain, o.version) for o in exported.opset_import} >= {("ai.onnx.contrib", 1)}


def test_an_unknown_op_without_declared_shapes_is_refused_by_name_with_what_to_do(tmp_path):
    with pytest.raises(GraphsubError, match=r"ai\.onnx\.contrib\.Inverse.*value_info.*--custom-ops"):
        graphsub.load(custom_op_model(declared=False))
    src = tmp_path / "m.onnx"
    onnx.save(custom_op_model(declared=True), src)
    r = runner.invoke(app, ["optimize", str(src), "-o", str(tmp_path / "o.onnx"),
                            "--time-limit", "5"])
    assert r.exit_code != 0 and "Traceback" not in r.output
    assert "--custom-ops" in r.output and not (tmp_path / "o.onnx").exists()


def test_a_custom_op_library_that_does_not_load_is_a_clear_error(tmp_path):
    bogus = tmp_path / "lib.so"
    bogus.write_bytes(b"not a library")
    r = runner.invoke(app, ["optimize", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o.onnx"),
                            "--custom-ops", str(bogus)])
    assert r.exit_code != 0 and "cannot load it as a custom-op library" in r.output


@requires_ort_extensions
def test_a_model_with_custom_ops_is_optimized_with_their_library(tmp_path):
    import onnxruntime_extensions

    from graphsub.runtime.ort_sessions import forget_custom_ops

    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(custom_op_model(declared=True), src)
    try:
        r = runner.invoke(app, ["optimize", str(src), "-o", str(out), "--time-limit", "5",
                                "--custom-ops", onnxruntime_extensions.get_library_path()])
        assert r.exit_code == 0, r.output
        written = graphsub.load(out.read_bytes())
        assert compare_models(src.read_bytes(), out.read_bytes(), graph_input_specs(written),
                              SAME_FUNCTION).equivalent
    finally:
        forget_custom_ops()


def test_an_uneven_split_over_a_size_is_typed_for_odd_sizes_too():
    """onnxruntime types the halves of Split(num_outputs=2) over `s` as `s/2`, which is no
    size when s is odd; graphsub types them by running the node instead (found by the
    fuzzer)."""
    nodes = [helper.make_node("Split", ["x"], ["a", "b"], axis=0, num_outputs=2),
             helper.make_node("Relu", ["a"], ["y"]), helper.make_node("Relu", ["b"], ["z"])]
    model = make_model(nodes, [vi("x", ["s", 3])], [vi("y", [None, 3]), vi("z", [None, 3])],
                       opset=18)
    graph = graphsub.load(model)
    for s in (6, 7):
        shapes = [graph.type_of(v).bound({"s": s}).shape for v in graph.outputs]
        assert shapes == [((s + 1) // 2, 3), (s // 2, 3)]
        assert compare_models(model.SerializeToString(), graphsub.to_onnx(graph),
                              graph_input_specs(graph, {"s": s}), SAME_FUNCTION).equivalent


def test_a_slice_that_would_be_empty_below_a_size_raises_the_sizes_range():
    """x[7:] of a dimension `s` is `s - 7` from s = 8 on and empty below: the model is taken
    as defined from 8 on rather than refused (found by the fuzzer)."""
    nodes = [helper.make_node("Slice", ["x", "start", "end", "axis"], ["t"]),
             helper.make_node("Tile", ["t", "reps"], ["y"])]
    model = make_model(nodes, [vi("x", ["s", 2])], [vi("y", [None, 2])],
                       [init("start", np.array([7])), init("end", np.array([2**62])),
                        init("axis", np.array([0])), init("reps", np.array([1, 1]))])
    graph = graphsub.load(model)
    assert graph.facts.symbols["s"].low == 8
    assert compare_models(model.SerializeToString(), graphsub.to_onnx(graph),
                          graph_input_specs(graph, {"s": 11}), SAME_FUNCTION).equivalent


@pytest.mark.parametrize("scale_shape", [[1], [1, 1, 1, 1], []])
def test_a_scale_of_one_element_is_a_scalar_multiplication_folded_into_the_convolution(
        scale_shape):
    """Paddle2ONNX writes a learnable scale after a convolution as Mul by a weight of shape
    [1] (PP-OCRv4's recognizer: 28 of them). Any one-element weight whose rank the other
    operand's does not fall short of is imported as a scalar multiplication, so that the
    rule scaling the convolution's weights instead matches (onnxsim folds them; onnxruntime
    does not, and the recognizer ran 7% slower than onnxsim's)."""
    from graphsub.optimizer import optimize

    rng = np.random.default_rng(0)
    model = make_model(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("Mul", ["scale", "c"], ["m"]),
         helper.make_node("Add", ["m", "shift"], ["y"])],
        [vi("x", [1, 3, 8, 8])], [vi("y", [1, 4, 8, 8])],
        [init("w", rng.standard_normal((4, 3, 3, 3)).astype(np.float32)),
         init("b", rng.standard_normal(4).astype(np.float32)),
         init("scale", np.full(scale_shape, 1.7, np.float32)),
         init("shift", np.full([1], 0.3, np.float32))])
    graph = graphsub.load(model)
    assert [n.op for n in graph.nodes.values() if n.op in ("mul", "smul")] == ["smul"]
    result = optimize(graph, time_limit=5, cost="analytic")
    assert "conv-bias-smul" in [s.rule for s in result.trace]
    out = to_onnx_bytes(result.graph)
    assert "Mul" not in [n.op_type for n in onnx.load_from_string(out).graph.node]
    specs = graph_input_specs(graph)
    assert compare_models(model.SerializeToString(), out, specs, SAME_FUNCTION).equivalent


def test_a_one_element_weight_that_broadcasts_the_other_operand_up_stays_a_mul():
    """x of shape [4] times a weight of shape [1, 1, 1]: the product has the weight's rank,
    not x's, so it is not a scalar multiplication of x."""
    model = make_model([helper.make_node("Mul", ["x", "s"], ["y"])], [vi("x", [4])],
                       [vi("y", [1, 1, 4])], [init("s", np.full([1, 1, 1], 2.0, np.float32))])
    assert [n.op for n in graphsub.load(model).nodes.values() if n.op in ("mul", "smul")] \
        == ["mul"]
