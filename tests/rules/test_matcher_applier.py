"""The matcher finds exactly the expected matches; the applier rewrites them and rejects the
ones TASO and MetaFlow say must be rejected."""

from __future__ import annotations

import numpy as np

from graphsub.ir import GraphBuilder, Value
from graphsub.rules import apply_match, builtin_rules, find_matches, parse_rules
from graphsub.rules.applier import TYPES_DIFFER, Rejection
from graphsub.runtime import evaluate, graph_input_specs, random_feeds

RULES = {r.name: r for r in builtin_rules(check=False)}


def same_outputs(a, b):
    feeds = random_feeds(graph_input_specs(a), seed=1)
    ra, rb = evaluate(a, feeds), evaluate(b, feeds)
    for k in ra:
        np.testing.assert_allclose(ra[k], rb[k], rtol=1e-4, atol=1e-5)


def matmuls(n_shared: int, other: bool = True):
    b = GraphBuilder(seed=0)
    x = b.input("x", (2, 8))
    y = b.input("y", (2, 8))
    outs = [b.matmul(x, b.he_weight((8, 4 + i))) for i in range(n_shared)]
    if other:
        outs.append(b.matmul(y, b.he_weight((8, 3))))
    for i, o in enumerate(outs):
        b.output(o, f"o{i}")
    return b.build()


def test_multi_root_matches_join_on_the_shared_input_and_each_pair_once():
    g = matmuls(2)
    ms = find_matches(g, RULES["merge-matmuls-shared-input"])
    assert len(ms) == 1
    x_id = g.inputs[0]
    assert all(g[r.node].inputs[0] == Value(x_id) for r in ms[0].roots)
    assert len(find_matches(matmuls(3), RULES["merge-matmuls-shared-input"])) == 3
    assert find_matches(matmuls(1), RULES["merge-matmuls-shared-input"]) == []


def test_applying_the_merge_gives_one_matmul_and_a_split_with_the_same_outputs():
    g = matmuls(2, other=False)
    (m,) = find_matches(g, RULES["merge-matmuls-shared-input"])
    g2 = apply_match(g, m)
    assert len(g2.nodes_by_op("matmul")) == 1 and len(g2.nodes_by_op("split")) == 1
    assert g2.nodes_by_op("concat")[0] in g2.weight_only()
    same_outputs(g, g2)


def test_attribute_constraints_must_hold():
    b = GraphBuilder()
    x = b.input("x", (1, 4, 8, 8))
    b.output(b.conv2d(x, b.he_weight((4, 4, 3, 3)), stride=1), "a")
    b.output(b.conv2d(x, b.he_weight((4, 4, 3, 3)), stride=2), "b")
    assert find_matches(b.build(), RULES["merge-convs-shared-input"]) == []


def test_commutative_ops_match_in_either_operand_order():
    b = GraphBuilder()
    x = b.input("x", (1, 4, 6, 6))
    conv = b.conv2d(x, b.he_weight((4, 4, 3, 3)))
    b.output(b.add(b.weight(np.ones((1, 4, 1, 1), np.float32)), conv), "y")  # bias first
    g = b.build()
    (m,) = find_matches(g, RULES["conv-add-bias"])
    g2 = apply_match(g, m)
    assert [g2[n].op for n in g2.topo_order() if g2[n].op not in ("input", "weight", "reshape")] == ["conv2d"]
    same_outputs(g, g2)


def test_multi_output_rule_split_of_concat():
    b = GraphBuilder()
    p, q = b.input("p", (2, 3)), b.input("q", (2, 5))
    s0, s1 = b.split(b.concat(p, q, axis=1), axis=1, sizes=(3, 5))
    b.output(b.relu(s0), "a")
    b.output(b.exp(s1), "b")
    g = b.build()
    (m,) = find_matches(g, RULES["split-of-concat"])
    g2 = apply_match(g, m)
    assert not g2.nodes_by_op("split") and not g2.nodes_by_op("concat")
    same_outputs(g, g2)
    # sizes that do not sit on the seam do not match
    b = GraphBuilder()
    p, q = b.input("p", (2, 3)), b.input("q", (2, 5))
    s0, s1 = b.split(b.concat(p, q, axis=1), axis=1, sizes=(4, 4))
    b.output(s0, "a")
    b.output(s1, "b")
    assert find_matches(b.build(), RULES["split-of-concat"]) == []


def test_figure_6_cycle_is_rejected():
    """TASO figure 6: A x relu(A x B). Merging the two matmuls that share A would make the
    second depend on itself."""
    b = GraphBuilder()
    a = b.input("A", (4, 4))
    inner = b.matmul(a, b.input("B", (4, 4)))
    b.output(b.matmul(a, b.relu(inner)), "X")
    g = b.build()
    (m,) = find_matches(g, RULES["merge-matmuls-shared-input"]) or [None]
    assert apply_match(g, m) == Rejection("cycle")


def test_unmapped_external_use_is_rejected():
    b = GraphBuilder()
    a, bb, c = (b.input(n, (4, 4)) for n in "abc")
    bc = b.matmul(bb, c)
    b.output(b.matmul(a, bc), "y")
    b.output(bc, "bc")  # the inner product is needed elsewhere
    g = b.build()
    (m,) = find_matches(g, RULES["matmul-assoc-left"])
    assert apply_match(g, m) == Rejection("unmapped output")
    b2 = GraphBuilder()
    a, bb, c = (b2.input(n, (4, 4)) for n in "abc")
    inner = b2.matmul(bb, c)
    b2.output(b2.matmul(a, inner), "y")
    b2.output(b2.relu(inner), "r")  # read by a node outside the match
    g2 = b2.build()
    (m2,) = find_matches(g2, RULES["matmul-assoc-left"])
    assert apply_match(g2, m2) == Rejection("unmapped external use")


def test_target_with_another_type_is_rejected():
    (rule,) = parse_rules("rule shape-changer: (relu ?x) => (transpose ?x :perm [1 0])")
    b = GraphBuilder()
    b.output(b.relu(b.input("x", (2, 3))), "y")
    g = b.build()
    (m,) = find_matches(g, rule)
    assert apply_match(g, m) == Rejection(TYPES_DIFFER)


def test_dead_nodes_are_removed_after_a_rewrite():
    b = GraphBuilder()
    x = b.input("x", (3, 3))
    b.output(b.identity(b.identity(x)), "y")
    g = b.build()
    (m, _) = find_matches(g, RULES["remove-identity"])
    g2 = apply_match(g, m)
    assert len(g2) == len(g) - 1


def test_a_squeeze_undone_by_an_unsqueeze_goes():
    """silero's LSTM state: squeezed at 0 after the LSTM, unsqueezed at 0 again before the
    concatenation of the new state (fold-squeeze-unsqueeze); axes that differ stay."""
    b = GraphBuilder()
    x = b.input("x", (1, 2, 8))
    same = b.unsqueeze(b.squeeze(x, axes=(0,)), axes=(0,))
    moved = b.unsqueeze(b.squeeze(x, axes=(0,)), axes=(1,))
    b.output(b.add(same, b.reshape(moved, shape=(1, 2, 8))), "y")
    g = b.build()
    rule = {r.name: r for r in builtin_rules()}["fold-squeeze-unsqueeze"]
    (match,) = find_matches(g, rule)
    out = apply_match(g, match)
    assert not isinstance(out, Rejection)
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 2, 8)).astype(np.float32)}
    np.testing.assert_array_equal(evaluate(out, feeds)["y"], evaluate(g, feeds)["y"])
    assert len(out.nodes_by_op("unsqueeze")) == 1
