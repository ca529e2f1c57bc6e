"""rotary_embedding (ONNX RotaryEmbedding, opset 23): numpy semantics against onnxruntime's
kernel and the torch lowering (`check_op`), ONNX export at opset 23 and as primitives below it,
import of a model that uses it, shape errors, counts, and the numerical rule check's roles."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from graphsub.errors import GraphsubError, ShapeError
from graphsub.ir.builder import GraphBuilder
from graphsub.onnx_io import load, to_onnx
from graphsub.ops import get_op
from graphsub.rules import RuleCheckError, check_rule, parse_rules
from graphsub.runtime import evaluate, run
from tests.ops.helpers import check_op


@st.composite
def cases(draw):
    """Inputs and attributes of one rotary embedding: 3-D or 4-D, whole or partial rotation,
    halves or interleaved pairs, caches per token or gathered by position."""
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 31 - 1)))
    batch, heads, seq = draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(1, 4))
    head = 2 * draw(st.integers(1, 4))
    rotary = 2 * draw(st.integers(1, head // 2))
    flat = draw(st.booleans())
    x = rng.standard_normal((batch, seq, heads * head) if flat else (batch, heads, seq, head))
    attrs = {"interleaved": draw(st.booleans()), "num_heads": heads if flat else 0,
             "rotary_embedding_dim": 0 if rotary == head and draw(st.booleans()) else rotary}
    if draw(st.booleans()):
        # onnxruntime's kernel (1.32) refuses caches of fewer positions than tokens, which
        # ONNX allows and no exporter writes.
        positions = draw(st.integers(seq, 6))
        cache_shape: tuple[int, ...] = (positions, rotary // 2)
        extra = [rng.integers(0, positions, (batch, seq)).astype(np.int64)]
    else:
        cache_shape, extra = (batch, seq, rotary // 2), []
    angles = rng.uniform(-np.pi, np.pi, cache_shape)
    inputs = [x.astype(np.float32), np.cos(angles).astype(np.float32),
              np.sin(angles).astype(np.float32), *extra]
    return inputs, attrs


@given(case=cases(), opset=st.sampled_from([13, 17, 21, 23]))
def test_rotary_embedding_against_onnxruntime_and_torch(case, opset):
    inputs, attrs = case
    check_op("rotary_embedding", inputs, attrs, opset=opset)


def one_node_graph(inputs, attrs, weights=()):
    b = GraphBuilder()
    values = [b.weight(a) if i in weights else b.input(f"x{i}", a.shape, str(a.dtype))
              for i, a in enumerate(inputs)]
    b.output(b.op("rotary_embedding", *values, **attrs), "y")
    return b.build()


def example(interleaved=False, rotary=0, positions=True):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 5, 8)).astype(np.float32)
    half = (rotary or 8) // 2
    angles = rng.uniform(-np.pi, np.pi, (7, half) if positions else (2, 5, half))
    inputs = [x, np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)]
    if positions:
        inputs.append(rng.integers(0, 7, (2, 5)).astype(np.int64))
    return inputs, {"interleaved": interleaved, "rotary_embedding_dim": rotary}


def test_a_pair_is_rotated_by_its_tokens_angle():
    """The definition on one pair: (a, b) turned by theta is (a cos - b sin, a sin + b cos)."""
    theta = 0.7
    x = np.array([[[[3.0, 5.0]]]], np.float32)  # one batch, head, token; a head of one pair
    c, s = np.full((1, 1, 1), np.cos(theta), np.float32), np.full((1, 1, 1), np.sin(theta),
                                                                   np.float32)
    (y,) = evaluate(one_node_graph([x, c, s], {}), {"x0": x, "x1": c, "x2": s}).values()
    np.testing.assert_allclose(y.reshape(2), [3 * np.cos(theta) - 5 * np.sin(theta),
                                              3 * np.sin(theta) + 5 * np.cos(theta)], rtol=1e-6)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rotary", [0, 4])
def test_export_at_opset_23_is_one_node_and_below_it_primitives(interleaved, rotary):
    inputs, attrs = example(interleaved, rotary)
    graph = one_node_graph(inputs, attrs)
    feeds = {f"x{i}": a for i, a in enumerate(inputs)}
    ref = evaluate(graph, feeds)["y"]
    for opset in (17, 22, 23):
        model = to_onnx(graph, opset=opset)
        ops = {n.op_type for n in model.graph.node}
        assert (ops == {"RotaryEmbedding"}) == (opset >= 23), (opset, ops)
        np.testing.assert_allclose(run(model, feeds)["y"], ref, rtol=1e-5, atol=1e-6)


def rope_model(x_shape, cache_shape, **attrs) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """An opset-23 model as an exporter writes it: caches as initializers, position ids and
    the states as inputs."""
    rng = np.random.default_rng(5)
    angles = rng.uniform(-np.pi, np.pi, cache_shape)
    inits = [numpy_helper.from_array(np.cos(angles).astype(np.float32), "cos"),
             numpy_helper.from_array(np.sin(angles).astype(np.float32), "sin")]
    batch, seq = x_shape[0], x_shape[1] if len(x_shape) == 3 else x_shape[2]
    node = helper.make_node("RotaryEmbedding", ["x", "cos", "sin", "pos"], ["y"], **attrs)
    graph = helper.make_graph(
        [node], "rope",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape),
         helper.make_tensor_value_info("pos", TensorProto.INT64, (batch, seq))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, x_shape)], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    feeds = {"x": rng.standard_normal(x_shape).astype(np.float32),
             "pos": rng.integers(0, cache_shape[0], (batch, seq)).astype(np.int64)}
    return model, feeds


@pytest.mark.parametrize("x_shape, attrs", [
    ((1, 4, 6, 16), {}),
    ((2, 5, 3 * 8), {"num_heads": 3, "rotary_embedding_dim": 4, "interleaved": 1}),
])
def test_a_model_that_uses_it_imports_as_the_operator(x_shape, attrs):
    head = x_shape[-1] if len(x_shape) == 4 else x_shape[-1] // attrs["num_heads"]
    rotary = attrs.get("rotary_embedding_dim") or head
    model, feeds = rope_model(x_shape, (32, rotary // 2), **attrs)
    graph = load(model)
    assert [graph[n].op for n in graph.topo_order() if graph[n].op not in ("input", "weight")] \
        == ["rotary_embedding"]
    expected = run(model, feeds)["y"]
    np.testing.assert_allclose(evaluate(graph, feeds)["y"], expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(run(to_onnx(graph), feeds)["y"], expected, rtol=1e-5, atol=1e-6)


def test_the_whole_head_and_its_size_are_the_same_rotation():
    inputs, _ = example(positions=False)
    whole = one_node_graph(inputs, {"rotary_embedding_dim": 0, "num_heads": 3})
    sized = one_node_graph(inputs, {"rotary_embedding_dim": 8})
    assert whole.structural_hash() == sized.structural_hash()


@pytest.mark.parametrize("attrs, shapes, message", [
    ({}, [(2, 5, 24), (2, 5, 4), (2, 5, 4)], "a 3-D input needs num_heads"),
    ({"rotary_embedding_dim": 3}, [(2, 3, 5, 8), (2, 5, 1), (2, 5, 1)], "must be even"),
    ({}, [(2, 3, 5, 8), (2, 4, 4), (2, 4, 4)], "without position_ids the caches are"),
    ({}, [(2, 3, 5, 8), (9, 3), (9, 3), (2, 5)], "with position_ids the caches are"),
])
def test_inputs_that_do_not_fit_are_shape_errors(attrs, shapes, message):
    b = GraphBuilder()
    ins = [b.input(f"x{i}", s, "int64" if i == 3 else "float32") for i, s in enumerate(shapes)]
    with pytest.raises(ShapeError, match=message):
        b.op("rotary_embedding", *ins, **attrs)


def test_a_position_outside_the_caches_is_an_error():
    inputs, attrs = example()
    inputs[3][0, 0] = 7  # the caches hold positions 0..6
    graph = one_node_graph(inputs, attrs)
    with pytest.raises(GraphsubError, match="outside the caches' 7 positions"):
        evaluate(graph, {f"x{i}": a for i, a in enumerate(inputs)})


def test_counts_are_of_the_rotated_pairs_and_the_gathered_cache_rows():
    inputs, attrs = example(rotary=4)
    graph = one_node_graph(inputs, attrs)
    (nid,) = graph.nodes_by_op("rotary_embedding")
    op, ins, outs = get_op("rotary_embedding"), graph.input_types(nid), graph[nid].outputs
    rotated = inputs[0].size // 8 * 4
    assert op.flops(graph[nid].attrs, ins, outs) == 3 * rotated  # 4 products, 2 sums a pair
    rows = 2 * 2 * 5 * 2 * 4  # cos and sin, one row of rotary / 2 floats per token
    assert op.bytes(graph[nid].attrs, ins, outs) == 2 * inputs[0].nbytes + rows + inputs[3].nbytes


def test_the_rule_check_draws_rotary_embeddings_from_the_operators_roles():
    (linear,) = parse_rules("""rule rotation-is-linear:
        (smul (rotary_embedding ?x ?c ?s :interleaved ?i) ?k)
        => (rotary_embedding (smul ?x ?k) ?c ?s :interleaved ?i)""")
    assert check_rule(linear).examples >= 1
    (forgets,) = parse_rules("""rule forgets-how-pairs-are-made:
        (smul (rotary_embedding ?x ?c ?s :interleaved ?i) ?k)
        => (rotary_embedding (smul ?x ?k) ?c ?s)""")
    with pytest.raises(RuleCheckError, match="is wrong"):  # the check tried interleaved pairs
        check_rule(forgets)
    (wrong,) = parse_rules("""rule pairs-do-not-matter:
        (rotary_embedding ?x ?c ?s :interleaved true) => (rotary_embedding ?x ?c ?s)""")
    with pytest.raises(RuleCheckError, match="is wrong"):
        check_rule(wrong)


def test_a_rotated_axis_over_a_size_symbol_stays_in_onnxruntime():
    # The rotation splits the head in halves of a fixed size: with a symbolic head size the
    # node is a shape error for the operator, and the model imports it opaque, equal to the
    # original at every size (found by the fuzzer: a TypeError from comparing the symbol).
    from graphsub.tensors.symbolic import size_symbol

    b = GraphBuilder()
    s = size_symbol("s")
    ins = [b.input("x", (2, 3, 5, s)), b.input("c", (2, 5, 4)), b.input("d", (2, 5, 4))]
    with pytest.raises(ShapeError, match="rotated axis must have a fixed size"):
        b.op("rotary_embedding", *ins)
    model, _ = rope_model((1, 4, 6, 16), (32, 8))
    x = model.graph.input[0].type.tensor_type.shape.dim
    x[3].ClearField("dim_value")
    x[3].dim_param = "s"
    model.graph.output[0].type.tensor_type.shape.dim[3].dim_param = "s"
    graph = load(model)
    assert [graph[n].op for n in graph.topo_order()
            if graph[n].op not in ("input", "weight")] == ["opaque"]
    rng = np.random.default_rng(3)
    feeds = {"x": rng.standard_normal((1, 4, 6, 16)).astype(np.float32),
             "pos": rng.integers(0, 32, (1, 6)).astype(np.int64)}
    np.testing.assert_allclose(evaluate(graph, feeds)["y"], run(model, feeds)["y"], rtol=1e-6)
