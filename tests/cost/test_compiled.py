"""The compiled cost model: a graph priced as inductor runs it (library kernels as they are,
the rest fused into the groups inductor builds, each group priced as one compiled kernel)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from graphsub import zoo
from graphsub.targets import get_target
from graphsub.cost import AnalyticCostModel, CompiledCostModel, make_cost_model
from graphsub.cost.compiled import compiled_kernels, fused_signature, is_generated
from graphsub.errors import GraphsubError
from graphsub.fission.candidates import is_convex
from graphsub.ir import GraphBuilder
from graphsub.ops import get_op
from tests.markers import requires_torch


def residual_block(extra_op: bool = False):
    """x -> (x * x + x) -> relu -> matmul -> + x -> tanh: two groups around a product, the
    residual sum after it. With `extra_op`, one more elementwise operator in the first group."""
    b = GraphBuilder(seed=0)
    x = b.input("x", (128, 256))
    w = b.weight(np.random.default_rng(0).standard_normal((256, 256)).astype("float32"))
    h = b.add(b.mul(x, x), x)
    if extra_op:
        h = b.neg(b.neg(h))
    y = b.matmul(b.relu(h), w)
    b.output(b.tanh(b.add(y, x)), "y")
    return b.build()


def test_library_kernels_split_what_inductor_generates_into_convex_groups():
    g = residual_block()
    kernels = compiled_kernels(g)
    assert [g[n].op for n in kernels.library] == ["matmul"]
    ops = sorted(sorted(g[n].op for n in group) for group in kernels.groups)
    # The residual sum reads x, as the first group does, but after the product: a group of
    # its own, or the kernel would wait for a product that waits for it.
    assert ops == [["add", "mul", "relu"], ["add", "tanh"]]


@pytest.mark.parametrize("name", ["llama", "bert", "vit", "resnet50", "nasnet_a", "segformer"])
def test_every_generated_node_is_in_exactly_one_convex_group(name):
    g = zoo.build(name)
    kernels = compiled_kernels(g)
    weight_only = g.weight_only()
    members = [n for group in kernels.groups for n in group]
    assert len(members) == len(set(members))
    computing = {n for n in g.nodes if n not in weight_only
                 and g[n].op not in ("input", "weight", "sizes")}
    assert set(members) | set(kernels.library) == computing
    assert all(is_generated(g[n].op) for n in members)
    assert not any(is_generated(g[n].op) for n in kernels.library)
    assert all(is_convex(g, group) for group in kernels.groups)


def test_attention_and_products_are_library_kernels_and_normalizations_are_generated():
    assert not is_generated("attention") and not is_generated("matmul")
    assert not is_generated("conv2d")
    for op in ("softmax", "layer_norm", "rms_norm", "gelu", "guarded_softmax", "transpose",
               "reduce_mean", "add"):
        assert is_generated(op), op


def test_an_operator_inside_a_fused_group_costs_its_work_not_a_kernel():
    """Priced operator by operator, two more negations cost two kernels (launches and two
    passes over memory); compiled, they are arithmetic inside a kernel that reads and writes
    the same tensors: the difference is what the operator-by-operator search overvalues."""
    analytic = AnalyticCostModel()
    compiled = CompiledCostModel(AnalyticCostModel())
    plain, extra = residual_block(), residual_block(extra_op=True)
    by_op = analytic.graph_cost(extra) - analytic.graph_cost(plain)
    by_kernel = compiled.graph_cost(extra) - compiled.graph_cost(plain)
    assert by_op > 0
    assert 0 <= by_kernel < 0.1 * by_op


def products(count: int):
    """relu of the sum of `count` products of x with constant matrices."""
    b = GraphBuilder(seed=0)
    x = b.input("x", (128, 256))
    terms = [b.matmul(x, b.weight(np.full((256, 256), 1.0 / (k + 2), dtype="float32")))
             for k in range(count)]
    total = terms[0]
    for term in terms[1:]:
        total = b.add(total, term)
    b.output(b.relu(total), "y")
    return b.build()


def test_a_library_kernel_removed_is_priced_in_full():
    """Two products summed, or one with the matrices summed: the compiled model saves a whole
    product, the elementwise sum it also removes being almost free."""
    compiled, analytic = CompiledCostModel(AnalyticCostModel()), AnalyticCostModel()
    one = products(1)
    product = analytic.node_cost(one, one.nodes_by_op("matmul")[0])
    assert compiled.graph_cost(products(2)) - compiled.graph_cost(one) >= product


def test_node_costs_stay_the_inner_models_and_shares_sum_to_the_graph():
    g = residual_block()
    inner = AnalyticCostModel()
    compiled = CompiledCostModel(inner)
    for nid in g.nodes:
        assert compiled.node_cost(g, nid) == inner.node_cost(g, nid)
    total, shares = compiled.priced(g)
    assert total == pytest.approx(sum(shares.values()))
    assert not compiled.sum_of_nodes  # a rewrite is priced on the graph it builds


def test_a_group_of_views_alone_costs_nothing():
    b = GraphBuilder(seed=0)
    x = b.input("x", (64, 96))
    w = b.weight(np.ones((64, 8), dtype="float32"))
    b.output(b.matmul(b.transpose(x, perm=(1, 0)), w), "y")
    g = b.build()
    compiled = CompiledCostModel(AnalyticCostModel())
    assert compiled.graph_cost(g) == pytest.approx(
        AnalyticCostModel().node_cost(g, g.nodes_by_op("matmul")[0]))


def test_the_fused_signature_is_one_operator_over_what_the_group_reads():
    g = residual_block()
    group = next(grp for grp in compiled_kernels(g).groups if len(grp) == 3)
    sig = fused_signature(g, group)
    assert sig.op == "fused"
    assert [t.shape for t in sig.inputs] == [(128, 256)]
    assert [t.shape for t in sig.outputs] == [(128, 256)]
    assert [op for op, _, _ in sig.attrs["body"][0]] == ["mul", "add", "relu"]
    # The fused operator computes what the group does.
    x = np.random.default_rng(1).standard_normal((128, 256)).astype("float32")
    (out,) = get_op("fused").evaluate(sig.attrs, [x])
    np.testing.assert_allclose(out, np.maximum(x * x + x, 0), rtol=1e-6)


def test_the_model_travels_to_worker_processes_and_keeps_its_clock_in_the_inner_one():
    compiled = CompiledCostModel(AnalyticCostModel())
    compiled.deadline = 12.5
    assert compiled.inner.deadline == 12.5
    copy = pickle.loads(pickle.dumps(compiled))
    g = residual_block()
    assert copy.graph_cost(g) == pytest.approx(compiled.graph_cost(g))
    with pytest.raises(GraphsubError, match="operator cost model"):
        CompiledCostModel(compiled)


def test_compiled_needs_a_torch_target():
    with pytest.raises(GraphsubError, match="torch target"):
        make_cost_model("compiled", get_target("ort-cpu"))
    with pytest.raises(GraphsubError, match="torch target"):
        make_cost_model("compiled")


@requires_torch
def test_on_torch_each_group_is_compiled_and_timed_once_then_cached():
    target = get_target("torch-cpu")
    compiled = make_cost_model("compiled", target)
    assert isinstance(compiled, CompiledCostModel)
    cost = compiled.graph_cost(residual_block())
    assert cost > 0
    timed = compiled.inner.measured
    assert not compiled.inner.untimed  # the fused groups compiled and ran
    # The same structure in a new graph object: every kernel is found by its signature.
    assert compiled.graph_cost(residual_block()) == cost
    assert compiled.inner.measured == timed
    fresh = make_cost_model("compiled", target)  # a new run reads the persistent cache
    assert fresh.graph_cost(residual_block()) == pytest.approx(cost)
    assert fresh.inner.measured == 0


class CountingModel(AnalyticCostModel):
    """An inner model that 'measures' (nothing is known before it is priced) at twice the
    roofline, and counts what it priced."""

    parallel_safe = False

    def __init__(self) -> None:
        super().__init__()
        self.priced_signatures: list[str] = []

    def known_cost(self, sig):
        return self._memo.get(sig)

    def op_cost(self, sig):
        self.priced_signatures.append(sig.op)
        return 2 * super().op_cost(sig)


def test_groups_met_after_the_compile_share_are_estimated_from_the_compiled_ones():
    import time

    compiled = CompiledCostModel(CountingModel(), estimate=AnalyticCostModel())
    first = compiled.graph_cost(residual_block())  # no deadline: every group compiled
    assert compiled.inner.priced_signatures.count("fused") == 2
    assert compiled.scale() == pytest.approx(2.0)
    compiled.deadline = time.perf_counter() - 1  # the compile share is over
    assert compiled.compile_until is not None and compiled.compile_until < time.perf_counter()
    extra = residual_block(extra_op=True)  # its first group is new
    cost = compiled.graph_cost(extra)
    assert compiled.inner.priced_signatures.count("fused") == 2  # not compiled
    assert compiled.estimated == 1
    # The new group is priced at its roofline scaled as the compiled ones were.
    group = next(g for g in compiled_kernels(extra).groups if len(g) == 5)
    assert cost - first == pytest.approx(
        2.0 * (AnalyticCostModel().signature_cost(fused_signature(extra, group))
               - AnalyticCostModel().signature_cost(fused_signature(
                   residual_block(), next(g for g in compiled_kernels(residual_block()).groups
                                          if len(g) == 3)))))
    assert any("not compiled in the time given" in note for note in compiled.notes())
    # What was compiled is still known after the share: the original graph prices as before.
    assert compiled.graph_cost(residual_block()) == pytest.approx(first)


@requires_torch
def test_a_group_reading_a_transposed_view_is_timed_reading_one():
    """A transpose read by a product and, after it, by a sum: the view is a group of its
    own (free), and the group after the product reads it strided, so it is priced with those
    strides (graphsub's program makes the view contiguous first: a copy the graph costs)."""
    b = GraphBuilder(seed=0)
    x = b.input("x", (64, 48))
    t = b.transpose(x, perm=(1, 0))
    y = b.matmul(t, b.weight(np.ones((64, 64), dtype="float32")))
    b.output(b.tanh(b.add(y, t)), "y")
    g = b.build()
    target = get_target("torch-cpu")
    kernels = compiled_kernels(g)
    assert sorted(sorted(g[n].op for n in grp) for grp in kernels.groups) == \
        [["add", "tanh"], ["transpose"]]
    group = next(grp for grp in kernels.groups if len(grp) == 2)
    sig = fused_signature(g, group, strides=target.strides_of)
    assert sig.layouts is not None and (1, 48) in sig.layouts
    assert fused_signature(g, group).layouts is None
    cost = make_cost_model("compiled", target)
    assert cost.graph_cost(g) > 0 and not cost.inner.untimed
