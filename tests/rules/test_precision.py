"""Half precision and casts: rules over Cast where exact, no rewrite that computes in another
precision, and tolerances that scale with the precision a model computes in."""

from __future__ import annotations

import numpy as np
import pytest

from graphsub.ir import GraphBuilder
from graphsub.rules import apply_match, builtin_rules, find_matches, parse_rules
from graphsub.rules.applier import PRECISION_CHANGED, Rejection
from graphsub.rules.expr import exact_cast
from graphsub.runtime import evaluate, graph_input_specs, random_feeds
from graphsub.verdicts.equivalence import SAME_FUNCTION, Tolerance, value_dtypes

RULES = {r.name: r for r in builtin_rules()}


def rewrite_once(graph, rule):
    matches = find_matches(graph, rule)
    assert matches, f"{rule.name} does not match"
    return apply_match(graph, matches[0])


def mixed_precision_graph():
    """The islands onnxconverter-common leaves: float16 data widened for a float32 op and
    narrowed back, then a cast to float16 of what already is float16."""
    b = GraphBuilder(seed=0)
    x = b.input("x", (4, 8), "float16")
    wide = b.op("cast", x, to="float32")
    back = b.op("cast", wide, to="float16")
    again = b.op("cast", back, to="float16")
    b.output(b.relu(again), "y")
    return b.build()


def test_exact_casts_are_the_widening_ones():
    assert exact_cast("float16", "float32") and exact_cast("int8", "float16")
    assert exact_cast("float32", "float32")
    assert not exact_cast("float32", "float16") and not exact_cast("int32", "float32")
    assert not exact_cast("float16", "bfloat16")


@pytest.mark.parametrize("name", ["cast-round-trip", "remove-noop-cast"])
def test_cast_rules_remove_exact_round_trips_in_float16(name):
    graph = mixed_precision_graph()
    after = rewrite_once(graph, RULES[name])
    assert not isinstance(after, Rejection)
    assert len(after.nodes_by_op("cast")) < len(graph.nodes_by_op("cast"))
    feeds = random_feeds(graph_input_specs(graph), seed=1)
    np.testing.assert_array_equal(evaluate(graph, feeds)["y"], evaluate(after, feeds)["y"])


def test_narrowing_then_widening_is_not_a_round_trip():
    b = GraphBuilder(seed=0)
    x = b.input("x", (4, 8))
    b.output(b.op("cast", b.op("cast", x, to="float16"), to="float32"), "y")
    graph = b.build()
    assert not find_matches(graph, RULES["cast-round-trip"])


def test_a_rewrite_that_would_compute_in_another_precision_is_refused():
    """Adding in float16 what the source added in float32 loses precision: the applier
    refuses it for float32 operands, and allows the same rule where nothing changes."""
    (narrowing,) = parse_rules("rule cast-into-add: (cast (add ?a ?b) :to ?t) "
                               "=> (add (cast ?a :to ?t) (cast ?b :to ?t))")
    b = GraphBuilder(seed=0)
    a, c = b.input("a", (4, 8)), b.input("c", (4, 8))
    b.output(b.op("cast", b.add(a, c), to="float16"), "y")
    result = rewrite_once(b.build(), narrowing)
    assert isinstance(result, Rejection) and result.reason == PRECISION_CHANGED
    b = GraphBuilder(seed=0)
    a, c = b.input("a", (4, 8), "float16"), b.input("c", (4, 8), "float16")
    b.output(b.op("cast", b.add(a, c), to="float16"), "y")
    assert not isinstance(rewrite_once(b.build(), narrowing), Rejection)


def test_tolerance_scales_with_the_half_precision_a_model_computes_in():
    assert SAME_FUNCTION.for_precision({"float32", "int64"}) == SAME_FUNCTION
    half = SAME_FUNCTION.for_precision(value_dtypes(mixed_precision_graph()))
    assert half.rtol > SAME_FUNCTION.rtol and half.atol_scale > SAME_FUNCTION.atol_scale
    assert half.rtol == pytest.approx(4 * 2.0**-10)
    bf16 = SAME_FUNCTION.for_precision({"bfloat16"})
    assert bf16.rtol > half.rtol
    assert isinstance(half, Tolerance)
