"""The exact identity test (graphsub.proofs.identity): every built-in rule Z3 cannot prove
passes it, wrong rules do not (a few differ from a right one by less than the numerical
check's tolerance), and the exact evaluator's definitions of fused operators agree with their
numpy references once their random functions are the real ones."""

from __future__ import annotations

import json
import math
from fractions import Fraction

import numpy as np
import pytest
from typer.testing import CliRunner

from graphsub.cli import app
from graphsub.ir import GraphBuilder
from graphsub.proofs import exact, verify_rule
from graphsub.proofs.exact import NEG_INF, exact_evaluate, read_float, simplest_between
from graphsub.proofs.identity import identity_test
from graphsub.rules import builtin_rules, check_rule, parse_rules
from graphsub.runtime.reference import evaluate

runner = CliRunner()


def rule(text: str):
    (r,) = parse_rules(f"rule r: {text}")
    return r


def test_float_constants_read_as_the_rationals_they_stand_for():
    assert read_float(float(np.float32(1 / 9))) == Fraction(1, 9)  # a folded 3x3 average
    assert read_float(float(np.float32(1 / 2.5))) == Fraction(2, 5)
    assert read_float(2.5) == Fraction(5, 2) and read_float(-1024.0) == -1024
    assert read_float(float("-inf")) is NEG_INF
    assert simplest_between(Fraction(3, 10), Fraction(4, 10)) == Fraction(1, 3)
    # one irrational constant is one rational, whichever float32 computation produced it
    assert read_float(float(np.float32(math.sqrt(0.5)))) == read_float(1 / math.sqrt(2))


def test_minus_infinity_masks_and_softmax_leaves_masked_positions_out():
    row = np.array([Fraction(1), NEG_INF, Fraction(3)], dtype=object)
    assert (row + Fraction(2))[1] is NEG_INF
    weights = exact.softmax_rows(row.reshape(1, 3), -1)
    assert weights[0, 1] == 0 and weights[0, 0] != 0
    assert (exact.softmax_rows(np.array([[NEG_INF, NEG_INF]], dtype=object), -1,
                               guarded=True) == 0).all()
    with pytest.raises(exact.NotExact):
        exact.softmax_rows(np.array([[NEG_INF, NEG_INF]], dtype=object), -1)


WRONG = {
    # a square matrix is not its transpose
    "square transpose": "(transpose ?x :perm [1 0]) => ?x where (eq (dim ?x 0) (dim ?x 1))",
    # float32 -> float16 -> float32 rounds: only a widening round trip is the identity
    "narrowing round trip": "(cast (cast ?x :to float16) :to float32) => ?x "
                            "where (eq (dtype ?x) float32)",
    # a mask that is not -inf changes the softmax
    "dropped mask": "(softmax (add ?x ?m) :axis -1) => (softmax ?x :axis -1)",
    # the query's scale is lost
    "lost scale": "(attention (smul ?q ?s) ?k ?v :scale ?t :causal ?c) "
                  "=> (attention ?q ?k ?v :scale ?t :causal ?c)",
    # the halves of a split concatenated in the other order
    "swapped halves": "(concat :axis 0 (split :axis 0 :sizes [2 2] ?x).1 "
                      "(split :axis 0 :sizes [2 2] ?x).0) => ?x",
    # rounding to integers does not give back what it rounded
    "quantization is not invertible": "(dequantize (quantize ?x ?s ?z :axis 0) ?s ?z :axis 0) "
                                      "=> ?x where (eq (rank ?s) 0)",
    # ... not even at a scale of one, off the whole numbers
    "quantization at scale one": "(dequantize (quantize ?x ?s :axis 0 :dtype int16) ?s :axis 0)"
                                 " => ?x where (all-equal ?s 1)",
    # a product moved into float16 rounds (and overflows) there
    "work moved into half precision": "(add (cast (add ?a ?b) :to float32) (mul (cast ?x :to "
                                      "float32) (cast ?y :to float32))) => (add (cast (add ?a "
                                      "?b) :to float32) (cast (mul ?x ?y) :to float32)) where "
                                      "(eq (dtype ?x) float16), (eq (dtype ?y) float16), "
                                      "(eq (dtype ?a) float16), (eq (dtype ?b) float16)",
    # int8 sums wrap around
    "int8 sum": "(relu (dequantize (add ?p ?q) ?s :axis 0)) => (relu (add (dequantize ?p ?s "
                ":axis 0) (dequantize ?q ?s :axis 0))) where (eq (dtype ?p) int8), "
                "(eq (dtype ?q) int8), (eq (rank ?s) 0)",
    # integer division truncates
    "integer quotient": "(cast (mul (div ?p ?q) ?q) :to float32) => (cast ?p :to float32) "
                        "where (eq (dtype ?p) int32), (eq (dtype ?q) int32)",
    # 0.7 in float16 is 0.70019...
    "half-precision constant": "(mul ?x ?c) => (mul ?x (cast (constant :value 0.7 :shape [] "
                               ":dtype float16) :to float32)) where (all-equal ?c 0.7)",
}


@pytest.mark.parametrize("name", sorted(WRONG))
def test_wrong_rules_do_not_pass(name):
    result = identity_test(rule(WRONG[name]))
    assert result.status in ("differs", "refutes"), (name, result)


@pytest.mark.parametrize("dtype", ["uint8", "int8", "uint32"])
def test_wrapping_integer_arithmetic_is_exact(dtype):
    """Sums and products wrap modulo 2**bits, in whatever order: associativity and
    distributivity hold in every integer type, and the exact test knows it rather than
    calling the wrapped values random."""
    typed = ", ".join(f"(eq (dtype ?{v}) {dtype})" for v in "pqr")
    for text in ("(add (add ?p ?q) ?r) => (add ?p (add ?q ?r))",
                 "(mul (add ?p ?q) ?r) => (add (mul ?p ?r) (mul ?q ?r))",
                 "(mul (mul ?p ?q) ?r) => (mul ?p (mul ?q ?r))"):
        result = identity_test(rule(f"{text} where {typed}"))
        assert result.status == "passed", (text, result)


def test_integer_quotients_truncate_toward_zero_as_the_reference_does():
    a, b = np.array([-128, 7, -7, 127], np.int8), np.array([3, -2, 2, -1], np.int8)
    g = GraphBuilder()
    x, y = g.input("a", a.shape, "int8"), g.input("b", b.shape, "int8")
    g.output(g.op("div", x, y), "q")
    graph = g.build()
    reference = evaluate(graph, {"a": a, "b": b})["q"]
    assert reference.tolist() == [-42, -3, -3, -127]
    exactly = exact_evaluate(graph, {"a": a, "b": b})["q"]
    assert [int(v) for v in exactly] == reference.tolist()


def test_the_largest_float_as_a_mask_value_is_read_not_a_crash():
    """Exporters mask with float32's lowest value: it has no neighbour below."""
    lowest = float(np.finfo(np.float32).min)
    read = read_float(lowest)
    assert isinstance(read, Fraction) and np.float32(float(read)) == np.float32(lowest)
    ok = rule("(softmax (add ?x ?c) :axis -1) => (softmax (add ?c ?x) :axis -1) "
              "where (all-equal ?c -3.4028234663852886e38)")
    assert identity_test(ok).status == "passed"


def test_a_difference_below_the_numerical_checks_tolerance_is_found():
    """x * 1.00001 is x to the numerical check (rtol 1e-4); not to the exact test."""
    near = rule("(mul ?x ?c) => ?x where (all-equal ?c 1.00001), (eq (shape $0) (shape ?x))")
    assert check_rule(near).examples > 0  # passes the numerical check
    assert identity_test(near).status == "refutes"  # through no random function


def test_a_property_of_a_function_made_random_is_unknown_never_refuted():
    """tanh is odd, which the test cannot know of a random function: the rule stays unknown,
    with the reason, and is not called wrong."""
    verdict = verify_rule(rule("(neg (tanh (neg ?x))) => (tanh ?x)"), timeout_ms=1000)
    assert verdict.status == "unknown" and "exact test" in verdict.reason


def test_relu_s_idempotence_is_built_in():
    """What rules that drop a repeated relu rely on: the exact test knows it (exact.py)."""
    verdict = verify_rule(rule("(relu (relu ?x)) => (relu ?x)"), timeout_ms=1000)
    assert verdict.status == "tested"


def test_a_rule_the_axioms_cannot_express_is_tested_with_its_bound():
    verdict = verify_rule(rule("(reshape (reshape ?x :shape ?a) :shape ?b) => "
                               "(reshape ?x :shape ?b)"), timeout_ms=1000)
    assert verdict.status == "tested" and verdict.error_bound is not None
    assert verdict.error_bound < 1e-6 and "exact identity test" in verdict.evidence


def _real_functions(monkeypatch):
    """The random functions replaced by the real ones (in floats, read back as fractions)."""
    real = {"erf": math.erf, "tanh": math.tanh, "sqrt": math.sqrt}

    def elementwise(key, *xs):
        (x,) = xs
        return np.vectorize(lambda v: Fraction(real[key](float(v))), otypes=[object])(x)

    def softmax_rows(x, axis, guarded=False):
        moved = np.moveaxis(exact.to_floats(x), axis, -1)
        e = np.exp(moved - moved.max(axis=-1, keepdims=True))
        w = e / e.sum(axis=-1, keepdims=True)
        out = np.vectorize(Fraction, otypes=[object])(np.nan_to_num(w))
        return np.moveaxis(out, -1, axis)

    monkeypatch.setattr(exact, "elementwise", elementwise)
    monkeypatch.setattr(exact, "softmax_rows", softmax_rows)


def _fused_graphs():
    rng = np.random.default_rng(3)
    graphs = []
    for causal, mask, heads_kv in ((False, None, 4), (True, None, 2), (False, "float", 2),
                                   (False, "bool", 4)):
        b = GraphBuilder()
        q = b.input("q", (1, 4, 5, 8))
        k, v = (b.input(n, (1, heads_kv, 6, 8)) for n in ("k", "v"))
        args = [q, k, v]
        if mask == "float":
            m = np.where(rng.random((5, 6)) < 0.3, -np.inf, rng.standard_normal((5, 6)))
            m[:, 0] = 0.0  # every row keeps a key
            args.append(b.weight(m.astype(np.float32)))
        elif mask == "bool":
            keep = rng.random((5, 6)) < 0.7
            keep[:, 0] = True
            args.append(b.weight(keep))
        b.output(b.op("attention", *args, scale=0.3535533905932738, causal=causal), "y")
        graphs.append((f"attention causal={causal} mask={mask} kv_heads={heads_kv}", b.build()))
    for approximate in ("none", "tanh"):
        b = GraphBuilder()
        b.output(b.op("gelu", b.input("x", (3, 7)), approximate=approximate), "y")
        graphs.append((f"gelu {approximate}", b.build()))
    b = GraphBuilder()
    x = b.input("x", (2, 4, 3, 3))
    params = [b.weight(rng.standard_normal(4).astype(np.float32)) for _ in range(3)]
    var = b.weight((rng.random(4) + 0.5).astype(np.float32))
    b.output(b.op("batch_norm", x, *params, var, epsilon=1e-5), "y")
    graphs.append(("batch_norm", b.build()))
    return graphs


@pytest.mark.parametrize("index", range(7))
def test_fused_operator_definitions_match_their_references(index, monkeypatch):
    """The axioms the exact test rests on: attention (masks, the causal flag, grouped
    heads), GELU (both forms) and batch normalization, as the exact evaluator defines them,
    compute what graphsub's numpy references compute, once softmax, erf, tanh and the
    square root are the real functions."""
    name, graph = _fused_graphs()[index]
    _real_functions(monkeypatch)
    rng = np.random.default_rng(index)
    feeds = {graph[n].attrs["name"]: rng.standard_normal(graph[n].type.shape).astype(np.float32)
             for n in graph.inputs}
    want = evaluate(graph, feeds)["y"].astype(np.float64)
    got = exact.to_floats(exact_evaluate(graph, feeds)["y"])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=name)


def test_verify_names_each_rules_evidence(tmp_path):
    path = tmp_path / "two.rules"
    path.write_text("rule assoc: (add (add ?a ?b) ?c) => (add ?a (add ?b ?c))\n"
                    "rule flat: (reshape (reshape ?x :shape ?a) :shape ?b) => "
                    "(reshape ?x :shape ?b)\n")
    r = runner.invoke(app, ["verify", str(path), "--executor", "serial", "--json",
                            "--timeout-ms", "2000"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    evidence = {v["name"]: (v["status"], v["evidence"]) for v in data["rules"]}
    assert evidence["assoc"] == ("proven", "proof by Z3 from the operator axioms")
    assert evidence["flat"][0] == "tested" and "exact identity test" in evidence["flat"][1]
    assert data["proven"] == data["tested"] == 1


@pytest.mark.slow
def test_every_builtin_rule_is_proven_or_tested():
    """`graphsub verify` over the built-in library: no rule unknown, none refuted."""
    r = runner.invoke(app, ["verify", "--executor", "serial", "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["total"] == len(builtin_rules(check=False))
    assert data["unknown"] == data["refuted"] == 0, [
        (v["name"], v["reason"]) for v in data["rules"] if v["status"] not in ("proven", "tested")]
    assert all(v["error_bound"] < 1e-5 for v in data["rules"] if v["status"] == "tested")
