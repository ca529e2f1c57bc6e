"""OCGGS: the order over substitutions is a partial order, sorting a sequence keeps its result
(Theorem 4), and Pruning and DPP return the optimum that brute-force enumeration of every
sequence up to K finds, on the paper's small cases."""

from __future__ import annotations

import random

import pytest

from graphsub import zoo
from graphsub.cost import AnalyticCostModel
from graphsub.rules import Rejection, builtin_rules
from graphsub.rules.rematching import IncrementalMatcher
import graphsub
from graphsub.errors import GraphsubError
from graphsub.search import (EnumerationOptions, Limits, SamplingOptions, SequenceOptions,
                             dpp_search, enumeration_search, pruning_search, sampling_search)
from graphsub.search.ocggs import extend, initial_sequence, substitution

RULES = builtin_rules(check=False)
COST = AnalyticCostModel("a100")


def random_sequence(spec: str, length: int, seed: int):
    """A random (not necessarily ordered) sequence, with labels, as the search builds them."""
    rng = random.Random(seed)
    g = zoo.build(spec)
    seq = initial_sequence(g, COST.graph_cost(g))
    matcher = IncrementalMatcher(RULES)
    for _ in range(length):
        matches = [m for ms in matcher.matches(seq.graph) for m in ms]
        rng.shuffle(matches)
        for m in matches:
            nxt = extend(seq, substitution(seq, m), COST)
            if not isinstance(nxt, Rejection):
                seq = nxt
                break
        else:
            break
    return seq


def precedes(subs, a, b) -> bool:
    """Definition 8 for any two substitutions of a sequence (not only ordered ones), by its
    recursive definition: the latest dependency is the maximal one under the order itself."""
    if a == 0:
        return True
    if b == 0:
        return False

    def latest(s):
        deps = subs[s - 1].depends_on
        tops = [d for d in deps if all(precedes(subs, e, d) for e in deps)]
        assert len(tops) == 1
        return tops[0]

    m, n = latest(a), latest(b)
    if m != n:
        return precedes(subs, m, n) and not precedes(subs, n, m)
    return subs[a - 1].alpha <= subs[b - 1].alpha


@pytest.mark.parametrize("spec", ["inception_e_blocks:n=1", "nasrnn:steps=2", "squeezenet"])
def test_the_order_is_a_partial_order_on_generated_sequences(spec):
    for seed in range(4):
        seq = random_sequence(spec, 5, seed)
        ids = range(0, len(seq.subs) + 1)
        le = {(a, b): precedes(seq.subs, a, b) for a in ids for b in ids}
        for a in ids:
            assert le[a, a]
            for b in ids:
                if a != b and le[a, b]:
                    assert not le[b, a]
                for c in ids:
                    if le[a, b] and le[b, c]:
                        assert le[a, c]


def test_sorting_a_sequence_keeps_its_result():
    """Theorem 4, by the swaps of its proof: swapping adjacent out-of-order substitutions
    (re-applying them by their labels in the new order) reaches the same graph."""
    checked = 0
    for seed in range(12):
        seq = random_sequence("inception_e_blocks:n=1", 4, seed)
        want = seq.graph.fingerprint()
        order = list(range(1, len(seq.subs) + 1))
        swapped = False
        for i in range(len(order) - 1):
            a, b = order[i], order[i + 1]
            if precedes(seq.subs, b, a) and not precedes(seq.subs, a, b) \
                    and a not in seq.subs[b - 1].depends_on:
                order[i], order[i + 1] = b, a
                swapped = True
        if not swapped:
            continue
        # replay: the initial graph's nodes keep their ids, so a substitution that depends
        # only on N is found again by its matched node ids
        g = zoo.build("inception_e_blocks:n=1")
        replay = initial_sequence(g, COST.graph_cost(g))
        by_position = {}
        for pos in order:
            original = seq.subs[pos - 1]
            if original.depends_on - {0} - set(by_position):
                break
            target = {n for n in original.match.nodes}
            match = next((m for ms in IncrementalMatcher(RULES).matches(replay.graph) for m in ms
                          if m.rule == original.match.rule and set(m.nodes) == target), None)
            if match is None:
                break
            replay = extend(replay, substitution(replay, match), COST)
            assert not isinstance(replay, Rejection), replay
            by_position[pos] = True
        else:
            assert replay.graph.fingerprint() == want
            checked += 1
    assert checked > 0


@pytest.mark.parametrize("spec, k", [("resnet_blocks:n=1", 3), ("resnet_blocks:n=2", 3),
                                     ("sru", 3), ("inception_e_blocks:n=1", 2)])
def test_pruning_and_dpp_equal_brute_force(spec, k):
    g = zoo.build(spec)
    long = Limits(time=600)
    brute = enumeration_search(g, RULES, COST, long, EnumerationOptions(k=k))
    pruning = pruning_search(g, RULES, COST, long, SequenceOptions(k=k))
    dpp = dpp_search(g, RULES, COST, long, SequenceOptions(k=k))
    for r in (brute, pruning, dpp):
        assert r.stats.stopped_by == "exhausted"
    assert pruning.final_cost == pytest.approx(brute.final_cost, rel=1e-12)
    assert dpp.final_cost == pytest.approx(brute.final_cost, rel=1e-12)
    assert pruning.stats.generated <= brute.stats.generated
    assert dpp.stats.generated == pruning.stats.generated
    assert dpp.stats.matches_computed <= pruning.stats.matches_computed


def test_sampling_finds_the_fold_behind_a_costly_merge():
    """The attention case backtracking misses (tests/rules/test_transformer_rules.py): both
    scale folds and the merges, with the paper's settings. Without the attention rules, which
    make the scales the attention operator's own (and fewer steps of a sequence of K)."""
    from tests.rules.test_transformer_rules import exported_attention, same_outputs

    g = exported_attention()
    rules = [r for r in RULES if not r.origin.endswith("attention.rules")]
    result = sampling_search(g, rules, AnalyticCostModel("cpu"), Limits(time=60))
    ops = [result.graph[n].op for n in result.graph.topo_order()
           if n not in result.graph.weight_only()]
    assert "smul" not in ops, result.rules_used()
    assert result.rules_used()["merge-linears-shared-input"] >= 1
    same_outputs(g, result.graph)


def test_sampling_reaches_brute_force_on_a_small_case():
    g = zoo.build("resnet_blocks:n=2")
    brute = enumeration_search(g, RULES, COST, Limits(time=600), EnumerationOptions(k=3))
    sampled = sampling_search(g, RULES, COST, Limits(time=600), SamplingOptions(k=3))
    assert sampled.final_cost <= brute.final_cost * (1 + 1e-12)


def test_an_option_the_search_does_not_take_is_an_error():
    """Every search takes its own options and refuses others (they once vanished silently
    into `**_`: an alpha given to pruning did nothing)."""
    with pytest.raises(GraphsubError, match="pruning search has no setting alpha"):
        graphsub.optimize(zoo.build("squeezenet"), RULES, "pruning", alpha=1.0, cost=COST)
    with pytest.raises(TypeError, match="alpha"):
        SequenceOptions(alpha=1.0)
