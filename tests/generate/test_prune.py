"""Pruning (TASO section 4): renaming classes collapse, instances of more general rules go,
common subgraphs generalize; and nothing that is not subsumed is removed."""

from __future__ import annotations

from graphsub.generate import Enumerator, candidates, to_rule
from graphsub.generate.prune import (canonical, generalize_common_operator, instance_of, prune,
                                     prune_renaming, strip_common_output)
from graphsub.rules import parse_rules


def rule(text: str):
    (r,) = parse_rules(f"rule r: {text}")
    return r


def test_renaming_keeps_one_rule_per_class_and_drops_instances():
    general = rule("(matmul (matmul ?A ?B) ?C) => (matmul ?A (matmul ?B ?C))")
    renamed = rule("(matmul (matmul ?X ?Y) ?Z) => (matmul ?X (matmul ?Y ?Z))")
    instance = rule("(matmul (matmul ?A ?B) ?A) => (matmul ?A (matmul ?B ?A))")  # C renamed A
    assert canonical(general) == canonical(renamed)
    assert instance_of(instance, general) and not instance_of(general, instance)
    assert prune_renaming([instance, renamed, general]) == [renamed]


def test_common_operator_becomes_a_fresh_input():
    r = rule("(add (relu ?A) (mul ?B ?C)) => (add (mul ?C ?B) (relu ?A))")
    g = generalize_common_operator(r)
    assert g is not None and "relu" not in canonical(g)
    assert len(g.source_vars) == 3


def test_common_output_operator_is_stripped():
    r = rule("(relu (add (mul ?A ?B) ?C)) => (relu (add (mul ?B ?A) ?C))")
    g = strip_common_output(r)
    assert canonical(g) == canonical(rule("(add (mul ?A ?B) ?C) => (add (mul ?B ?A) ?C)"))


def generated():
    e = Enumerator({"A": (4, 4), "B": (4, 4), "C": (4, 4)}, 2,
                   ["matmul", "ewadd", "ewmul", "transpose", "relu"]).run()
    return [to_rule(c, f"gen-{i}") for i, c in enumerate(candidates(e))]


def test_pruning_reports_counts_and_never_removes_an_unsubsumed_rule():
    rules = generated()
    kept, report = prune(rules)
    assert [name for name, _ in report.counts] == ["initial", "input tensor renaming",
                                                   "common subgraph"]
    assert report.counts[0][1] == len(rules) > report.counts[-1][1] == len(kept) > 0
    for r in rules:
        g = r
        for step in (generalize_common_operator, strip_common_output):
            while (nxt := step(g)) is not None and any(instance_of(nxt, k) for k in kept):
                g = nxt
        assert any(instance_of(g, k) for k in kept), f"{canonical(r)} lost"
