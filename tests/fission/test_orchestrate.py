"""Korch's binary linear program: its choice equals brute force over every subset of the
candidate kernels on small primitive graphs, cycles between kernels are cut, and redundant
computation is chosen where it pays."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from graphsub.cost import AnalyticCostModel
from graphsub.fission.candidates import (Kernel, group_kernels, is_convex, kernel_graph,
                                         primitive_kernels)
from graphsub.fission import fission
from graphsub.fission.orchestrate import orchestrate
from graphsub.ir.builder import GraphBuilder
from graphsub.ir.graph import Value

UNARY = ["exp", "neg", "tanh", "sigmoid", "relu"]
BINARY = ["add", "mul", "sub"]


def _random_graph(seed: int, size: int):
    """A random DAG of `size` elementwise primitives over one input, one or two outputs; each
    primitive reads the one before it (so none is dead), binary ones also an earlier value."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder(seed=seed)
    values = [b.input("x", (4, 8))]
    for _ in range(size):
        if len(values) > 1 and rng.random() < 0.5:
            other = values[rng.integers(len(values) - 1)]
            values.append(b.op(BINARY[rng.integers(len(BINARY))], values[-1], other))
        else:
            values.append(b.op(UNARY[rng.integers(len(UNARY))], values[-1]))
    b.output(values[-1])
    if rng.random() < 0.5 and len(values) > 3:
        b.output(values[-2])
    return b.build()


def _group_size(kernel_graph_) -> int:
    """Primitives in a generated kernel (the body of its one fused node)."""
    (fused,) = [n for n in kernel_graph_.nodes.values() if n.op == "fused"]
    return len(fused.attrs["body"][0])


def _valid(graph, chosen: list[Kernel]) -> bool:
    """Whether the kernels can run in some order and compute every graph output."""
    ready = {Value(nid, 0) for nid, node in graph.nodes.items() if node.op in ("input", "weight")}
    pending = list(chosen)
    while pending:
        runnable = [k for k in pending if all(v in ready for v in k.inputs)]
        if not runnable:
            return False
        for k in runnable:
            ready.update(k.outputs)
            pending.remove(k)
    return all(v in ready for v in graph.outputs)


def _brute_force(graph, kernels: list[Kernel]) -> float:
    best = float("inf")
    for r in range(1, len(kernels) + 1):
        for subset in itertools.combinations(kernels, r):
            cost = sum(k.cost for k in subset)
            if cost < best and _valid(graph, list(subset)):
                best = cost
    return best


@pytest.mark.parametrize("seed", range(12))
def test_the_program_equals_brute_force(seed):
    graph = _random_graph(seed, size=4 + seed % 3)
    rng = np.random.default_rng(1000 + seed)
    prims = [dataclasses.replace(k, cost=float(rng.uniform(1, 10)))
             for k in primitive_kernels(graph, AnalyticCostModel())]
    groups = group_kernels(graph, 3, lambda g: float(rng.uniform(1, 12)))
    keep = rng.permutation(len(groups))[:16 - len(prims)]  # brute force stays under 2^16
    kernels = prims + [groups[i] for i in sorted(keep)]
    assert groups
    plan = orchestrate(graph, kernels)
    assert plan.status == "optimal"
    assert _valid(graph, plan.kernels)
    assert plan.cost == pytest.approx(_brute_force(graph, kernels))


def _cyclic_pair_graph():
    """e = exp(x), a = neg(x), b = a + e, d = sqrt(e), c = a * d; outputs b and c. The groups
    {a, c} and {e, b, d} are each convex, but together each waits for the other."""
    b = GraphBuilder(seed=0)
    x = b.input("x", (4, 8))
    e = b.op("exp", x)
    a = b.op("neg", x)
    out_b = b.op("add", a, e)
    d = b.op("sqrt", e)
    c = b.op("mul", a, d)
    b.output(out_b)
    b.output(c)
    graph = b.build()
    ids = {n.op: nid for nid, n in graph.nodes.items()}
    return graph, ids


def test_cycles_between_kernels_are_cut():
    graph, ids = _cyclic_pair_graph()
    first = frozenset((ids["neg"], ids["mul"]))
    second = frozenset((ids["exp"], ids["add"], ids["sqrt"]))
    assert is_convex(graph, first) and is_convex(graph, second)
    prims = [dataclasses.replace(k, cost=10.0) for k in primitive_kernels(graph, AnalyticCostModel())]
    groups = group_kernels(graph, 3, lambda g: 1.0 if _group_size(g) in (2, 3) else None)
    # The variants that write every value read outside them (each writes two).
    pair = [k for k in groups if k.nodes in (first, second) and len(k.outputs) == 2]
    assert len(pair) == 2
    kernels = prims + pair
    plan = orchestrate(graph, kernels)
    assert plan.cut_rounds >= 1, "the cheapest answer of the program alone is the cyclic pair"
    assert _valid(graph, plan.kernels)
    assert plan.cost == pytest.approx(_brute_force(graph, kernels))


def test_redundant_computation_is_chosen_where_it_pays():
    """e = exp(x) read by two consumers: two generated kernels that each recompute exp and
    write one tensor beat writing e once and reading it twice, when the costs say so (a
    kernel's cost grows with the tensors it writes)."""
    b = GraphBuilder(seed=0)
    x = b.input("x", (4, 8))
    e = b.op("exp", x)
    b.output(b.op("neg", e))
    b.output(b.op("tanh", e))
    graph = b.build()
    prims = [dataclasses.replace(k, cost=5.0) for k in primitive_kernels(graph, AnalyticCostModel())]
    groups = group_kernels(graph, 2, lambda g: 3.0 + 3.0 * len(g.outputs))
    plan = orchestrate(graph, prims + groups)
    assert plan.cost == pytest.approx(12.0)
    exp_node = next(nid for nid, n in graph.nodes.items() if n.op == "exp")
    assert sum(exp_node in k.nodes for k in plan.kernels) == 2


def test_kernel_graph_reads_boundary_values_as_inputs():
    graph, ids = _cyclic_pair_graph()
    nodes = frozenset((ids["sqrt"], ids["mul"]))
    sub = kernel_graph(graph, nodes, [v for v in graph.outputs if v.node == ids["mul"]])
    assert sorted(n.op for n in sub.nodes.values()) == ["input", "input", "mul", "sqrt"]


def test_generated_kernels_are_assembled_into_fused_operators():
    """The chosen generated kernels become `fused` nodes that compute what their primitives
    computed: in numpy, and in onnxruntime, where they are written out as the primitives."""
    from graphsub.fission.orchestrate import assemble
    from graphsub.onnx_io import to_onnx
    from graphsub.runtime import evaluate, run

    for seed in range(4):
        graph = _random_graph(seed, size=6)
        prims = [dataclasses.replace(k, cost=5.0)
                 for k in primitive_kernels(graph, AnalyticCostModel())]
        groups = group_kernels(graph, 4, lambda g: 2.0 + 1.0 * len(g.outputs))
        plan = orchestrate(graph, prims + groups)
        assert any(k.kind == "generated" for k in plan.kernels)
        fused = assemble(graph, plan)
        assert any(n.op == "fused" for n in fused.nodes.values())
        feeds = {"x": np.random.default_rng(seed).standard_normal((4, 8)).astype(np.float32)}
        want = evaluate(graph, feeds)
        for got in (evaluate(fused, feeds), run(to_onnx(fused), feeds)):
            for name in want:
                np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6)
        # Fission puts the generated kernels' primitives back.
        assert fission(fused).structural_hash() == graph.structural_hash()


def test_nothing_to_compute_and_unpriceable_kernels():
    """A graph of weights alone has no kernel to choose; a kernel priced inf or NaN (the
    target could not time it) is chosen only where nothing else computes its values."""
    b = GraphBuilder(seed=0)
    b.output(b.op("neg", b.weight(np.ones((2, 2), np.float32))))
    weights_only = b.build()
    assert orchestrate(weights_only, primitive_kernels(weights_only, AnalyticCostModel())
                       ).kernels == []
    graph, ids = _cyclic_pair_graph()
    prims = [dataclasses.replace(k, cost=float("inf") if i == 0 else 1.0)
             for i, k in enumerate(primitive_kernels(graph, AnalyticCostModel()))]
    groups = [dataclasses.replace(k, cost=float("nan"))
              for k in group_kernels(graph, 2, lambda g: 1.0)]
    plan = orchestrate(graph, prims + groups)
    assert plan.status == "optimal" and _valid(graph, plan.kernels)
