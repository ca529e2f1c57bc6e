"""The generator's first part (TASO Algorithm 1 and step 2): enumeration counts against hand
counts, fingerprints, and known rules found and numerically checked."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from graphsub.generate import Enumerator, candidates, fingerprint, to_rule
from graphsub.generate.opset import PRIME, GenTensor
from graphsub.rules import check_rule, print_rule
from graphsub.rules.check import RuleCheckError
from graphsub.rules.parser import print_expr
from graphsub.proofs import prove


@pytest.mark.parametrize("shapes, ops, max_ops, counts", [
    # add(A, A); then add(A, t1) and add(t1, t1) (add(A, A) again would duplicate computation)
    ({"A": (2, 2)}, ["ewadd"], 2, {1: 1, 2: 2}),
    # add is commutative: add(A, B) and add(B, A) are one computation
    ({"A": (2, 2), "B": (2, 2)}, ["ewadd"], 1, {1: 3}),
    # matmul is not: A@A, A@B, B@A, B@B
    ({"A": (2, 2), "B": (2, 2)}, ["matmul"], 1, {1: 4}),
    # transpose(A); transpose(transpose(A)) equals A, a tensor the graph has: pruned (TASO)
    ({"A": (2, 3)}, ["transpose"], 2, {1: 1}),
    # element-wise ops need equal shapes: only add(A, A) and add(B, B)
    ({"A": (2, 2), "B": (3, 3)}, ["ewadd"], 1, {1: 2}),
    # concat on either axis, both orders: 2 axes x 4 ordered pairs; split needs a seam
    ({"A": (2, 2), "B": (2, 2)}, ["concat", "split"], 1, {1: 8}),
])
def test_enumeration_counts_match_hand_counts(shapes, ops, max_ops, counts):
    assert Enumerator(shapes, max_ops, ops).run().counts == counts


def test_graphs_reached_in_different_orders_are_recorded_once():
    # add(A, A) and transpose(A) can be placed in either order: one graph, not two
    e = Enumerator({"A": (2, 2)}, 2, ["ewadd", "transpose"]).run()
    two = [enc for group in e.by_fingerprint.values() for enc in group if len(enc) == 2]
    ops = sorted(tuple(sorted(n.op for n in e.enumerator.replay(enc).nodes)) for enc in two)
    # s = add(A, A), t = transpose(A): {s, t} (one order only), {s, add(A, s)}, {s, add(s, s)},
    # {s, transpose(s)}, {t, add(A, t)}, {t, add(t, t)}; {t, transpose(t)} recomputes A
    assert e.counts[2] == 6
    assert len(set(two)) == 6
    assert ops.count(("ewadd", "transpose")) == 4  # all but {s, add(A, s)}, {s, add(s, s)}


@pytest.mark.parametrize("shapes, ops, max_ops", [
    ({"A": (4, 4), "B": (4, 4)}, ["matmul", "ewadd", "transpose"], 3),
    ({"A": (2, 2), "B": (2, 2)}, ["concat", "split", "relu"], 3),
])
def test_tasks_split_by_first_operator_partition_the_graphs(shapes, ops, max_ops):
    """The canonical order gives every graph one first operator: running each first operator
    as its own task (as the process pool and Dask do) records each graph exactly once."""
    enum = Enumerator(shapes, max_ops, ops)
    whole = enum.run()
    seen: list = []
    for root in enum.roots():
        part = enum.run(roots=[root])
        seen += [enc for group in part.by_fingerprint.values() for enc in group]
    assert len(seen) == len(set(seen)) == whole.total
    assert set(seen) == {enc for g in whole.by_fingerprint.values() for enc in g}


def test_disconnected_graphs_are_not_recorded_except_batching_pairs():
    e = Enumerator({"A": (2, 2), "B": (2, 2)}, 2, ["relu", "transpose"]).run()
    graphs = [e.enumerator.replay(enc) for g in e.by_fingerprint.values() for enc in g]
    pairs = [g for g in graphs if g.size == 2 and not
             set(g.nodes[0].outputs + g.nodes[0].inputs) & set(g.nodes[1].inputs)]
    # relu(A), relu(B) and transpose(A), transpose(B) are kept (a target can batch them);
    # relu(A), transpose(B) is not (relu(A), transpose(A) share A: connected)
    assert sorted((g.nodes[0].op, g.nodes[1].op) for g in pairs) == [
        ("relu", "relu"), ("transpose", "transpose")]


def tensor(values) -> GenTensor:
    arr = np.asarray(values, dtype=np.int64) % PRIME
    return GenTensor(arr.shape, arr, (arr.astype(float),))


def test_fingerprint_ignores_output_order_but_not_content_or_shape():
    a, b = tensor([[1, 2], [3, 4]]), tensor([[5, 6], [7, 8]])
    assert fingerprint([a, b]) == fingerprint([b, a])
    assert fingerprint([a, b]) != fingerprint([a, tensor([[5, 6], [7, 9]])])
    assert fingerprint([tensor([1, 2, 3, 4])]) != fingerprint([tensor([[1, 2], [3, 4]])])


def test_matmul_associativity_is_found_and_checks():
    e = Enumerator({"A": (4, 4), "B": (4, 4), "C": (4, 4)}, 2, ["matmul"]).run()
    texts = {print_rule(to_rule(c, "r")).split("\n", 2)[2] for c in candidates(e)}
    ranks = "\n  where (eq (rank ?A) 2), (eq (rank ?B) 2), (eq (rank ?C) 2)"
    assert "  (matmul :activation none (matmul :activation none ?A ?B) ?C)\n  => (matmul :activation none ?A (matmul :activation none ?B ?C))" + ranks in texts \
        or "  (matmul :activation none ?A (matmul :activation none ?B ?C))\n  => (matmul :activation none (matmul :activation none ?A ?B) ?C)" + ranks in texts
    for i, c in enumerate(candidates(e)):
        rule = to_rule(c, f"gen-{i}")
        assert rule is not None and check_rule(rule).examples >= 1  # at the ranks it names
        assert prove(rule, 5000)[0], print_rule(rule)  # and Z3 proves each


def test_generated_rules_hold_only_at_the_ranks_they_were_tested_at():
    """Associativity was found on 4x4 matrices; with a vector operand it is false (the
    vector is a column on one side and a row on the other), so the rule names its ranks,
    and without them the checker, which tries every rank, refutes it."""
    e = Enumerator({"A": (4, 4), "B": (4, 4), "C": (4, 4)}, 2, ["matmul"]).run()
    rules = [r for i, c in enumerate(candidates(e)) if (r := to_rule(c, f"gen-{i}"))]
    assoc = [r for r in rules if len(r.source_vars) == 3]
    assert assoc
    for rule in assoc:
        assert {print_expr(c) for c in rule.conditions} == {
            f"(eq (rank ?{v}) 2)" for v in "ABC"}
        assert check_rule(rule).examples >= 1
        with pytest.raises(RuleCheckError, match="is wrong"):
            check_rule(dataclasses.replace(rule, conditions=()))


def test_figure_2b_is_found_with_symbolic_split_sizes():
    e = Enumerator({"A": (4, 4), "B": (4, 4), "C": (4, 4)}, 3, ["matmul", "concat", "split"]).run()
    found = []
    for i, c in enumerate(candidates(e)):
        if (c.source.size == 3 and c.target.size == 2 and len(c.mapping) == 2
                and {n.op for n in c.target.nodes} == {"matmul"}
                and len(c.target.used_inputs()) == 3):
            found.append(to_rule(c, f"fig2b-{i}"))
    assert found
    text = print_rule(found[0])
    assert "split :axis 1 :sizes [(dim ?B 1)" in text or "split :axis 0 :sizes [(dim ?A 0)" in text
    assert check_rule(found[0]).examples >= 1
    assert prove(found[0], 5000)[0]


def test_relu_is_replaced_by_a_non_linear_polynomial_in_fingerprints():
    """relu(x) would make every graph that is zero on negative inputs collide; x(x+1)+1 keeps
    relu(A) + relu(B) apart from relu(A + B)."""
    e = Enumerator({"A": (2, 2), "B": (2, 2)}, 2, ["ewadd", "relu"]).run()
    for c in candidates(e):
        text = print_rule(to_rule(c, "r"))
        assert not ("(relu (add" in text and "(add :same-shapes true (relu" in text)
