"""Everything a search derives from an edited graph incrementally (users, weight-only set,
fingerprints, topological positions, dead-node removal, cost, rule matches) equals what a
from-scratch computation gives, along random substitution sequences on zoo models."""

from __future__ import annotations

import random
import zlib

import pytest

from graphsub import zoo
from graphsub.cost import AnalyticCostModel
from graphsub.cost.base import CostModel, OpSignature
from graphsub.ir.graph import Graph
from graphsub.rules import builtin_rules, find_matches
from graphsub.rules.applier import Rejection, apply_match
from graphsub.rules.rematching import IncrementalMatcher, rule_radius

RULES = builtin_rules(check=False)
MODELS = ["squeezenet", "sru", "nasrnn:steps=2", "inception_e_blocks:n=1", "bert:layers=1",
          "resnext50", "nasnet_a"]


def fresh(g: Graph) -> Graph:
    """The same graph without its edit history: every fact is computed from scratch."""
    return Graph(dict(g.nodes), g.inputs, g.outputs, g.output_names, g.facts, g.next_id)


def key(match):
    return (match.rule.name, match.roots, match.nodes, tuple(sorted(match.tensors.items())),
            tuple(sorted((k, repr(v)) for k, v in match.attrs.items())))


class ViewChainCost(CostModel):
    """A cost that depends on the chain of views above each input, like torch's strides."""

    layout_ops = frozenset({"transpose", "reshape", "split"})

    def __init__(self) -> None:
        super().__init__()
        self.layouts = self._chains

    def _chains(self, graph, nid):
        out = []
        for v in graph[nid].inputs:
            chain, cur = [], v
            while graph[cur.node].op in self.layout_ops and cur.node not in graph.weight_only():
                chain.append(graph[cur.node].op)
                cur = graph[cur.node].inputs[0]
            out.append(tuple(chain) or None)
        return tuple(out)

    def op_cost(self, sig: OpSignature) -> float:
        return 1.0 + (hash((sig.op, sig.layouts)) % 97) / 97


def random_walk(spec: str, steps: int, seed: int):
    """Yield (parent, child) along a random sequence of applicable rewrites."""
    rng = random.Random(seed)
    g = zoo.build(spec)
    matcher = IncrementalMatcher(RULES)
    for _ in range(steps):
        matches = [m for ms in matcher.matches(g) for m in ms]
        rng.shuffle(matches)
        for m in matches:
            child = apply_match(g, m)
            if not isinstance(child, Rejection):
                yield matcher, g, child
                g = child
                break
        else:
            return


@pytest.mark.parametrize("spec", MODELS)
def test_incremental_facts_equal_a_full_recomputation(spec):
    models = [(AnalyticCostModel("a100"), lambda: AnalyticCostModel("a100")),
              (ViewChainCost(), ViewChainCost)]
    steps = 0
    for matcher, parent, child in random_walk(spec, steps=12, seed=zlib.crc32(spec.encode())):
        steps += 1
        ref = fresh(child)
        assert len(ref.topo_order()) == len(child), "dead nodes left behind"
        assert {n: sorted(u) for n, u in child.users().items()} == \
            {n: sorted(u) for n, u in ref.users().items()}
        assert child.weight_only() == ref.weight_only()
        assert child.fingerprint() == ref.fingerprint()
        assert child.fingerprints() == ref.fingerprints()
        for nid, node in child.nodes.items():
            for v in node.inputs:
                assert child.delta.position(v.node) < child.delta.position(nid)
        for incremental_model, new_model in models:
            assert incremental_model.graph_cost(child) == pytest.approx(
                new_model().graph_cost(ref), rel=1e-9)
        incremental = {key(m) for ms in matcher.matches(child) for m in ms}
        full = {key(m) for rule in RULES for m in find_matches(ref, rule)}
        assert incremental == full
    assert steps >= 5
    assert matcher.counts.reused > 0


def test_rule_radius_is_the_first_roots_eccentricity():
    by_name = {r.name: r for r in RULES}
    assert rule_radius(by_name["merge-linears-shared-input"]) >= 3
    assert all(r is None or r >= 1 for r in map(rule_radius, RULES))


def test_a_rewrite_that_needs_reordering_keeps_positions_valid_and_equals_the_full_path():
    """Merging two convolutions puts a new split after a reader of the first one: the
    reader's ancestors are moved before it instead of re-sorting the whole graph."""
    g = zoo.build("nasnet_a")
    rule = next(r for r in RULES if r.name == "merge-convs-shared-input")
    count = moved = 0
    for m in find_matches(g, rule):
        child = apply_match(g, m)
        if isinstance(child, Rejection):
            continue
        count += 1
        moved += 0 < sum(n in g.nodes for n in child.delta.new_positions) < len(g) / 2  # moved, not re-sorted
        for nid, node in child.nodes.items():
            for v in node.inputs:
                assert child.delta.position(v.node) < child.delta.position(nid)
        assert child.fingerprint() == fresh(child).fingerprint()
    assert count > 0 and moved > 0
