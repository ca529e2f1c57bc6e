"""Every built-in rule's two sides agree numerically (checked at load), and the check rejects
wrong rules instead of letting them through."""

from __future__ import annotations

from pathlib import Path

import pytest

from graphsub.rules import (RuleCheckError, builtin_rules, check_rule, load_rules, parse_rules,
                            print_rule)
from graphsub.rules.taso import import_taso_rules

TASO_PB = Path(__file__).resolve().parents[3] / "shared" / "data" / "taso" / "graph_subst.pb"


@pytest.mark.parametrize("rule", builtin_rules(check=False), ids=lambda r: r.name)
def test_builtin_rule_sides_agree_on_random_inputs(rule):
    result = check_rule(rule, examples=3)
    assert result.examples >= 1 and result.max_rel < 1e-4


@pytest.mark.parametrize("text", [
    # Enlarging a kernel is exact only at stride 1: at stride 2 SAME padding shifts.
    """rule bad-enlarge:
         (conv2d ?x ?w :stride [2 2] :padding same :dilation [1 1] :activation none)
         => (conv2d ?x (enlarge ?w :kernel [5 5]) :stride [2 2] :padding same)""",
    # Merging convolutions of one input is wrong for grouped ones (channels interleave).
    """rule bad-grouped-merge:
         (conv2d ?x ?w1 :stride [1 1] :padding same :dilation [1 1] :activation none),
         (conv2d ?x ?w2 :stride [1 1] :padding same :dilation [1 1] :activation none)
         => let y = (conv2d ?x (concat :axis 0 ?w1 ?w2))
            in (split :axis 1 :sizes [(dim ?w1 0) (dim ?w2 0)] y).0,
               (split :axis 1 :sizes [(dim ?w1 0) (dim ?w2 0)] y).1
         where (eq (dim ?w1 1) 2), (eq (dim ?x 1) 4)""",
    # relu is not linear (TASO section 3's example of an invalid candidate).
    """rule bad-relu-linear:
         (relu (add ?x ?y)) => (add (relu ?x) (relu ?y))""",
    # The library's matmul rules as they were before the fuzzer found them wrong: a vector in
    # the middle of a product is a column on one side and a row on the other, and x v + x W
    # broadcasts differently from x (v + W). The types of both sides agree.
    """rule assoc-left-for-all-ranks:
         (matmul ?a (matmul ?b ?c :activation none) :activation none)
         => (matmul (matmul ?a ?b) ?c)""",
    """rule assoc-right-for-all-ranks:
         (matmul (matmul ?a ?b :activation none) ?c :activation none)
         => (matmul ?a (matmul ?b ?c))""",
    """rule distribute-left-for-all-ranks:
         (add (matmul ?a ?b :activation none) (matmul ?a ?c :activation none))
         => (matmul ?a (add ?b ?c))""",
])
def test_wrong_rules_are_rejected(text):
    (rule,) = parse_rules(text)
    with pytest.raises(RuleCheckError, match="is wrong"):
        check_rule(rule)


@pytest.mark.parametrize("text, dtype", [
    # right in the reals; integer division truncates (1/2 + 1/2 is 0, 2/2 is 1)
    ("(add (div ?x ?y) (div ?z ?y)) => (div (add ?x ?z) ?y)", "int32"),
    # right in the reals away from zero; a uint8 or int8 product wraps before the quotient
    ("(div (mul ?x ?y) ?y) => ?x where (nonzero ?y), (eq (shape ?y) (shape ?x))", "int8"),
    # a scaling by a reciprocal, which truncates to zero in an integer type
    ("(div ?x ?c) => (smul ?x (constant :value (/ 1.0 (value ?c)) :shape [] "
     ":dtype (dtype ?x))) where (eq (shape ?c) []), (eq (shape $0) (shape ?x))", "int"),
])
def test_rules_wrong_only_in_integer_types_are_rejected(text, dtype):
    """Operands no role or condition types are drawn in integer types too (check.py's
    INTEGER_TYPES): an integer instance is the counterexample."""
    (rule,) = parse_rules(f"rule r: {text}")
    with pytest.raises(RuleCheckError, match=f"is wrong(.|\n)*{dtype}"):
        check_rule(rule)


def test_a_target_that_builds_only_where_sizes_coincide_is_drawn_there():
    """The merge of two products split along the wrong axis builds only where the batch is
    the sum of the two outputs' sizes (x [2 4 4], w1 and w2 [4 1]): the check keeps drawing
    at the ranks where the source matched but the target never built, and finds them."""
    (rule,) = parse_rules(
        "rule r: (matmul :activation ?a ?x ?w1), (matmul :activation ?a ?x ?w2) "
        "=> let y = (matmul :activation ?a ?x (concat :axis -1 ?w1 ?w2)) "
        "in (split :axis 0 :sizes [(dim ?w1 -1) (dim ?w2 -1)] y).0, "
        "(split :axis -1 :sizes [(dim ?w1 -1) (dim ?w2 -1)] y).1 "
        "where (eq (rank ?w1) 2), (eq (rank ?w2) 2)")
    with pytest.raises(RuleCheckError, match="is wrong"):
        check_rule(rule)


def test_integer_draws_leave_floating_point_rules_alone():
    """The same scaling, said to hold in floating point, passes: no integer instance of it
    matches."""
    (rule,) = parse_rules(
        "rule r: (div ?x ?c) => (smul ?x (constant :value (/ 1.0 (value ?c)) :shape [] "
        ":dtype (dtype ?x))) where (eq (shape ?c) []), (eq (shape $0) (shape ?x)), "
        "(in (dtype ?x) float16 bfloat16 float32 float64)")
    assert check_rule(rule).examples > 0


def test_untestable_rule_is_rejected():
    (rule,) = parse_rules("rule never: (relu ?x) => (relu ?x) where (eq 1 2)")
    with pytest.raises(RuleCheckError, match="could not be tested"):
        check_rule(rule)


def test_loading_a_file_with_a_wrong_rule_fails(tmp_path):
    path = tmp_path / "bad.rules"
    path.write_text("rule bad: (sigmoid ?x) => (tanh ?x)\n")
    with pytest.raises(RuleCheckError, match="bad.*is wrong"):
        load_rules([path])


@pytest.mark.skipif(not TASO_PB.exists(), reason="../shared/data/taso/graph_subst.pb is not beside the checkout")
def test_taso_rule_file_imports_and_checks():
    from graphsub.proofs.loading import verified

    result = import_taso_rules(TASO_PB, decide=verified)  # as `--rules graph_subst.pb` loads
    assert result.total == 133
    # rules 99, 100, 130 and 131 are wrong where their convolutions have different numbers of
    # outputs (tests/proofs/test_taso_proofs.py): not loaded
    assert len(result.rules) == 129 and set(result.skipped) == {99, 100, 130, 131}, \
        result.summary()
    # TASO's verifier does not model conv groups: these hold only for ungrouped convolutions.
    assert set(result.restricted) == {98, 105, 125, 126, 127, 128, 129}
    names = {r.name for r in result.rules}
    assert "taso-0" in names
    assert str(result.rules[0].sources[0]) and result.rules[0].targets


def test_the_check_covers_every_rank_an_operand_accepts():
    """Vectors, matrices and (broadcasting) batches, in every combination the roles allow."""
    (rule,) = [r for r in builtin_rules(check=False) if r.name == "matmul-distribute-right"]
    ranks = {tuple(rank for _, rank in combo) for combo in check_rule(rule).ranks}
    # a vector beside a matrix or a batch is where the rule is wrong (its condition keeps it
    # out); every other combination is drawn
    assert {(1, 1, 1), (2, 2, 1), (3, 2, 2), (2, 3, 3), (2, 2, 2), (3, 3, 3)} <= ranks


@pytest.mark.skipif(not TASO_PB.exists(), reason="../shared/data/taso/graph_subst.pb is not beside the checkout")
def test_taso_matmul_rules_hold_for_matrices_only():
    rules = {r.name: r for r in import_taso_rules(TASO_PB, check=False).rules}
    for name in ("taso-0", "taso-1"):
        text = print_rule(rules[name])
        assert "matmul" in text and "where (eq (rank ?x1) 2)" in text, text


def test_a_rule_that_passed_is_not_checked_again_until_it_changes(tmp_path, monkeypatch):
    """Verifying a rule file takes seconds that every run would pay: passes are remembered
    (in the cache folder), by the rule's text and the checker's, prover's and operators'
    source."""
    from graphsub.proofs import loading
    from graphsub.rules.check import CheckedRules

    monkeypatch.setenv("GRAPHSUB_CACHE_DIR", str(tmp_path))
    (rule,) = parse_rules("rule relu-t: (relu (transpose ?x :perm [1 0])) "
                          "=> (transpose (relu ?x) :perm [1 0])")
    calls = []
    real = loading.verify_rule
    monkeypatch.setattr(loading, "verify_rule",
                        lambda r, **kw: calls.append(r.name) or real(r, **kw))
    with CheckedRules.load(loading.verified) as passed:
        passed.check(rule)
    with CheckedRules.load(loading.verified) as passed:
        passed.check(rule)
    assert calls == ["relu-t"]
    (changed,) = parse_rules("rule relu-t: (relu (transpose ?x :perm [1 0])) "
                             "=> (relu (transpose (relu ?x) :perm [1 0]))")
    with CheckedRules.load(loading.verified) as passed:
        passed.check(changed)
    assert calls == ["relu-t", "relu-t"]
    with CheckedRules.load() as passed:  # another decision (the numerical check): its own pass
        assert not passed.has(rule)
    (wrong,) = parse_rules("rule bad: (sigmoid ?x) => (tanh ?x)")
    for _ in range(2):  # a failure is never remembered as a pass
        with pytest.raises(RuleCheckError), CheckedRules.load(loading.verified) as passed:
            passed.check(wrong)
    (tmp_path / CheckedRules.FILE).write_text("not json")
    assert not CheckedRules.load().has(rule)  # a damaged cache: checked again, no crash
