"""Running the original before the search: the sizes and input values it runs at are found
where graphsub's made-up inputs fail, and a model that runs at none of them fails at once
with what to give."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import graphsub
from graphsub.errors import GraphsubError
from graphsub.runtime.inputs import given_values
from graphsub.runtime.probe import compared_values, leading_symbols, size_trials
from tests.onnx_io.helpers import init, make_model, vi


def rate_model(comparison: str = "Equal") -> onnx.ModelProto:
    """y = x * 2 where sr (cast to int32) compares true with 16000; the other branch gathers
    past the end of x and fails, as a detector's branch for another sample rate fails at a
    length it was not made for."""
    then = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["t"])], "t", [],
                             [vi("t", [4])])
    other = helper.make_graph([helper.make_node("Gather", ["x", "past"], ["e"])], "e", [],
                              [vi("e", [4])])
    nodes = [helper.make_node("Cast", ["sr"], ["sr32"], to=TensorProto.INT32),
             helper.make_node(comparison, ["sr32", "rate"], ["picked"]),
             helper.make_node("If", ["picked"], ["y"], then_branch=then, else_branch=other)]
    return make_model(nodes, [vi("x", [4]), vi("sr", [], TensorProto.INT64)], [vi("y", [4])],
                      [init("two", np.float32(2)), init("past", np.array([0, 1, 2, 7], np.int64)),
                       init("rate", np.int32(16000))])


def height_model() -> onnx.ModelProto:
    """An image batch (n, 3, h, w) plus a bias of height 48: it runs where h is 48 (or 1),
    as a text recognizer runs at its line height only."""
    rng = np.random.default_rng(0)
    bias = rng.standard_normal((1, 3, 48, 1)).astype(np.float32)
    nodes = [helper.make_node("Add", ["x", "bias"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"])]
    return make_model(nodes, [vi("x", ["n", 3, "h", "w"])], [vi("y", ["n", 3, "h", "w"])],
                      [init("bias", bias)])


def test_the_constants_an_integer_input_is_compared_with_are_its_candidate_values():
    assert [int(v) for v in compared_values(rate_model())["sr"]] == [16000]
    assert [int(v) for v in compared_values(rate_model("Less"))["sr"]] == [16000, 15999, 16001]
    assert all(v.dtype == np.int64 and v.shape == () for v in compared_values(rate_model())["sr"])
    assert compared_values(height_model()) == {}


def test_size_trials_put_the_batch_at_one_and_stay_in_each_range():
    graph = graphsub.load(height_model())
    assert leading_symbols(graph) == {"n"}
    symbols = graph.facts.symbols
    trials = size_trials(graph, {"n": 128, "h": 128, "w": 128}, symbols)
    assert trials[0] == {"n": 128, "h": 128, "w": 128}
    assert trials[1] == {"n": 1, "h": 128, "w": 128}
    assert {"n": 1, "h": 48, "w": 128} in trials
    assert len(trials) == len({tuple(sorted(t.items())) for t in trials})


def test_a_branch_picked_by_an_input_value_is_found_and_the_model_optimized():
    model = rate_model()
    graph = graphsub.load(model)
    _, report = graphsub.optimize_model(graph, model.SerializeToString(), cost="analytic",
                                        time_limit=5)
    assert any("it runs at sr=16000" in note for note in report.notes), report.notes
    assert report.verification is None or report.verification.get("ok", True)


def test_sizes_the_original_runs_at_are_found_before_the_search():
    model = height_model()
    graph = graphsub.load(model)
    _, report = graphsub.optimize_model(graph, model.SerializeToString(), cost="analytic",
                                        time_limit=5)
    note = next(n for n in report.notes if "fails on graphsub's default inputs" in n)
    assert "h=48" in note and "n=1" in note
    assert report.shapes["profile"] == ["h=48,n=1,w=128"]
    assert report.shapes["profile_source"] == "where the original runs"


def test_a_model_that_runs_at_no_size_tried_fails_at_once_with_what_to_give():
    model = height_model()
    with pytest.raises(GraphsubError, match=r"--input-shape x=1x3x30x8 .* or --shape-profile"):
        graphsub.optimize_model(graphsub.load(model), model.SerializeToString(),
                                cost="analytic", time_limit=5, shape_profile=["n=1,h=30,w=8"])
    rate = computed_rate_model()
    with pytest.raises(GraphsubError, match="--input-value sr=VALUE"):
        graphsub.optimize_model(graphsub.load(rate), rate.SerializeToString(),
                                cost="analytic", time_limit=5)


def computed_rate_model() -> onnx.ModelProto:
    """The rate model with its constant computed (16000 + 0): no comparison with a constant
    tells which value of sr picks the branch that runs."""
    model = rate_model()
    model.graph.node.insert(0, helper.make_node("Add", ["rate0", "zero"], ["rate"]))
    kept = [i for i in model.graph.initializer if i.name != "rate"]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept + [init("rate0", np.int32(16000)),
                                           init("zero", np.int32(0))])
    return model


def squeeze_when_one_model() -> onnx.ModelProto:
    """x (n, 4) times 3 in a branch picked by a mode input; in that branch, where n is 1, x
    squeezed and unsqueezed, else passed on, as exporters write a squeeze of a batch of one
    (a voice-activity detector's branches hold such squeezes). onnxruntime types the bodies
    from the declared sizes, so with n declared 2 the squeeze fails to type and the model
    does not build, while it runs at n = 2 when n is declared open."""
    untyped = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "tey"]
    squeeze = helper.make_graph([helper.make_node("Squeeze", ["x", "zero"], ["s"]),
                                 helper.make_node("Unsqueeze", ["s", "zero"], ["t"])], "t",
                                [], [untyped[0]])
    keep = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "e", [],
                             [untyped[1]])
    scaled = helper.make_graph(
        [helper.make_node("Shape", ["x"], ["shape"]),
         helper.make_node("Gather", ["shape", "zero_scalar"], ["n"]),
         helper.make_node("Equal", ["n", "one"], ["single"]),
         helper.make_node("If", ["single"], ["picked"], then_branch=squeeze, else_branch=keep),
         helper.make_node("Mul", ["picked", "w"], ["y"])], "y", [], [untyped[2]])
    plain = helper.make_graph([helper.make_node("Identity", ["x"], ["p"])], "p", [],
                              [helper.make_tensor_value_info("p", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("Equal", ["mode", "one"], ["scale"]),
             helper.make_node("If", ["scale"], ["out"], then_branch=scaled, else_branch=plain)]
    return make_model(nodes, [vi("x", ["n", 4]), vi("mode", [], TensorProto.INT64)],
                      [vi("out", ["n", 4])],
                      [init("zero", np.array([0], np.int64)), init("zero_scalar", np.int64(0)),
                       init("one", np.int64(1)), init("w", np.float32(3))])


def test_control_flow_onnxruntime_cannot_type_at_fixed_sizes_is_written_as_declared():
    import onnxruntime as ort

    model = squeeze_when_one_model()
    fixed = onnx.ModelProto.FromString(model.SerializeToString())
    fixed.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 2
    with pytest.raises(Exception, match="inferenc"):
        ort.InferenceSession(fixed.SerializeToString(), providers=["CPUExecutionProvider"])
    graph = graphsub.load(model, {"x": (2, 4)})
    graph = graph.with_facts(input_values=given_values(graph, {"mode": "1"}))
    data, report = graphsub.optimize_model(graph, model.SerializeToString(), cost="analytic",
                                           time_limit=5)
    assert any("declares its inputs as the original did" in n for n in report.notes)
    written = onnx.load_from_string(data)
    assert [d.dim_param or d.dim_value for d in
            written.graph.input[0].type.tensor_type.shape.dim] == ["n", 4]
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {"x": x, "mode": np.array(1, np.int64)})
    np.testing.assert_allclose(out, 3 * x, rtol=1e-6)


def bias_model(height: int, bias: np.ndarray) -> onnx.ModelProto:
    """relu(x + bias) over (n, 3, h, w), the bias of shape (1, 3, height, 1)."""
    nodes = [helper.make_node("Add", ["x", "bias"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"])]
    return make_model(nodes, [vi("x", ["n", 3, "h", "w"])], [vi("y", ["n", 3, "h", "w"])],
                      [init("bias", np.broadcast_to(bias, (1, 3, height, 1)).copy())])


def test_verification_passes_over_sizes_the_original_does_not_run_at():
    from graphsub.pipeline.verify_stage import check_equivalence
    from graphsub.runtime.inputs import graph_input_specs

    bias = np.random.default_rng(0).standard_normal((1, 3, 1, 1)).astype(np.float32)
    tall, any_height = bias_model(48, bias), bias_model(1, bias)
    graph = graphsub.load(tall)
    bindings = [{"n": 1, "h": 48, "w": 8}, {"n": 1, "h": 64, "w": 8}, {"n": 2, "h": 1, "w": 5}]
    specs = [graph_input_specs(graph, b) for b in bindings]
    data = tall.SerializeToString()
    comparison, compared = check_equivalence(data, data, specs, 1)
    assert comparison.equivalent and compared == [0, 2]  # not defined at h = 64
    # the other way round, the optimized model fails at h = 64 where the original runs
    comparison, compared = check_equivalence(any_height.SerializeToString(), data, specs, 1)
    assert not comparison.equivalent and compared == [0, 1]
    assert "fails where the original runs" in comparison.problems[0]
