"""The report's evidence: graph differences, rewrites replayed and drawn, time per operator."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from graphsub.cost import make_cost_model
from graphsub.ir import GraphBuilder
from graphsub.optimizer import optimize
from graphsub.report.evidence import (change_view, graph_diff, op_times, proof_status, replay,
                                      rewrite_evidence)
from graphsub.rules import builtin_rules, parse_rules
from graphsub.search.result import Candidate, Step, StepKind
from tests.report.conftest import transposes_model


def _changed(view):
    return sorted(n["label"] for n in view["nodes"] if n["changed"])


def _context(view):
    return sorted(n["label"] for n in view["nodes"] if not n["changed"])


def test_a_rewrite_changes_its_subgraph_not_everything_downstream():
    b = GraphBuilder(seed=0)
    x = b.input("x", (4, 32))
    y = b.sigmoid(b.tanh(b.identity(b.relu(x))))
    b.output(b.exp(y), "y")
    before = b.build()
    (rule,) = parse_rules("rule drop:\n  (identity ?x) => ?x")
    steps = replay(before, _best(before, [rule]), [rule])
    assert steps is not None and len(steps) == 1
    _, g0, g1 = steps[0]
    removed, added, mapping = graph_diff(g0, g1)
    assert [g0[n].op for n in removed] == ["identity"] and added == set()
    view = change_view(g0, g1)
    assert _changed(view["before"]) == ["identity"] and _changed(view["after"]) == []
    # the neighbours are drawn on both sides: relu now feeds tanh directly
    assert _context(view["before"]) == _context(view["after"]) == ["relu", "tanh"]
    labels = {n["id"]: n["label"] for n in view["after"]["nodes"]}
    assert [(labels[s], labels[d]) for s, d in view["after"]["edges"]] == [("relu", "tanh")]


def _best(graph, rules):
    result = optimize(graph, rules, "backtracking", rules_only=True, time_limit=5,
                      cost="analytic")
    assert result.candidates and result.candidates[0].trace
    return result.candidates[0]


def test_replayed_rewrites_reach_the_candidate_one_step_per_rule_application():
    graph = transposes_model()
    rules = builtin_rules()
    candidate = _best(graph, rules)
    steps = replay(graph, candidate, rules)
    assert steps is not None
    assert [rule for rule, _, _ in steps] == [s.rule for s in candidate.trace]
    assert steps[-1][2].fingerprint() == candidate.graph.fingerprint()
    for rule, before, after in steps:  # every step changes something, and little
        removed, added, _ = graph_diff(before, after)
        assert removed and len(removed) + len(added) <= 6, rule


def _ids_and_edges(graph):
    return {nid: (node.op, node.inputs) for nid, node in graph.nodes.items()}


def test_a_replay_rebuilds_the_searchs_own_graphs_node_for_node():
    """Each step is applied where the search applied it, so the replay ends at the
    candidate's graph with the same node ids, not only an isomorphic one."""
    graph = transposes_model()
    rules = builtin_rules()
    result = optimize(graph, rules, "backtracking", time_limit=5, cost="analytic", alpha=1.2)
    for candidate in result.candidates:
        steps = replay(graph, candidate, rules)
        assert steps is not None
        end = steps[-1][2] if steps else graph
        assert _ids_and_edges(end) == _ids_and_edges(candidate.graph)
        for step, (_, before, _) in zip(candidate.trace, steps):
            assert set(step.match.nodes) <= before.nodes.keys()


def test_a_trace_is_plain_json_with_each_steps_kind_and_match():
    graph = transposes_model()
    candidate = _best(graph, builtin_rules())
    fission = Step.of_kind(StepKind.FISSION, candidate.cost)
    saved = json.loads(json.dumps([asdict(s) for s in (*candidate.trace, fission)]))
    for step, data in zip(candidate.trace, saved):
        assert data["kind"] == "rule" and data["rule"] == step.rule
        match = data["match"]
        assert match["nodes"] == sorted(step.match.nodes) and match["nodes"]
        assert match["roots"] and all(len(v) == 2 for v in match["roots"])
        assert all(isinstance(n, int) and isinstance(i, int)
                   for n, i in match["tensors"].values())
    assert saved[-1] == {"rule": "fission and kernel orchestration",
                         "cost": candidate.cost, "kind": "fission", "match": None}


def test_steps_after_the_rules_are_named_and_the_rules_still_drawn_one_by_one():
    graph = transposes_model()
    rules = builtin_rules()
    found = _best(graph, rules)
    fused = Candidate(found.graph, found.cost,
                      (*found.trace, Step.of_kind(StepKind.ORT_FUSIONS, found.cost)))
    evidence = rewrite_evidence(graph, fused, rules, 0)
    assert evidence["stepwise"] and len(evidence["steps"]) == len(found.trace)
    assert evidence["other_steps"] == ["onnxruntime fusions (onnxscript)"]


def test_an_egraph_extraction_has_no_path_and_is_drawn_as_one_change():
    graph = transposes_model()
    rules = builtin_rules()
    result = optimize(graph, rules, "eqsat", time_limit=5, cost="analytic")
    candidate = result.candidates[0]
    # the normal form's steps (before the e-graph) have their matches, the extraction none
    extracted = [s for s in candidate.trace if s.match is None]
    assert extracted and all(s.match is None for s in candidate.trace[-len(extracted):])
    assert replay(graph, candidate, rules) is None
    evidence = rewrite_evidence(graph, candidate, rules, 0)
    assert evidence["stepwise"] is False and len(evidence["steps"]) == 1


def test_rewrites_that_cannot_be_replayed_are_drawn_as_one_change():
    graph = transposes_model()
    rules = builtin_rules()
    found = _best(graph, rules)
    scrambled = Candidate(found.graph, found.cost, tuple(reversed(found.trace))
                          + (Step("matmul-assoc-left", found.cost),))
    evidence = rewrite_evidence(graph, scrambled, rules, 0)
    assert evidence["stepwise"] is False and len(evidence["steps"]) == 1
    view = evidence["steps"][0]
    assert "transpose" in _changed(view["before"])
    assert "transpose" not in _changed(view["after"])


def test_evidence_names_each_rule_with_its_text_and_proof():
    graph = transposes_model()
    rules = builtin_rules()
    candidate = _best(graph, rules)
    evidence = rewrite_evidence(graph, candidate, rules, 3)
    assert evidence["candidate"] == 3 and evidence["stepwise"]
    assert set(evidence["rules"]) == {s.rule for s in candidate.trace}
    for name, info in evidence["rules"].items():
        assert info["text"].startswith(f"rule {name}:")
        assert info["proof"]


def test_proof_status_says_proven_or_why_not():
    by_name = {r.name: r for r in builtin_rules()}
    assert proof_status(by_name["matmul-assoc-left"]) == "proven"
    # beyond the axioms (an identity operator), tested exactly instead
    assert proof_status(by_name["remove-identity"]).startswith("tested: exact identity test")
    tanh_odd = parse_rules("rule r: (neg (tanh (neg ?x))) => (tanh ?x)")[0]
    assert "exact test: the two sides differ" in proof_status(tanh_odd)


def test_proofs_kept_per_process_stay_bounded_and_keep_the_recent_ones(monkeypatch, tmp_path):
    from graphsub.proofs import prover
    from graphsub.report import evidence

    monkeypatch.setenv("GRAPHSUB_CACHE_DIR", str(tmp_path))

    proved: list[str] = []

    def prove(rule, timeout_ms):
        proved.append(rule.name)
        return True, ""

    monkeypatch.setattr(prover, "prove", prove)
    monkeypatch.setattr(evidence, "_PROOFS", type(evidence._PROOFS)())
    monkeypatch.setattr(evidence, "PROOFS_KEPT", 3)
    rules = builtin_rules()[:5]
    for rule in rules[:3]:
        proof_status(rule)
    proof_status(rules[0])  # remembered, and now the most recently used
    for rule in rules[3:]:
        proof_status(rule)
    assert proved == [r.name for r in rules]  # each proven once
    assert len(evidence._PROOFS) == 3
    proof_status(rules[0])
    assert proved == [r.name for r in rules]  # still remembered


@pytest.mark.parametrize("model", ["bert", "squeezenet"])
def test_time_per_operator_type_adds_up_to_the_graph_cost(model):
    from graphsub import zoo

    graph = zoo.build(model)
    cost = make_cost_model("analytic")
    times = op_times(graph, cost)
    assert sum(times.values()) == pytest.approx(cost.graph_cost(graph), rel=1e-9)
    assert list(times.values()) == sorted(times.values(), reverse=True)
    assert "weight" not in times and "input" not in times


def test_a_reassociation_shows_both_products_changed_on_both_sides():
    b = GraphBuilder(seed=0)
    x, y = b.input("x", (4, 32)), b.input("y", (4, 32))
    b.output(b.relu(b.mul(b.mul(b.mul(x, y), b.exp(x)), b.tanh(y))), "out")
    graph = b.build()
    (rule,) = parse_rules("rule assoc:\n  (mul (mul ?x ?y) ?z) => (mul ?x (mul ?y ?z))")
    found = optimize(graph, [rule], "backtracking", rules_only=True, time_limit=5,
                     cost="analytic", alpha=2.0)
    moved = max(found.candidates, key=lambda c: len(c.trace))  # cost-neutral: not the best
    steps = replay(graph, moved, [rule])
    assert steps
    for _, before, after in steps:
        view = change_view(before, after)
        # the outer product reads other operands after the rewrite: it changed too
        assert _changed(view["before"]) == _changed(view["after"]) == ["mul", "mul"]


def _random_graphs(count: int):
    """The first `count` of the fuzzer's random models that graphsub imports (it declines
    some on purpose, as the fuzzer's own tests show)."""
    from graphsub.errors import GraphsubError
    from graphsub.fuzz.models import random_model
    from graphsub.onnx_io import load

    seed = 0
    while count:
        try:
            yield seed, load(random_model(seed))
            count -= 1
        except GraphsubError:
            pass
        seed += 1


def test_random_models_rewrites_replay_and_draw():
    """The fuzzer's random models through a search: every candidate's rewrites replay to its
    graph, each step changes something, and what a step draws is what it changed."""
    rules = builtin_rules()
    replayed = 0
    for seed, graph in _random_graphs(8):
        result = optimize(graph, rules, "backtracking", time_limit=1.5, cost="analytic",
                          alpha=1.2)
        for candidate in result.candidates:
            steps = replay(graph, candidate, rules)
            assert steps is not None, (seed, [s.rule for s in candidate.trace])
            for rule, before, after in steps:
                removed, added, mapping = graph_diff(before, after)
                assert removed or added, (seed, rule)
                assert set(mapping.values()).isdisjoint(removed)
                view = change_view(before, after)
                drawn = {n["id"] for n in view["before"]["nodes"] if n["changed"]}
                assert drawn <= removed and (drawn or not removed)
                replayed += 1
            evidence = rewrite_evidence(graph, candidate, rules, 0)
            assert evidence["stepwise"] and len(evidence["steps"]) == len(candidate.trace)
    assert replayed >= 8  # the searches found rewrites to replay



def test_a_rules_evidence_is_kept_across_runs(monkeypatch, tmp_path):
    """The exact test of a rule Z3 cannot prove is run once per machine, not once per run:
    a new process finds its verdict in the cache folder."""
    from graphsub.proofs import prover
    from graphsub.report import evidence

    monkeypatch.setenv("GRAPHSUB_CACHE_DIR", str(tmp_path))
    tests: list[str] = []
    real = prover.verify_rule
    monkeypatch.setattr(prover, "verify_rule",
                        lambda r, **kw: tests.append(r.name) or real(r, **kw))
    (flatten,) = [r for r in builtin_rules() if r.name == "remove-noop-flatten"]
    for _ in range(2):  # two runs: each a fresh process's memory
        monkeypatch.setattr(evidence, "_PROOFS", type(evidence._PROOFS)())
        assert proof_status(flatten).startswith("tested: exact identity test")
    assert tests == ["remove-noop-flatten"]
