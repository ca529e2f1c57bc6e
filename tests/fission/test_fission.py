"""Operator fission: every rule's two sides agree, categories come from the operators, and
fission followed by orchestration over library kernels gives back what the models were built
with."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from graphsub import zoo
from graphsub.cost import AnalyticCostModel
from graphsub.errors import OpAttributeError
from graphsub.fission import Category, category, fission, fission_rules, kernel_rules
from graphsub.fission.primitives import primitive_rules
from graphsub.fission.stage import fission_and_orchestrate
from graphsub.ir.builder import GraphBuilder
from graphsub.ops import all_ops
from graphsub.rules import check_rule
from graphsub.runtime.reference import evaluate
from tests.markers import requires_torch

ALL_RULES = [*fission_rules(), *kernel_rules(), *primitive_rules()]


@pytest.mark.parametrize("rule", ALL_RULES, ids=lambda r: r.name)
def test_rule_sides_agree_on_random_inputs(rule):
    result = check_rule(rule, examples=3, seed=7)
    assert result.examples >= 1 and result.max_rel < 1e-4


def test_an_operators_category_is_part_of_its_definition():
    assert category("softmax") is Category.COARSE and category("matmul") is Category.LINEAR
    assert category("guarded_softmax") is Category.OPAQUE  # no primitive tests for NaN
    with pytest.raises(OpAttributeError, match="unknown graphsub operator 'no_such_op'"):
        category("no_such_op")


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
    """With a cost model that prices a fused operator below its primitives and the kernel
    library of the operators the model was built with, the orchestration of the primitive
    graph chooses every library kernel, and the result is the model as built (a scalar
    multiplication is a multiplication in the primitives' normal form)."""
    graph = zoo.build(name)
    built_with = {n.op for n in graph.nodes.values()}
    cost = AnalyticCostModel()
    outcome = fission_and_orchestrate(
        graph, cost, lambda g: {n.op for n in g.nodes.values()} <= built_with)
    assert outcome.orchestration.status == "optimal"

    def ops(g):
        return Counter("mul" if n.op == "smul" else n.op for n in g.nodes.values())

    assert ops(outcome.graph) == ops(graph)
    _assert_same_outputs(graph, outcome.graph)


@pytest.mark.parametrize("name", ["bert:layers=2", "vit:layers=2", "softmax_subgraph"])
def test_attention_is_recognized_in_its_primitives(name):
    """Where every fused operator is one kernel (torch), the scores, softmax and product
    with the values become one attention kernel, and the transposes that cancel go away."""
    graph = zoo.build(name)
    outcome = fission_and_orchestrate(graph, AnalyticCostModel())
    ops = Counter(n.op for n in outcome.graph.nodes.values())
    assert ops["attention"] == Counter(n.op for n in graph.nodes.values())["softmax"]
    assert ops["softmax"] == 0
    # k arrives transposed (k^T); attention reads k: one transpose back where k^T is an
    # input, none where the graph transposed k itself (the pair cancels).
    inputs_transposed = 1 if name == "softmax_subgraph" else 0
    assert ops["transpose"] == (Counter(n.op for n in graph.nodes.values())["transpose"]
                                + inputs_transposed)
    _assert_same_outputs(graph, outcome.graph)


@requires_torch
def test_orchestrated_attention_runs_in_torch_on_transposed_keys():
    """The attention kernel reads keys that are a transposed view of the graph's k^T input:
    torch's CPU flash kernel needs its operands' last axis contiguous, the lowering sees to it."""
    from graphsub.targets.torch import TorchProgram

    graph = zoo.build("softmax_subgraph:heads=2,seq=16,head_dim=8")
    outcome = fission_and_orchestrate(graph, AnalyticCostModel())
    assert "attention" in {n.op for n in outcome.graph.nodes.values()}
    feeds = _feeds(graph)
    want = evaluate(graph, feeds)
    got = TorchProgram(outcome.graph, "cpu").run(feeds)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5)
