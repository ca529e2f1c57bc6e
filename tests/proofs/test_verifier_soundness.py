"""What "proven" and "tested" rest on: no silent attribute wildcards, one decision for a rule no
check can instantiate, draws that tell shape- and domain-dependent rules, exact close-to and
wrapping integers. Each test is a hole a wrong rule got through, closed."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from graphsub.ir.builder import GraphBuilder
from graphsub.ops.base import REQUIRED, all_ops
from graphsub.proofs import prove, verify_rule
from graphsub.proofs.exact import exact_evaluate, integer_range
from graphsub.rules import find_matches, parse_rules
from graphsub.rules.check import RuleCheckError, check_rule
from graphsub.rules.parser import RuleSyntaxError


def rule(text: str):
    (r,) = parse_rules(f"rule r: {text}")
    return r


def _conv(dilation: tuple[int, int]):
    b = GraphBuilder(seed=0)
    x = b.input("x", (1, 4, 6, 6))
    w = b.weight(np.ones((4, 4, 3, 3), np.float32))
    b.output(b.op("relu", b.op("conv2d", x, w, dilation=dilation, padding="same")), "y")
    return b.build()


def test_an_unwritten_attribute_matches_only_its_default():
    unwritten = rule("(relu (conv2d ?x ?w)) => (conv2d ?x ?w :activation relu)")
    bound = rule("(relu (conv2d ?x ?w :dilation ?d)) => (conv2d ?x ?w :dilation ?d :activation relu)")
    assert find_matches(_conv((1, 1)), unwritten)
    assert not find_matches(_conv((2, 2)), unwritten)
    assert find_matches(_conv((2, 2)), bound)


def test_a_source_must_write_what_its_operator_requires():
    with pytest.raises(RuleSyntaxError, match="leaves shape unwritten"):
        rule("(reshape (reshape ?x) :shape ?s) => (reshape ?x :shape ?s)")


def test_a_rule_that_drops_a_bound_attribute_is_refuted():
    dropped = rule("(relu (conv2d ?x ?w :dilation ?d)) => (conv2d ?x ?w :activation relu)")
    assert verify_rule(dropped, timeout_ms=2000).status in ("refuted", "unknown")
    gelu = rule("(gelu ?x :approximate ?a) => (gelu ?x)")
    assert verify_rule(gelu, timeout_ms=2000).status in ("refuted", "unknown")


#: Operators no rule writes (graph sources, opaque and generated nodes, the sizes and causal
#: masks an importer reads a model's own computations as) and attributes the inputs determine
#: (a packed weight's sizes, which input slot is which), with why.
_STRUCTURAL = {"input", "weight", "opaque", "fused", "sizes", "causal_mask"}
_DETERMINED = {("conv_integer", "slots"), ("matmul_integer", "slots"),
               ("matmul_nbits", "K"), ("matmul_nbits", "N"), ("matmul_nbits", "bits"),
               ("matmul_nbits", "block_size"), ("matmul_nbits", "slots"),
               ("rotary_embedding", "rotary_embedding_dim"), ("rotary_embedding", "num_heads")}


def test_every_attribute_a_rule_can_bind_has_values_the_checks_draw():
    missing = [(name, spec.name) for name, op in all_ops().items() if name not in _STRUCTURAL
               for spec in op.attrs
               if (name, spec.name) not in _DETERMINED and not callable(spec.tries)
               and len(spec.tries) < (1 if spec.default is REQUIRED else 2)]
    assert missing == []


def test_z3_reads_every_axis_of_a_permutation():
    leading = rule("(transpose ?x :perm [1 0 3 2]) => (transpose ?x :perm [0 1 3 2])")
    ok, why = prove(leading, timeout_ms=2000)
    assert not ok and "last two axes alone" in why
    assert verify_rule(leading, timeout_ms=2000).status == "refuted"


def test_z3_refuses_an_attribute_it_does_not_model():
    include_pad = rule("(avg_pool2d ?x :kernel [3 3] :stride [1 1] :padding same "
                       ":count_include_pad true) => (avg_pool2d ?x :kernel [3 3] :stride [1 1] "
                       ":padding same)")
    ok, why = prove(include_pad, timeout_ms=2000)
    assert not ok and "count_include_pad" in why


def test_a_pool_left_at_its_own_stride_is_not_a_stride_of_one():
    pool = rule("(avg_pool2d ?x :kernel [2 2]) => (avg_pool2d ?x :kernel [2 2] :stride [1 1])")
    assert not prove(pool, timeout_ms=2000)[0]


def test_a_rule_no_check_can_instantiate_is_unknown_even_where_z3_proves_it():
    impossible = rule("(relu ?x) => (relu ?x) where (eq (rank ?x) 9)")
    assert prove(impossible, timeout_ms=2000)[0]
    verdict = verify_rule(impossible, timeout_ms=2000)
    assert verdict.status == "unknown" and "could not be tested" in verdict.reason
    with pytest.raises(RuleCheckError, match="could not be tested"):
        check_rule(impossible)


@pytest.mark.parametrize("text", [
    "(div (mul ?x ?y) ?y) => ?x",                # y = 0: nan against x
    "(mul (sqrt ?x) (sqrt ?x)) => ?x",           # x < 0: nan against x
    "(log (mul ?x ?y)) => (add (log ?x) (log ?y))",  # x, y < 0: a number against nan
])
def test_divisors_roots_and_logs_are_drawn_at_their_domains_edges(text):
    assert verify_rule(rule(text), timeout_ms=2000).status == "refuted"


def test_a_rule_right_only_away_from_zero_says_so():
    away_from_zero = "(div (mul ?x ?y) ?y) => ?x where (nonzero ?y), (eq (shape ?y) (shape ?x))"
    # ... and in floating point: an int8 or uint8 product wraps before the quotient
    assert verify_rule(rule(away_from_zero), timeout_ms=2000).status == "refuted"
    guarded = rule(f"{away_from_zero}, (in (dtype ?x) float16 bfloat16 float32 float64)")
    assert verify_rule(guarded, timeout_ms=2000).status in ("proven", "tested")


def test_odd_sizes_and_batches_tell_shape_dependent_rules():
    # the two leading axes swapped, written as a reshape: equal only where one of them is 1
    as_reshape = rule("(transpose ?x :perm [1 0 2 3]) => (reshape ?x :shape [(dim ?x 1) "
                      "(dim ?x 0) (dim ?x 2) (dim ?x 3)])")
    assert verify_rule(as_reshape, timeout_ms=2000).status == "refuted"


def test_sides_of_different_shapes_are_wrong_even_where_they_broadcast():
    broadcast = rule("(add ?x ?y) => (add ?x (reshape ?y :shape [(dim ?y 0) 1 (dim ?y 1)]))"
                     " where (eq (rank ?y) 2)")
    assert verify_rule(broadcast, timeout_ms=2000).status == "refuted"


def _constant_graph(value: float, dtype: str):
    b = GraphBuilder(seed=0)
    x = b.input("x", (4,), dtype)
    b.output(b.op("mul", x, b.weight(np.full((4,), value, dtype))), "y")
    return b.build()


def test_close_to_matches_only_the_value_its_dtype_stores():
    slack = rule("(mul ?x ?c) => ?x where (close-to ?c 1.0)")
    assert find_matches(_constant_graph(1.0, "float16"), slack)
    assert not find_matches(_constant_graph(1.0039, "float16"), slack)
    gelu_constant = rule("(mul ?x ?c) => (mul ?x ?c) where (close-to ?c 0.7071067811865476)")
    assert find_matches(_constant_graph(0.7071067811865476, "float16"), gelu_constant)
    assert find_matches(_constant_graph(0.7071067811865476, "float32"), gelu_constant)


def test_integers_wrap_exactly():
    assert integer_range("uint32") == (0, 2 ** 32 - 1) and integer_range("float32") is None
    b = GraphBuilder(seed=0)
    x, y = b.input("x", (1,), "uint32"), b.input("y", (1,), "uint32")
    b.output(b.op("sub", x, y), "d")
    out = exact_evaluate(b.build(), {"x": np.array([2], np.uint32), "y": np.array([3], np.uint32)})
    assert out["d"][0] != Fraction(-1)  # a uint32 difference does not go below zero
