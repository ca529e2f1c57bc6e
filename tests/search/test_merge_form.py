"""The merge form (issue 58): after the normal form, sibling products merged and a norm's scale
folded into the weights of the products that read it, to a fixed point, kept as the search's
start where predicted cheaper; the result computes what the graph computed."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from graphsub.ir.builder import GraphBuilder
from graphsub.rules import builtin_rules
from graphsub.rules.fixed_point import rewrite_to_fixed_point
from graphsub.rules.roles import Role, with_role
from graphsub.runtime import evaluate, graph_input_specs, random_feeds
from graphsub.search.normal_form import normal_form
from graphsub.verdicts.equivalence import SAME_FUNCTION, compare_outputs

MERGE = with_role(builtin_rules(), Role.MERGE)


def decoder_projections(order: tuple[int, ...], bias: bool = False, seed: int = 0):
    """An RMSNorm's scaled output (tokens x hidden, flattened from a batch of one as a linear
    layer traces) read by three products (q, k, v: 16, 8 and 8 outputs), built in `order`."""
    b = GraphBuilder(seed=seed)
    x = b.input("x", (1, 5, 16))
    norm = b.op("mul", x, b.op("reciprocal", b.op("sqrt", b.op(
        "add", b.op("reduce_mean", b.op("mul", x, x), axes=(2,), keepdims=True),
        b.weight(np.array(1e-6, dtype=np.float32))))))
    rng = np.random.default_rng(seed)
    scale = b.weight((1 + 0.5 * rng.standard_normal(16)).astype(np.float32))
    flat = b.op("reshape", b.op("mul", norm, scale), shape=(5, 16))
    outs = {}
    for k in order:
        y = b.op("matmul", flat, b.weight(rng.standard_normal((16, (16, 8, 8)[k]),
                                                              dtype=np.float32)))
        if bias:
            y = b.op("add", y, b.weight(rng.standard_normal((16, 8, 8)[k], dtype=np.float32)))
        outs[k] = y
    for k in sorted(outs):
        b.output(outs[k], "qkv"[k])
    return b.build()


def same_function(a, b) -> bool:
    feeds = random_feeds(graph_input_specs(a), seed=3)
    _, problems = compare_outputs(evaluate(a, feeds), evaluate(b, feeds), SAME_FUNCTION)
    return not problems


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))),
                         ids=lambda o: "".join("qkv"[k] for k in o))
def test_three_siblings_become_one_product_with_the_scale_in_its_weight(order):
    """Whichever sibling the fixed point meets first, all three merge (a product that found
    no partner before is looked at again once a merge made one) and the scale's pass over the
    activations goes."""
    graph = decoder_projections(order)
    merged, steps = rewrite_to_fixed_point(graph, MERGE)
    assert len(merged.nodes_by_op("matmul")) == 1, [m.rule.name for _, m in steps]
    weight_only = merged.weight_only()
    assert not [n for n in merged.nodes_by_op("mul") if n not in weight_only
                and any(merged[v.node].op == "weight" and merged.type_of(v).rank == 1
                        for v in merged[n].inputs)]
    assert same_function(graph, merged)


def test_biased_siblings_merge_too():
    graph = decoder_projections((0, 1, 2), bias=True)
    merged, _ = rewrite_to_fixed_point(graph, MERGE)
    assert len(merged.nodes_by_op("matmul")) == 1
    assert same_function(graph, merged)


class CountingCost:
    """A cost model that prices a graph by its products (each a call): merging pays."""

    compiles = True  # (no per-step prices: the normal form prices its result alone)

    def graph_cost(self, graph) -> float:
        return float(len(graph.nodes_by_op("matmul")))


def test_the_merge_form_is_kept_only_where_predicted_cheaper():
    graph = decoder_projections((0, 1, 2))
    kept, steps = normal_form(graph, MERGE, CountingCost())
    assert steps and len(kept.nodes_by_op("matmul")) == 1

    class Dearer(CountingCost):
        def graph_cost(self, graph) -> float:
            return -super().graph_cost(graph)

    same, none = normal_form(graph, MERGE, Dearer())
    assert same is graph and not none
