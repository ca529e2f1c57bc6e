"""The dynamo exporter's NaN guard after attention's softmax, Where(IsNaN(p), 0, p): imported
as one guarded_softmax operator (so no softmax rule can drop it), written back as the
exporter wrote it, and dropped by softmax-guard-unneeded only where a constant mask leaves
every row a score; with a fully masked row, or a mask the model computes, the guard stays."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphsub
from graphsub.onnx_io import to_onnx_bytes
from graphsub.rules import apply_match, builtin_rules, find_matches
from graphsub.runtime import evaluate, run

RULE = {r.name: r for r in builtin_rules(check=False)}["softmax-guard-unneeded"]
S = 6


def guarded_scores(mask: np.ndarray | None) -> bytes:
    """q k^T (+ mask: a constant, or None for a mask input), Softmax, the guard, times v."""
    f = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info(n, f, [1, 2, S, 4]) for n in ("q", "kt_src", "v")]
    inits = [numpy_helper.from_array(np.zeros((), np.float32), "zero")]
    if mask is None:
        inputs.append(helper.make_tensor_value_info("mask", f, [1, 1, S, S]))
    else:
        inits.append(numpy_helper.from_array(mask.astype(np.float32), "mask"))
    nodes = [
        helper.make_node("Transpose", ["kt_src"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["scores"]),
        helper.make_node("Add", ["scores", "mask"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["p"], axis=-1),
        helper.make_node("IsNaN", ["p"], ["nan"]),
        helper.make_node("Where", ["nan", "zero", "p"], ["guarded"]),
        helper.make_node("MatMul", ["guarded", "v"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "attention", inputs,
                              [helper.make_tensor_value_info("y", f, [1, 2, S, 4])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString()


def causal(s: int) -> np.ndarray:
    return np.where(np.tril(np.ones((s, s), bool)), 0.0, -np.inf)[None, None]


def feeds(graph, seed=0):
    rng = np.random.default_rng(seed)
    return {graph[i].attrs["name"]: (rng.standard_normal(graph[i].attrs["shape"]) * 2)
            .astype(np.float32) for i in graph.inputs}


def ops(graph) -> list[str]:
    return sorted(n.op for n in graph.nodes.values() if n.op not in ("input", "weight"))


def test_the_guard_is_imported_as_one_operator_and_exported_as_it_was():
    model = guarded_scores(causal(S))
    graph = graphsub.load(model)
    assert ops(graph) == ["add", "guarded_softmax", "matmul", "matmul", "transpose"]
    back = onnx.load_from_string(to_onnx_bytes(graph))
    assert [n.op_type for n in back.graph.node].count("IsNaN") == 1
    x = feeds(graph)
    np.testing.assert_allclose(run(to_onnx_bytes(graph), x)["y"], run(model, x)["y"],
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mask, drops", [
    (causal(S), True),                       # every query sees itself
    (np.zeros((1, 1, S, S)), True),          # no mask at all
    # Hugging Face's lowest value in a whole row counts as masked: scores below it overflow
    # to -inf, and the row's softmax is NaN.
    (np.full((1, 1, S, S), -3.4e38), False),
    (np.vstack([causal(S)[0, 0, :-1], np.full((1, S), -np.inf)])[None, None], False),
    (None, False),                           # a mask the model reads: rows may be masked
], ids=["causal", "zeros", "lowest", "a-fully-masked-row", "mask-input"])
def test_the_rule_drops_the_guard_only_where_no_row_is_fully_masked(mask, drops):
    graph = graphsub.load(guarded_scores(mask))
    matches = find_matches(graph, RULE)
    assert bool(matches) is drops
    if drops:
        after = apply_match(graph, matches[0])
        assert "guarded_softmax" not in ops(after) and "softmax" in ops(after)
        for seed in range(3):
            x = feeds(graph, seed)
            np.testing.assert_allclose(evaluate(after, x)["y"], evaluate(graph, x)["y"],
                                       rtol=1e-5, atol=1e-6)


def test_the_fully_masked_row_gives_zeros_with_the_guard():
    mask = np.vstack([causal(S)[0, 0, :-1], np.full((1, S), -np.inf)])[None, None]
    graph = graphsub.load(guarded_scores(mask))
    y = evaluate(graph, feeds(graph))["y"]
    assert np.all(y[..., -1, :] == 0) and np.isfinite(y).all()


def test_the_search_drops_the_guard_of_an_export_with_a_constant_mask():
    graph = graphsub.load(guarded_scores(causal(S)))
    result = graphsub.optimize(graph, builtin_rules(), algorithm="greedy", time_limit=10,
                               cost="analytic")
    assert result.rules_used().get("softmax-guard-unneeded") == 1
