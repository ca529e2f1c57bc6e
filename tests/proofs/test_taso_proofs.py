"""TASO's own rules are proven from Table 2's axioms, the prover's lemmas are consequences of
the axioms alone, and wrong variants of the rules stay unproven."""

from __future__ import annotations

from pathlib import Path

import pytest
import z3

from graphsub.rules import parse_rules
from graphsub.rules.taso import import_taso_rules
from graphsub.proofs import prove
from graphsub.proofs.axioms import signature
from graphsub.proofs.lemmas import Lemma, lemmas, prove_lemma, proven_lemmas
from graphsub.proofs.prover import verify_rule

TASO_PB = Path(__file__).resolve().parents[3] / "shared" / "data" / "taso" / "graph_subst.pb"
needs_taso = pytest.mark.skipif(not TASO_PB.exists(),
                                reason="../shared/data/taso/graph_subst.pb is not beside the checkout")

# Grouped convolutions (two groups): Table 2 describes only ungrouped ones.
NOT_ENTAILED = {99, 100, 130, 131}


def rule(text: str):
    (r,) = parse_rules(f"rule r: {text}")
    return r


@pytest.fixture(scope="module")
def taso_rules():
    return {int(r.name.rsplit("-", 1)[1]): r
            for r in import_taso_rules(TASO_PB, check=False).rules}


def test_every_lemma_is_proven_from_the_axioms_alone():
    assert len(lemmas()) >= 2
    for lem in lemmas():
        assert prove_lemma(lem, timeout_ms=10_000), lem.name
    assert [lem.name for lem in proven_lemmas()] == [lem.name for lem in lemmas()]


def test_a_false_lemma_is_not_proven():
    # matmul does not commute; the lemma machinery must not prove it (nor use it)
    s = signature()
    x, y = z3.Consts("x y", s.T)
    bogus = Lemma("matmul-comm", z3.ForAll([x, y], s.matmul(x, y) == s.matmul(y, x)))
    assert not prove_lemma(bogus, timeout_ms=1_000)


def test_row_concatenation_of_matmuls_is_proven_via_the_transpose_lemma():
    # TASO rule 79: Table 2 has only the column version; the row version needs transposes
    r79 = rule("""(matmul ?x1 ?x4), (matmul ?x2 ?x4)
        => (split :axis 0 (matmul (concat :axis 0 ?x1 ?x2) ?x4)).0,
           (split :axis 0 (matmul (concat :axis 0 ?x1 ?x2) ?x4)).1""")
    assert prove(r79, timeout_ms=10_000) == (True, "")


def test_permuted_concatenation_operands_are_proven():
    # TASO rule 103: exchanging the left halves of two concatenations under an add
    r103 = rule("""(add (concat :axis 1 ?a ?c) (concat :axis 1 ?b ?d))
        => (add (concat :axis 1 ?b ?c) (concat :axis 1 ?a ?d))""")
    assert prove(r103, timeout_ms=10_000)[0]


def test_wrong_permutations_are_not_proven():
    # exchanging a left half with a right half changes the result
    bad = rule("""(add (concat :axis 1 ?a ?c) (concat :axis 1 ?b ?d))
        => (add (concat :axis 1 ?c ?a) (concat :axis 1 ?b ?d))""")
    ok, why = prove(bad, timeout_ms=1_000)
    assert not ok and why
    # rows are not columns: concat axis 0 of matmuls sharing the left factor
    bad_rows = rule("""(concat :axis 0 (matmul ?x ?y) (matmul ?x ?z))
        => (matmul ?x (concat :axis 0 ?y ?z))""")
    ok, why = prove(bad_rows, timeout_ms=1_000)
    assert not ok and why


@needs_taso
def test_taso_rules_outside_grouped_convolution_are_all_proven(taso_rules):
    # Restricted to ungrouped convolutions (the axioms describe no other), every rule but the
    # four no chain of Table 2's properties reaches is proven, and the convolutions of
    # concatenations the restriction cannot name (their operands are no variables) are left
    # to the exact test: E-matching with both-sided triggers, and the lemmas.
    from graphsub.proofs.prover import _maybe_grouped
    from graphsub.rules.taso import convert_rule, read_taso_rules

    assert len(taso_rules) == 133
    unproven, unnamed = {}, []
    for tr in read_taso_rules(TASO_PB):
        if tr.number in NOT_ENTAILED:
            continue
        r = convert_rule(tr, ungrouped=True)
        if _maybe_grouped(r):
            unnamed.append(tr.number)
            continue
        ok, why = prove(r, timeout_ms=10_000)
        if not ok:
            unproven[tr.number] = why
    assert unproven == {} and len(unnamed) <= 19, (unproven, unnamed)  # 19 on 2026-11-29


@needs_taso
@pytest.mark.slow
def test_grouped_convolution_rules_stay_unproven(taso_rules):
    # they need a grouped-convolution property, which Table 2 does not have
    for number in sorted(NOT_ENTAILED):
        ok, why = prove(taso_rules[number], timeout_ms=2_000)
        assert not ok and why, number


def test_a_proof_says_which_shapes_it_covers():
    """The axioms model no shapes, so a proof of matmul associativity holds for matrices (the
    rule's condition keeps vectors out), and the report says so, with the numerical check's
    rank combinations."""
    from graphsub.rules import builtin_rules

    (rule,) = [r for r in builtin_rules(check=False) if r.name == "matmul-assoc-left"]
    verdict = verify_rule(rule, timeout_ms=5_000)
    assert verdict.status == "proven"
    assert "rank 2 or more" in verdict.scope and "conditions" in verdict.scope
    assert verdict.checked_ranks >= 6


#: TASO's merges of convolutions that are wrong where a convolution is grouped.
WRONG_WHEN_GROUPED = {98, 105, 125, 126, 127, 128, 129}
#: Wrong where their two convolutions have different numbers of output channels (x10 8x4x1x1,
#: x11 4x4x1x1: the merged convolution's two groups take six output channels each): 99 and
#: 130 are one rule, 100 and 131 the same with relu. Few instances have it; the verifier's
#: draws at the rules' seeds find one.
WRONG_WHEN_UNEQUAL = {99, 100, 130, 131}


@needs_taso
def test_the_exact_test_settles_what_the_axioms_cannot(taso_rules):
    """The grouped-convolution identities Table 2 cannot reach are wrong where the two
    convolutions differ in outputs, and refuted; the merges wrong for grouped convolutions
    differ in the exact test (on a grouped instance)."""
    from graphsub.proofs.identity import identity_test

    assert NOT_ENTAILED == WRONG_WHEN_UNEQUAL  # what the axioms cannot reach is wrong
    for number in sorted(WRONG_WHEN_GROUPED):  # through no random function: a counterexample
        assert identity_test(taso_rules[number]).status == "refutes", number
    for number in sorted(WRONG_WHEN_UNEQUAL):
        assert verify_rule(taso_rules[number], timeout_ms=2_000).status == "refuted", number
