"""Operator fission: every rule's two sides agree, every operator has a category, and fission
followed by orchestration over library kernels gives back what the models were built with."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from graphsub import zoo
from graphsub.cost import AnalyticCostModel
from graphsub.fission import Category, category, fission, fission_rules, kernel_rules
from graphsub.fission.candidates import library_kernels, primitive_kernels
from graphsub.fission.orchestrate import assemble, orchestrate
from graphsub.fission.primitives import primitive_rules
from graphsub.ir.builder import GraphBuilder
from graphsub.ops import all_ops
from graphsub.rules import check_rule
from graphsub.runtime.reference import evaluate

ALL_RULES = [*fission_rules(), *kernel_rules(), *primitive_rules()]


@pytest.mark.parametrize("rule", ALL_RULES, ids=lambda r: r.name)
def test_rule_sides_agree_on_random_inputs(rule):
    result = check_rule(rule, examples=3, seed=7)
    assert result.examples >= 1 and result.max_rel < 1e-4


def test_every_operator_has_a_category():
    assert {op: category(op) for op in all_ops()}  # raises for an operator left out
    assert category("softmax") is Category.COARSE and category("matmul") is Category.LINEAR


def test_every_coarse_operator_has_a_fission_rule():
    split = {r.sources[0].op for r in fission_rules()
             if category(r.sources[0].op) is Category.COARSE}
    assert split == {op for op in all_ops() if category(op) is Category.COARSE}


def _feeds(graph, seed=0):
    rng = np.random.default_rng(seed)
    return {graph[i].attrs["name"]: rng.standard_normal(graph[i].attrs["shape"]).astype(np.float32)
            for i in graph.inputs}


def _assert_same_outputs(a, b, atol=1e-4):
    feeds = _feeds(a)
    ra, rb = evaluate(a, feeds), evaluate(b, feeds)
    for name in ra:
        np.testing.assert_allclose(rb[name], ra[name], rtol=1e-4, atol=atol)


@pytest.mark.parametrize("name", ["bert", "vit"])
def test_fission_splits_every_coarse_operator_and_keeps_the_values(name):
    graph = zoo.build(name)
    coarse = Counter(n.op for n in graph.nodes.values() if category(n.op) is Category.COARSE)
    assert coarse["softmax"] and coarse["layer_norm"] and coarse["gelu"]
    primitive = fission(graph)
    assert not [n.op for n in primitive.nodes.values() if category(n.op) is Category.COARSE]
    _assert_same_outputs(graph, primitive)


def test_fission_leaves_weight_only_operators_alone():
    b = GraphBuilder(seed=1)
    x = b.input("x", (4, 8))
    rng = np.random.default_rng(0)
    w = b.op("softmax", b.weight(rng.standard_normal((8, 8))))  # folded at export: no kernel
    b.output(b.op("softmax", b.op("matmul", x, w)))
    graph = b.build()
    ops = Counter(n.op for n in fission(graph).nodes.values())
    assert ops["softmax"] == 1 and ops["reduce_max"] == 1


@pytest.mark.parametrize("name", ["bert", "vit"])
def test_orchestration_of_library_kernels_gives_back_the_fused_model(name):
    """With a cost model that prices a fused operator below its primitives, the orchestration
    of the primitive graph chooses every library kernel, and the result is the model as built."""
    graph = zoo.build(name)
    primitive = fission(graph)
    cost = AnalyticCostModel()
    kernels = primitive_kernels(primitive, cost) + library_kernels(primitive, kernel_rules(), cost)
    plan = orchestrate(primitive, kernels)
    assert plan.status == "optimal"
    rebuilt = assemble(primitive, plan)
    assert rebuilt.structural_hash() == graph.structural_hash()
    assert plan.cost == pytest.approx(cost.graph_cost(graph))
    _assert_same_outputs(graph, rebuilt)
