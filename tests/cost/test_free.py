"""What costs nothing, one notion: sources and weight-only nodes everywhere, and the views a
target runs without a kernel (`Target.free_views`) where kernels are priced; an alias run as a
kernel costs its launch alone."""

from __future__ import annotations

import numpy as np
import pytest

from graphsub.targets import get_target
from graphsub.cost import AnalyticCostModel, MeasuredCostModel, make_cost_model
from graphsub.cost.base import costs_nothing, runs_as_view
from graphsub.errors import GraphsubError
from graphsub.ir import GraphBuilder
from graphsub.ops import all_ops, get_op, view_ops
from tests.markers import requires_torch

TORCH_VIEWS = frozenset({"alias", "strided"})


def views_graph():
    """An input read by an alias (reshape), a strided view (transpose) and a kernel (relu)."""
    b = GraphBuilder(seed=0)
    x = b.input("x", (64, 96))
    b.output(b.reshape(x, shape=(96, 64)), "r")
    b.output(b.transpose(x, perm=(1, 0)), "t")
    b.output(b.relu(x), "y")
    return b.build()


def node(graph, op):
    return graph.nodes_by_op(op)[0]


def test_sources_and_weight_only_nodes_cost_nothing_on_every_target():
    for free_views in (frozenset(), TORCH_VIEWS):
        assert costs_nothing("input", False, free_views)
        assert costs_nothing("weight", False, free_views)
        assert costs_nothing("matmul", True, free_views)
        assert not costs_nothing("matmul", False, free_views)


def test_views_cost_nothing_where_the_target_runs_their_kind_without_a_kernel():
    for op, opdef in all_ops().items():
        assert runs_as_view(op, TORCH_VIEWS) == (opdef.view != "")
        assert runs_as_view(op, frozenset({"alias"})) == (opdef.view == "alias")
        assert not costs_nothing(op, False) or op in ("input", "weight")
    assert view_ops("alias") >= {"reshape", "flatten", "squeeze", "unsqueeze", "identity"}
    assert view_ops("strided") >= {"transpose", "split", "slice"}


def test_the_analytic_model_charges_an_alias_its_launch_and_a_strided_view_as_a_copy():
    g = views_graph()
    model = AnalyticCostModel("a100")  # onnxruntime's views: every one a kernel
    p = model.profile
    reshape, transpose = node(g, "reshape"), node(g, "transpose")
    assert model.node_cost(g, reshape) == pytest.approx(p.launch_overhead)
    moved = get_op("transpose").bytes(g[transpose].attrs, g.input_types(transpose),
                                      g[transpose].outputs)
    assert moved == 2 * 64 * 96 * 4
    assert model.node_cost(g, transpose) == pytest.approx(moved / p.bandwidth
                                                         + p.launch_overhead)


def test_the_analytic_model_prices_a_targets_free_views_at_nothing():
    g = views_graph()
    free = AnalyticCostModel("a100", TORCH_VIEWS)
    kernels = AnalyticCostModel("a100")
    assert free.node_cost(g, node(g, "reshape")) == 0.0
    assert free.node_cost(g, node(g, "transpose")) == 0.0
    relu = node(g, "relu")
    assert free.node_cost(g, relu) == kernels.node_cost(g, relu) > 0
    alias_only = AnalyticCostModel("a100", frozenset({"alias"}))
    assert alias_only.node_cost(g, node(g, "reshape")) == 0.0
    assert alias_only.node_cost(g, node(g, "transpose")) == kernels.node_cost(
        g, node(g, "transpose"))


def test_free_views_name_kinds_of_view():
    with pytest.raises(GraphsubError, match="free_views takes kinds of view .*not split"):
        AnalyticCostModel("a100", frozenset({"split", "strided"}))


@pytest.mark.parametrize("target, free_views", [
    ("ort-cpu", frozenset()), pytest.param("torch-cpu", TORCH_VIEWS, marks=requires_torch)])
def test_a_target_declares_its_free_views_once_and_the_cost_models_follow(target, free_views):
    t = get_target(target)
    assert t.free_views == free_views
    analytic = make_cost_model("analytic", t)
    assert isinstance(analytic, AnalyticCostModel) and analytic.free_views == free_views
    measured = MeasuredCostModel(t, cache=False)
    strided = "strided" in free_views  # operators read strided inputs: strides travel
    assert (measured.layouts is not None) == strided
    assert measured.layout_ops == view_ops(*free_views)
    g = views_graph()
    reshape = node(g, "reshape")
    assert measured._fallback.node_cost(g, reshape) == analytic.node_cost(g, reshape)
    assert analytic.node_cost(g, reshape) == (
        0.0 if free_views else pytest.approx(analytic.profile.launch_overhead))


def test_a_weight_only_view_costs_nothing_wherever_it_is_priced():
    b = GraphBuilder(seed=0)
    x = b.input("x", (4, 6))
    w = b.transpose(b.weight(np.arange(24, dtype=np.float32).reshape(6, 4)), perm=(1, 0))
    b.output(b.add(x, w), "y")
    g = b.build()
    assert AnalyticCostModel("a100").node_cost(g, node(g, "transpose")) == 0.0
