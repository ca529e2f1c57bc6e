"""MetaFlow's graph split: parts cover every operator once, are convex and runnable in order,
stitch back to the original when nothing is rewritten, cuts avoid matches, the search around
the cuts recovers a match that spans two parts, and split searches compute what the original
computes."""

from __future__ import annotations

import numpy as np
import pytest

import graphsub
from graphsub import zoo
from graphsub.cost import AnalyticCostModel
from graphsub.errors import GraphsubError
from graphsub.ir.builder import GraphBuilder
from graphsub.tensors.types import Constant, ConstantStub, WeightDataUnavailable
from graphsub.rules import builtin_rules
from graphsub.rules.rematching import IncrementalMatcher
from graphsub.runtime import graph_input_specs
from graphsub.verdicts import compare_models
from graphsub.verdicts.equivalence import Tolerance
from graphsub.search import ALGORITHMS, Limits, backtracking_search, splitting
from graphsub.search import split as split_module
from graphsub.search.split import (extract_region, min_cut_split, operator_capacities,
                                   partitioned, split_graph, stitch,
                                   without_weight_data)

RULES = builtin_rules(check=False)
COST = AnalyticCostModel("a100")
BACKTRACKING = ALGORITHMS["backtracking"]


def all_matches(graph):
    return [m for found in IncrementalMatcher(RULES).matches(graph) for m in found]


def assert_same_function(a, b):
    """Equal outputs in onnxruntime on random inputs (the numpy reference is too slow for
    NasNet-A in the default suite)."""
    comparison = compare_models(graphsub.to_onnx(a).SerializeToString(),
                                graphsub.to_onnx(b).SerializeToString(), graph_input_specs(a),
                                Tolerance(1e-3, 1e-4))
    assert comparison.equivalent, comparison


@pytest.mark.parametrize("spec", ["nasnet_a", "bert", "inception_v3", "resnet_blocks:n=8"])
def test_parts_cover_every_operator_once_and_run_in_order(spec):
    g = zoo.build(spec)
    parts = split_graph(g, 30, all_matches(g))
    covered = [nid for part in parts for nid in part]
    assert sorted(covered) == sorted(partitioned(g))  # each operator in exactly one part
    assert all(0 < len(part) <= 30 for part in parts)
    part_of = {nid: i for i, part in enumerate(parts) for nid in part}
    for nid in covered:  # edges only go forward: the parts are convex and runnable in order
        assert all(part_of.get(v.node, -1) <= part_of[nid] for v in g[nid].inputs)


@pytest.mark.parametrize("spec", ["nasnet_a", "bert"])
def test_stitching_unchanged_parts_gives_the_original(spec):
    g = zoo.build(spec)
    regions = [extract_region(g, part) for part in split_graph(g, 30, all_matches(g))]
    for region in regions:
        region.graph.validate()
    stitched, _ = stitch(g, [(r, r.graph) for r in regions])
    assert stitched.structural_hash() == g.structural_hash()
    assert len(stitched) == len(g)


def test_a_split_search_without_rules_returns_the_original():
    g = zoo.build("nasrnn")
    search = splitting(BACKTRACKING, threshold=20, executor="serial")
    result = search(g, [], COST, Limits(time=5))
    assert result.graph.structural_hash() == g.structural_hash()
    assert result.trace == ()


def chain_with_two_projections():
    """relu(x) feeds two matmuls, each followed by a chain of tanh, summed at the end: the
    two matmuls can be merged, and a cut between them (forced below) hides that."""
    b = GraphBuilder(seed=1)
    h = b.relu(b.input("x", (8, 64)))
    ends = []
    for _ in range(2):
        y = b.matmul(h, b.he_weight((64, 64)))
        for _ in range(6):
            y = b.tanh(y)
        ends.append(y)
    b.output(b.add(*ends))
    return b.build()


def test_capacity_counts_matches_through_an_operator():
    g = chain_with_two_projections()
    matches = all_matches(g)
    cap = operator_capacities(g, matches)
    for nid, count in cap.items():
        expected = sum(1 for m in matches if nid in m.nodes
                       and any(v.node in m.nodes for v in g[nid].inputs)
                       and any(u in m.nodes for u, _ in g.users()[nid]))
        assert count == expected > 0


def test_the_minimum_cut_avoids_operators_that_matches_run_through():
    g = chain_with_two_projections()
    ops = partitioned(g)
    cap = operator_capacities(g, all_matches(g))
    upstream, downstream = min_cut_split(g, ops, cap)
    assert upstream and downstream and sorted(upstream + downstream) == sorted(ops)
    frontier = [n for n in downstream if any(v.node in set(upstream) for v in g[n].inputs)]
    # The cut costs what the cheapest convex cut between the first and last third costs.
    assert sum(cap[n] for n in frontier) == min(
        sum(cap[n] for n in downstream_frontier(g, ops[:i], ops[i:]))
        for i in range(len(ops) // 3, len(ops) - len(ops) // 3 + 1)
        if downstream_frontier(g, ops[:i], ops[i:]) is not None)


def downstream_frontier(g, up, down):
    """The operators of `down` reading from `up`, or None when one of them reads from both
    (not a cut the flow network allows)."""
    up = set(up)
    front = [n for n in down if any(v.node in up for v in g[n].inputs)]
    if any(any(v.node in set(down) for v in g[n].inputs) for n in front):
        return None
    return front


def test_the_search_around_the_cuts_recovers_a_match_that_spans_two_parts(monkeypatch):
    g = chain_with_two_projections()
    order = partitioned(g)
    matmuls = g.nodes_by_op("matmul")
    first_chain = [n for n in order if n not in matmuls[1:]][:8]  # relu, matmul, 6 tanh
    parts = [first_chain, [n for n in order if n not in first_chain]]
    monkeypatch.setattr(split_module, "split_graph", lambda graph, threshold, matches: parts)
    views_free = AnalyticCostModel("a100", frozenset({"alias", "strided"}))  # torch
    alone = backtracking_search(g, RULES, views_free, Limits(time=10))
    assert alone.rules_used()["merge-matmuls-shared-input"] == 1  # it pays, unsplit
    result = splitting(BACKTRACKING, threshold=10, executor="serial")(g, RULES, views_free,
                                                                   Limits(time=10))
    assert result.rules_used()["merge-matmuls-shared-input"] == 1
    assert result.final_cost == pytest.approx(alone.final_cost)
    assert_same_function(g, result.graph)


@pytest.mark.parametrize("spec", ["nasnet_a", "squeezenet"])
def test_split_search_finds_what_the_whole_search_finds_and_computes_the_same(spec):
    g = zoo.build(spec)
    whole = graphsub.optimize(g, RULES, cost=COST, time_limit=5)
    parts = graphsub.optimize(g, RULES, cost=COST, time_limit=5, split=30)
    assert parts.final_cost < parts.initial_cost
    assert parts.final_cost <= whole.final_cost * 1.02
    assert_same_function(g, parts.graph)


@pytest.mark.parametrize("executor", ["process", "dask"])
def test_parallel_and_serial_parts_give_the_same_graph(executor):
    g = zoo.build("squeezenet")  # every part's search runs to exhaustion: deterministic
    serial = splitting(BACKTRACKING, threshold=12, executor="serial")(g, RULES, COST,
                                                                      Limits(time=60))
    parallel = splitting(BACKTRACKING, threshold=12, executor=executor, workers=2)(
        g, RULES, COST, Limits(time=60))
    assert serial.stats.stopped_by == "exhausted"
    assert parallel.graph.structural_hash() == serial.graph.structural_hash()
    # The parts travelled without weight data; the stitched graph has the real weights back.
    weights = [n.attrs["value"] for n in parallel.graph.nodes.values() if n.op == "weight"]
    assert weights and not any(isinstance(w, ConstantStub) for w in weights)
    assert_same_function(g, parallel.graph)


def test_parts_travel_to_workers_without_weight_data():
    import pickle

    import numpy as np

    g = zoo.build("bert")
    stripped = without_weight_data(g)
    assert len(pickle.dumps(stripped)) < 0.01 * len(pickle.dumps(g))
    assert stripped.structural_hash() == g.structural_hash()
    assert all(stripped[n] == g[n] for n in g.nodes)
    ones = Constant(np.ones((64, 64), dtype="float32"))
    stub = ConstantStub(ones)
    assert stub == ones and hash(stub) == hash(ones) and stub.type == ones.type
    assert stub.all_equal(1.0) and not stub.all_equal(0.0)
    assert not ConstantStub(Constant(np.arange(4.0))).all_equal(0.0)
    with pytest.raises(GraphsubError, match="stayed in the process"):
        stub.array


def test_a_split_below_two_operators_is_a_clear_error():
    with pytest.raises(GraphsubError, match="split"):
        graphsub.optimize(zoo.build("squeezenet"), RULES, cost=COST, split=1)


def test_cost_models_travel_to_workers_without_their_caches():
    import pickle

    g = zoo.build("squeezenet")
    model = AnalyticCostModel("a100")
    cost = model.graph_cost(g)
    copy = pickle.loads(pickle.dumps(model))
    assert copy._memo == {} and copy._by_node == {}  # node identities mean nothing elsewhere
    assert copy.graph_cost(zoo.build("squeezenet")) == pytest.approx(cost)


def test_rule_conditions_on_weight_values_hold_in_the_workers():
    """A Llama's causal mask is a weight a rule condition reads (softmax-guard-unneeded asks
    whether a row is fully masked): it travels whole to a split's workers, and a condition on
    a stub's values is no match there rather than a crash."""
    g = zoo.build("llama:layers=2,seq=32,hidden=64,heads=4,kv_heads=2,mlp=128")
    result = splitting(BACKTRACKING, threshold=40, executor="process", workers=2)(
        g, RULES, COST, Limits(time=30))
    assert result.rules_used()["softmax-guard-unneeded"] == 2
    assert_same_function(g, result.graph)
    stripped = without_weight_data(g)
    kept = [n.attrs["value"] for n in stripped.nodes.values() if n.op == "weight"]
    assert not any(isinstance(w, ConstantStub) for w in kept)  # all small here: whole
    with pytest.raises(WeightDataUnavailable):
        ConstantStub(Constant(np.zeros((4, 4), dtype="float32"))).array
