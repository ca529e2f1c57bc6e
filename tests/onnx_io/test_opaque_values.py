"""Every ONNX value type in, nothing lost (issue 51): sequences, optionals, maps and tensors
of strings are carried through import, search and export as opaque values (only onnxruntime
computes with them), their operators typed by ONNX's inference; the tensor parts around them
are optimized as usual; a model whose inputs or outputs are such values is written back with
them as they were declared."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from typer.testing import CliRunner

import graphsub
from graphsub.cli import app
from graphsub.errors import GraphsubError
from graphsub.onnx_io import to_onnx_bytes
from graphsub.runtime import evaluate, graph_input_specs, random_feeds
from tests.markers import requires_torch
from tests.onnx_io.helpers import init, make_model, vi

runner = CliRunner()
SEQ = helper.make_sequence_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, [3, 4]))


def sequence_model() -> onnx.ModelProto:
    """A sequence input whose first element goes through two products sharing their input
    (which graphsub merges) and whose concatenation is a second output."""
    w1, w2 = (np.random.default_rng(k).standard_normal((4, 4)).astype(np.float32) * 0.5
              for k in (1, 2))
    nodes = [helper.make_node("SequenceAt", ["xs", "zero"], ["x0"]),
             helper.make_node("MatMul", ["x0", "w1"], ["a"]),
             helper.make_node("MatMul", ["x0", "w2"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["y"]),
             helper.make_node("ConcatFromSequence", ["xs"], ["all"], axis=0)]
    graph = helper.make_graph(nodes, "seq", [helper.make_value_info("xs", SEQ)],
                              [vi("y", [3, 4]), helper.make_tensor_value_info(
                                  "all", TensorProto.FLOAT, None)],
                              initializer=[init("w1", w1), init("w2", w2),
                                           init("zero", np.int64(0))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def string_model() -> onnx.ModelProto:
    """Words in, words out (a concatenation with constant words), and a number made from
    them (whether each word is one of the constants) scaling two products that share their
    input (which graphsub merges)."""
    nodes = [helper.make_node("Concat", ["words", "more"], ["all_words"], axis=0),
             helper.make_node("Equal", ["words", "key"], ["hit"]),
             helper.make_node("Cast", ["hit"], ["hitf"], to=TensorProto.FLOAT),
             helper.make_node("MatMul", ["x", "w1"], ["a"]),
             helper.make_node("MatMul", ["x", "w2"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["r2"]),
             helper.make_node("Mul", ["r2", "hitf"], ["y"])]
    w1, w2 = (np.random.default_rng(k).standard_normal((3, 3)).astype(np.float32)
              for k in (3, 4))
    more = helper.make_tensor("more", TensorProto.STRING, [2], [b"tensor", b"graph"])
    key = helper.make_tensor("key", TensorProto.STRING, [3], [b"a", b"b", b"c"])
    graph = helper.make_graph(
        nodes, "words",
        [helper.make_tensor_value_info("words", TensorProto.STRING, [3]), vi("x", [2, 3])],
        [helper.make_tensor_value_info("all_words", TensorProto.STRING, [5]), vi("y", [2, 3])],
        initializer=[more, key, init("w1", w1), init("w2", w2)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


def optional_model() -> onnx.ModelProto:
    """An optional made from a tensor, tested and read back."""
    nodes = [helper.make_node("Optional", ["x"], ["o"]),
             helper.make_node("OptionalHasElement", ["o"], ["has"]),
             helper.make_node("OptionalGetElement", ["o"], ["x2"]),
             helper.make_node("Relu", ["x2"], ["y"])]
    graph = helper.make_graph(nodes, "opt", [vi("x", [2, 3])],
                              [vi("y", [2, 3]), helper.make_tensor_value_info(
                                  "has", TensorProto.BOOL, [])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def feeds_of(model: onnx.ModelProto) -> dict:
    rng = np.random.default_rng(0)
    names = [i.name for i in model.graph.input]
    out = {}
    for name in names:
        if name == "xs":
            out[name] = [rng.standard_normal((3, 4)).astype(np.float32) for _ in range(3)]
        elif name == "words":
            out[name] = np.array(["b", "zz", "a"], dtype=object)
        else:
            shape = [d.dim_value for d in next(i for i in model.graph.input if i.name == name)
                     .type.tensor_type.shape.dim]
            out[name] = rng.standard_normal(shape).astype(np.float32)
    return out


def run(model: bytes | onnx.ModelProto, feeds: dict) -> list:
    data = model if isinstance(model, bytes) else model.SerializeToString()
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)


def assert_same(got: list, want: list) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        if isinstance(w, list):
            assert len(g) == len(w)
            for a, b in zip(g, w):
                np.testing.assert_allclose(a, b, rtol=1e-5)
        elif np.asarray(w).dtype == object:
            assert list(np.asarray(g)) == list(np.asarray(w))
        else:
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("make", [sequence_model, string_model, optional_model])
def test_opaque_values_are_imported_evaluated_and_written_back(make):
    model = make()
    graph = graphsub.load(model)
    opaque = [str(t) for n in graph.nodes.values() for t in n.outputs if t.is_opaque]
    assert opaque, "the model's sequences, strings or optionals are opaque values"
    feeds = feeds_of(model)
    want = run(model, feeds)
    exported = to_onnx_bytes(graph)
    onnx.checker.check_model(onnx.load_from_string(exported), full_check=True)
    assert_same(run(exported, feeds), want)
    got = evaluate(graph, feeds)  # graphsub's reference evaluator: onnxruntime runs the rest
    assert_same([got[o.name] for o in model.graph.output], want)


def test_made_up_inputs_of_every_type_run_the_model():
    for make in (sequence_model, string_model):
        graph = graphsub.load(make())
        feeds = random_feeds(graph_input_specs(graph), seed=3)
        evaluate(graph, feeds)


@pytest.mark.parametrize("make", [sequence_model, string_model])
def test_the_tensor_part_around_opaque_values_is_optimized(make, tmp_path):
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(make(), src)
    r = runner.invoke(app, ["optimize", str(src), "-o", str(out), "--target", "ort-cpu",
                            "--cost", "analytic", "--time-limit", "5", "--json"])
    assert r.exit_code == 0, r.output
    model = make()
    feeds = feeds_of(model)
    assert_same(run(out.read_bytes(), feeds), run(model, feeds))
    found = graphsub.optimize(graphsub.load(model), cost="analytic", time_limit=3)
    assert found.trace, "the products or the relus around the opaque values were rewritten"


@requires_torch
def test_a_torch_target_refuses_opaque_values_by_name():
    from graphsub.targets import get_target

    reason = get_target("torch-cpu").cannot_run(graphsub.load(sequence_model()))
    assert reason is not None and "sequence" in reason


def test_an_opaque_input_takes_no_shape():
    with pytest.raises(GraphsubError, match="xs.*no shape"):
        graphsub.load(sequence_model(), input_shapes={"xs": (3, 4)})
