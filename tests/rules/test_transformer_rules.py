"""The rules for exported transformers: the attention scale folds into the projection weights,
linear layers (with biases) reading one input merge, and exported K^T chains (reshape,
transpose, reshape after the heads' transpose) collapse to one transpose; the unit-reshape
expression functions they use."""

from __future__ import annotations

import numpy as np
import pytest

import graphsub
from graphsub.cost import AnalyticCostModel
from graphsub.ir import GraphBuilder
from graphsub.rules import builtin_rules, find_matches
from graphsub.rules.expr import _unit_perm, _unit_reshape
from graphsub.runtime import evaluate, graph_input_specs, random_feeds

RULES = {r.name: r for r in builtin_rules(check=False)}
SEQ, HIDDEN, HEADS = 8, 16, 2


def exported_attention():
    """Attention as torch.onnx.export(dynamo=True) writes it: linear projections with biases,
    heads by reshape + transpose, sqrt(scale) multiplied into Q and K separately, K^T computed
    as reshape, transpose, reshape."""
    b = GraphBuilder(seed=0)
    x = b.input("x", (1, SEQ, HIDDEN))
    d = HIDDEN // HEADS

    def projection():
        y = b.add(b.matmul(x, b.he_weight((HIDDEN, HIDDEN))), b.uniform_weight((HIDDEN,)))
        return b.transpose(b.reshape(y, shape=(1, SEQ, HEADS, d)), perm=(0, 2, 1, 3))

    q, k, v = projection(), projection(), projection()
    scale = b.weight(np.array(d ** -0.25, np.float32))
    k_t = b.reshape(b.transpose(b.reshape(k, shape=(HEADS, SEQ, d)), perm=(0, 2, 1)),
                    shape=(1, HEADS, d, SEQ))
    logits = b.matmul(b.smul(q, scale), b.smul(k_t, scale))
    context = b.matmul(b.softmax(logits, axis=-1), v)
    b.output(b.reshape(b.transpose(context, perm=(0, 2, 1, 3)), shape=(1, SEQ, HIDDEN)), "y")
    return b.build()


def same_outputs(a, b):
    feeds = random_feeds(graph_input_specs(a), seed=2)
    ra, rb = evaluate(a, feeds), evaluate(b, feeds)
    for name in ra:
        np.testing.assert_allclose(rb[name], ra[name], rtol=1e-4, atol=1e-5)


def test_the_exported_attention_pattern_is_matched_by_each_rule():
    g = exported_attention()
    assert len(find_matches(g, RULES["fold-scale-into-projection"])) == 1  # Q; K after cleanup
    assert len(find_matches(g, RULES["merge-linears-shared-input"])) == 3  # QK, QV, KV
    assert len(find_matches(g, RULES["transpose-through-unit-reshape"])) == 1  # K^T


def test_search_folds_scales_and_collapses_the_k_transpose():
    """Without the merge rule, the search reaches the fully folded attention: both scales in
    the weights (K's after its transpose chain is cleaned up) and fewer layout ops."""
    g = exported_attention()
    rules = [r for r in builtin_rules(check=False) if r.name != "merge-linears-shared-input"]
    result = graphsub.optimize(g, cost=AnalyticCostModel("cpu"), time_limit=30, rules=rules,
                               rules_only=True)
    r = result.graph
    ops = [r[n].op for n in r.topo_order() if n not in r.weight_only()]
    assert "smul" not in ops, result.rules_used()
    assert ops.count("transpose") < 5 and ops.count("reshape") < 5
    same_outputs(g, r)


def test_search_with_all_rules_merges_projections_and_forms_one_attention():
    """With every rule, the scores, the softmax and the product with V become one attention
    operator carrying Q's scale (the normal form), and the search merges the projections
    around it."""
    g = exported_attention()
    result = graphsub.optimize(g, cost=AnalyticCostModel("cpu"), time_limit=30)
    used = result.rules_used()
    assert used["merge-linears-shared-input"] >= 1 and used["attention-unscaled-scores"] == 1
    ops = [result.graph[n].op for n in result.graph.topo_order()]
    assert ops.count("attention") == 1 and "softmax" not in ops and ops.count("smul") <= 1
    assert result.final_cost < 0.8 * result.initial_cost
    same_outputs(g, result.graph)


@pytest.mark.parametrize("a, b, p, q", [
    ((6, 128, 64), (1, 6, 128, 64), (0, 1, 3, 2), (0, 2, 1)),  # inserts a leading 1
    ((1, 6, 128, 64), (6, 128, 64), (0, 2, 1), (0, 1, 3, 2)),  # drops it
    ((2, 1, 3), (2, 3), (1, 0), (1, 2, 0)),
])
def test_unit_perm_moves_a_transpose_before_a_unit_reshape(a, b, p, q):
    assert _unit_reshape(a, b)
    assert _unit_perm(a, b, p) == q
    x = np.random.default_rng(0).standard_normal(a)
    left = np.transpose(x.reshape(b), p)
    right = np.transpose(x, q).reshape(tuple(b[i] for i in p))
    np.testing.assert_array_equal(left, right)


def test_unit_reshape_refuses_reshapes_that_regroup_data():
    assert not _unit_reshape((4, 6), (6, 4))
    assert not _unit_reshape((1, 24), (4, 6))
