"""The e-graph searches end to end: every extractor's graph after saturation computes what
the input graph computes, and eqsat and mcts behave as search algorithms."""

from __future__ import annotations

import numpy as np
import pytest

from graphsub import zoo
from graphsub.cost import AnalyticCostModel
from graphsub.egraph.cycles import find_cycle
from graphsub.egraph.egraph import egraph_from_graph
from graphsub.egraph.ematch import match_key
from graphsub.egraph.readback import NodeCosts, extraction_problem, graph_from_choice
from graphsub.egraph.runner import Runner
from graphsub.egraph.saturation import EXTRACTORS, run_extractor
from graphsub.optimizer import optimize
from graphsub.ir import GraphBuilder
from graphsub.rules import builtin_rules, parse_rules
from graphsub.search import Limits
from graphsub.runtime import evaluate, graph_input_specs, random_feeds
from graphsub.egraph.mcts import MctsOptions, mcts_search
from graphsub.egraph.saturation import EqsatOptions, eqsat_search

RULES = builtin_rules(check=False)
COST = AnalyticCostModel("a100")


def assert_equivalent(a, b, rtol=1e-3):
    feeds = random_feeds(graph_input_specs(a), seed=3)
    ra, rb = evaluate(a, feeds), evaluate(b, feeds)
    assert ra.keys() == rb.keys()
    for k in ra:
        np.testing.assert_allclose(rb[k], ra[k], rtol=rtol,
                                   atol=rtol * max(float(np.abs(ra[k]).max()), 1e-6))


def saturated(model: str, node_limit: int, iterations: int = 6):
    graph = zoo.build(model)
    enc = egraph_from_graph(graph)
    runner = Runner(enc.egraph, RULES, node_limit=node_limit)
    multi = [i for i, r in enumerate(RULES) if len(r.sources) > 1]
    single = [i for i, r in enumerate(RULES) if len(r.sources) == 1]
    for it in range(iterations):
        if not runner.iterate((multi if it == 0 else []) + single) or runner.full:
            break
    return graph, enc, runner


@pytest.mark.parametrize("model,node_limit", [("squeezenet", 5000), ("nasrnn", 3000),
                                              ("bert", 3000), ("inception_e_blocks", 3000)])
@pytest.mark.parametrize("extractor", EXTRACTORS)
def test_every_extractor_returns_an_acyclic_graph_that_computes_the_same(model, node_limit,
                                                                          extractor):
    graph, enc, runner = saturated(model, node_limit)
    eg = runner.egraph
    assert eg.num_nodes > len(graph)  # the rules did add alternatives
    assert find_cycle(eg) is None
    ep = extraction_problem(eg, enc.outputs, NodeCosts(COST))
    result = run_extractor(extractor, ep.problem, 30.0)
    extracted = graph_from_choice(eg, ep, result.choice, graph, enc.inputs, enc.outputs)
    extracted.validate()  # acyclic, every reference resolves, types re-inferred
    assert [extracted.type_of(v) for v in extracted.outputs] == \
        [graph.type_of(v) for v in graph.outputs]
    assert extracted.input_names == graph.input_names
    assert_equivalent(graph, extracted)
    # The extractor's DAG cost is the graph's cost under the same model.
    assert COST.graph_cost(extracted) == pytest.approx(result.cost, rel=1e-6)
    if extractor == "ilp":  # the input graph is in the e-graph: the optimum is no worse
        assert result.cost <= COST.graph_cost(graph) * (1 + 1e-9)


def test_eqsat_improves_squeezenet_and_stays_equivalent():
    graph = zoo.build("squeezenet")
    result = eqsat_search(graph, RULES, COST, Limits(time=30))
    assert result.final_cost < result.initial_cost
    assert result.trace and all(step.rule for step in result.trace)
    assert result.stats.egraph["stopped_by"] == "saturated"
    assert result.candidates[0].graph is result.graph
    assert_equivalent(graph, result.graph)


def test_eqsat_honours_the_node_and_iteration_limits():
    graph = zoo.build("nasrnn")
    small = eqsat_search(graph, RULES, COST, Limits(), EqsatOptions(node_limit=600))
    assert small.stats.stopped_by == "node limit"
    assert small.stats.egraph["nodes"] < 600 + 200  # one application may overshoot a little
    one = eqsat_search(graph, RULES, COST, Limits(budget=1))
    assert one.stats.egraph["iterations"] == 1
    assert_equivalent(graph, small.graph)


def test_mcts_applies_rules_that_pay_and_reports_its_search():
    graph = zoo.build("squeezenet")
    result = mcts_search(graph, RULES, COST, Limits(time=60, budget=8), MctsOptions(seed=1))
    info = result.stats.egraph
    assert info["decisions"]  # the tree chose and applied rules
    assert info["mcts"]["iterations"] > 0 and info["mcts"]["seconds_per_iteration"] > 0
    assert result.final_cost <= result.initial_cost
    assert_equivalent(graph, result.graph)
    # Same seed, same decisions: the search is reproducible.
    again = mcts_search(graph, RULES, COST, Limits(time=60, budget=8), MctsOptions(seed=1))
    assert again.stats.egraph["decisions"] == info["decisions"]


def test_mcts_moves_to_a_child_whose_subtree_its_budget_explored_to_the_end():
    """One rule, one match: after the first expansion nothing below the child is left to
    try, so the child is saturated; it is still the move that pays (it was once dropped,
    and MCTS applied nothing)."""
    b = GraphBuilder(seed=0)
    x, y = b.input("x", (8, 64)), b.input("y", (8, 64))
    b.output(b.tanh(b.mul(b.exp(x), b.exp(y))), "out")
    graph = b.build()
    (rule,) = parse_rules("rule exp-product: (mul (exp ?a) (exp ?b)) => (exp (add ?a ?b))")
    result = mcts_search(graph, [rule], COST, Limits(time=20, budget=8), MctsOptions())
    assert result.stats.egraph["decisions"] == ["exp-product"]
    assert result.rules_used() == {"exp-product": 1} and result.final_cost < result.initial_cost
    assert_equivalent(graph, result.graph)


@pytest.mark.parametrize("algorithm", ["eqsat", "mcts"])
def test_optimize_runs_the_egraph_algorithms_behind_the_common_signature(algorithm):
    graph = zoo.build("squeezenet")
    result = optimize(graph, RULES, algorithm, cost=COST, time_limit=20, budget=4)
    assert result.final_cost <= result.initial_cost
    assert_equivalent(graph, result.graph)


def test_node_costs_stay_right_across_diverged_clones():
    """MCTS prices clones of one e-graph with one NodeCosts; an e-node id names different
    e-nodes in clones that grew differently, so costs must not be remembered by id."""
    enc = egraph_from_graph(zoo.build("resnext50"))
    names = [r.name for r in RULES]
    shared = NodeCosts(COST)
    clones = []
    for rule in ("enlarge-conv-kernel", "merge-convs-shared-input"):
        runner = Runner(enc.egraph.clone(), RULES)
        assert runner.apply_rule(names.index(rule))
        clones.append(runner.egraph)
    for eg in clones:
        fresh = NodeCosts(COST)
        for cls in eg.classes:
            for n in eg.nodes_of(cls):
                assert shared.cost(eg, n) == fresh.cost(eg, n)


def test_matching_past_its_deadline_stops_before_changing_the_egraph():
    """A multi-pattern join can be long (every match of one source against every match of
    another); a search past its deadline raises instead of finishing it, with the e-graph
    as it was."""
    import time

    from graphsub.egraph.ematch import DeadlineReached

    enc = egraph_from_graph(zoo.build("nasrnn"))
    runner = Runner(enc.egraph, RULES, node_limit=50_000)
    multi = [i for i, r in enumerate(RULES) if len(r.sources) > 1]
    version = enc.egraph.version
    with pytest.raises(DeadlineReached):
        runner.iterate(multi, deadline=time.perf_counter() - 1.0)
    assert enc.egraph.version == version


def test_looking_for_patterns_past_the_deadline_stops_there():
    """MCTS checks hundreds of rules' patterns after each expansion; on a large e-graph that
    takes seconds, so the look reads the clock as it goes."""
    import time

    from graphsub.search.run import DeadlineReached

    _, _, runner = saturated("nasrnn", 3000, iterations=2)
    late = time.perf_counter() - 1.0
    occurring = next(i for i in range(len(RULES)) if runner.applicable(i))
    with pytest.raises(DeadlineReached):
        runner.applicable(occurring, deadline=late)
    single = [i for i, r in enumerate(RULES) if len(r.sources) == 1]
    version = runner.egraph.version
    with pytest.raises(DeadlineReached):
        runner.apply(runner.search(single, deadline=late))
    assert runner.egraph.version == version


def test_a_runners_clones_share_rule_states_until_they_search_and_stay_independent():
    """A clone copies a rule's search state only when one side searches that rule (MCTS
    clones runners by the hundred; copying every rule's state each time filled the heap),
    and what either side then finds is what it would find alone."""
    single = [i for i, r in enumerate(RULES) if len(r.sources) == 1]
    runs = []
    for clone_first in (False, True):
        _, _, runner = saturated("nasrnn", 3000, iterations=1)
        if clone_first:
            clone = runner.clone()
            assert all(a is b for a, b in zip(clone.indexes, runner.indexes))
            clone.iterate(single)
            assert clone.egraph.num_nodes > runner.egraph.num_nodes
        runs.append((len(runner.search(single)), runner.egraph.num_nodes))
    assert runs[0] == runs[1] and runs[0][0] > 0


@pytest.mark.parametrize("search", [eqsat_search, mcts_search])
def test_egraph_searches_stop_at_their_time_limit_with_a_valid_graph(search):
    graph = zoo.build("nasrnn")
    result = search(graph, RULES, COST, Limits(time=0.05))
    assert result.stats.stopped_by == "time"
    assert result.final_cost <= result.initial_cost
    assert_equivalent(graph, result.graph)


def test_semi_naive_joins_lose_no_multi_pattern_match():
    """After an iteration, new matches of a source are joined with old matches of the others
    once per combination (the first new source decides which join yields it): the matches of
    two semi-naive searches hold every match a full search of the final e-graph finds."""
    graph = zoo.build("nasrnn")
    multi = [i for i, r in enumerate(RULES) if len(r.sources) > 1]
    single = [i for i, r in enumerate(RULES) if len(r.sources) == 1]
    enc = egraph_from_graph(graph)
    eg = enc.egraph
    runner = Runner(eg, RULES, node_limit=50_000)
    first = runner.search(multi)
    assert runner.apply(runner.search(single))
    second = runner.search(multi)
    keys = {match_key(eg, m) for m in first + second}
    assert len({match_key(eg, m) for m in second}) == len(second)
    everything = {match_key(eg, m) for m in Runner(eg, RULES, 50_000).search(multi)}
    assert everything <= keys and second
