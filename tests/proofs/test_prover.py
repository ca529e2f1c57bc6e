"""The Z3 verifier: Table 2's axioms prove known rules, and wrong rules are not proven."""

from __future__ import annotations

from graphsub.rules import builtin_rules, parse_rules
from graphsub.proofs import AXIOM_COUNT, axioms, prove, verify_rule


def rule(text: str):
    (r,) = parse_rules(f"rule r: {text}")
    return r


def test_there_are_43_named_axioms():
    names = [a.name for a in axioms()]
    assert len(names) == AXIOM_COUNT == 43 and len(set(names)) == 43


def test_known_rules_are_proven():
    assert prove(rule("(matmul (matmul ?a ?b) ?c) => (matmul ?a (matmul ?b ?c))"))[0]
    # TASO figure 2b, both outputs
    fig2b = rule("""(matmul ?x ?w1), (matmul ?x ?w2)
        => (split :axis 1 (matmul ?x (concat :axis 1 ?w1 ?w2))).0,
           (split :axis 1 (matmul ?x (concat :axis 1 ?w1 ?w2))).1""")
    assert prove(fig2b)[0]
    # needs conv-relu and the enlarge property together
    assert prove(rule("""(relu (conv2d ?x ?w :stride 1 :padding same :activation none))
        => (conv2d ?x (enlarge ?w :kernel [3 3]) :stride 1 :padding same :activation relu)
        where (eq (dim ?w 1) (dim ?x 1))"""))[0]


def test_a_proof_says_nothing_of_a_convolution_that_may_be_grouped():
    """The axioms describe ungrouped convolution: a rule that does not keep its source's
    convolutions ungrouped is no proof's to give (TASO's merges 98, 105, 125-129 are proven
    from the axioms and wrong where grouped); the exact test vouches for it instead."""
    loose = rule("(relu (conv2d ?x ?w :stride 1 :padding same :activation none)) "
                 "=> (conv2d ?x ?w :stride 1 :padding same :activation relu)")
    ok, why = prove(loose)
    assert not ok and "may be grouped" in why
    assert verify_rule(loose, timeout_ms=2000).status == "tested"


def test_wrong_rules_are_not_proven_and_are_refuted_numerically():
    # relu is not linear: TASO section 3's example of a property the checks must reject
    bad = rule("(relu (add ?x ?y)) => (add (relu ?x) (relu ?y))")
    ok, why = prove(bad, timeout_ms=2000)
    assert not ok and why
    verdict = verify_rule(bad, timeout_ms=2000)
    assert verdict.status == "refuted"


def test_rules_outside_the_axioms_are_reported_as_such():
    ok, why = prove(rule("(sigmoid (transpose ?x :perm [1 0])) => (transpose (sigmoid ?x) :perm [1 0])"))
    assert not ok and "not expressible" in why and "sigmoid" in why


def test_builtin_algebra_rules_that_the_axioms_cover_are_proven():
    by_name = {r.name: r for r in builtin_rules(check=False)}
    for name in ("matmul-assoc-left", "matmul-assoc-right", "matmul-transpose",
                 "mul-factor-add", "add-assoc", "mul-assoc", "split-of-concat"):
        assert verify_rule(by_name[name], timeout_ms=5000).status == "proven", name
