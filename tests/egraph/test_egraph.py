"""The e-graph's invariants, e-matching, multi-pattern rules and cycle filtering."""

from __future__ import annotations

import random

import numpy as np
import pytest

from graphsub import zoo
from graphsub.egraph.cycles import break_cycles, find_cycle
from graphsub.egraph.egraph import PROJ, EGraph, EGraphError, ENode, egraph_from_graph
from graphsub.egraph.ematch import SourceIndex
from graphsub.egraph.runner import Runner
from graphsub.ir import GraphBuilder
from graphsub.tensors.types import EMPTY_ATTRS, Attrs, Constant, TensorType
from graphsub.rules import builtin_rules, parse_rules

RULES = builtin_rules(check=False)
T = TensorType((4, 4))


def _leaf(eg: EGraph, i: int, weight: bool) -> int:
    if weight:
        return eg.add(ENode("weight", Attrs({"value": Constant(np.full((4, 4), i, np.float32))}),
                            ()), (T,))
    return eg.add(ENode("input", Attrs({"name": f"x{i}", "shape": (4, 4), "dtype": "float32"}),
                        ()), (T,))


@pytest.mark.parametrize("seed", range(12))
def test_invariants_hold_after_random_adds_and_unions(seed):
    """Congruence closure, a canonical hash-cons and consistent analyses after any sequence of
    adds, unions and rebuilds (EGraph.check), and unions are never lost."""
    rng = random.Random(seed)
    eg = EGraph()
    classes = [_leaf(eg, i, weight=i % 2 == 0) for i in range(5)]
    unions: list[tuple[int, int]] = []
    for step in range(200):
        r = rng.random()
        if r < 0.6:
            op = rng.choice(["add", "mul", "relu"])
            kids = [rng.choice(classes) for _ in range(1 if op == "relu" else 2)]
            classes += eg.add_op(op, None, kids)
        else:
            a, b = rng.choice(classes), rng.choice(classes)
            eg.union(a, b)
            unions.append((a, b))
        if step % 17 == 0 or step == 199:
            eg.rebuild()
            eg.check()
    for a, b in unions:
        assert eg.find(a) == eg.find(b)
    # Congruence: relu of two merged classes is one class.
    a, b = unions[0]
    ra, rb = eg.add_op("relu", None, [a])[0], eg.add_op("relu", None, [b])[0]
    eg.rebuild()
    assert eg.find(ra) == eg.find(rb)


def test_congruence_merges_readers_and_weight_only_propagates():
    eg = EGraph()
    x, w = _leaf(eg, 1, weight=False), _leaf(eg, 2, weight=True)
    rx, rw = eg.add_op("relu", None, [x])[0], eg.add_op("relu", None, [w])[0]
    top = eg.add_op("add", None, [rx, rx])[0]
    assert not eg[top].weight_only and eg[rw].weight_only
    eg.union(x, w)  # x is now known to equal a weight
    merged = eg.rebuild()
    eg.check()
    assert merged >= 1 and eg.find(rx) == eg.find(rw)
    assert eg[top].weight_only  # propagated through the readers


def test_union_of_different_types_is_refused():
    eg = EGraph()
    x = _leaf(eg, 1, weight=False)
    y = eg.add(ENode("input", Attrs({"name": "y", "shape": (2,), "dtype": "float32"}), ()),
               (TensorType((2,)),))
    with pytest.raises(EGraphError):
        eg.union(x, y)


def test_clone_is_independent():
    eg = egraph_from_graph(zoo.build("squeezenet")).egraph
    copy = eg.clone()
    before = (eg.num_nodes, eg.num_classes, eg.version)
    runner = Runner(copy, RULES)
    runner.iterate(range(len(RULES)))
    assert copy.num_nodes > before[0]
    assert (eg.num_nodes, eg.num_classes, eg.version) == before
    eg.check()
    copy.check()


def shared_input_matmuls():
    b = GraphBuilder(seed=0)
    x = b.input("x", (8, 16))
    y1 = b.matmul(x, b.he_weight((16, 32)))
    y2 = b.matmul(x, b.he_weight((16, 24)))
    b.output(y1, "y1")
    b.output(y2, "y2")
    return b.build()


def test_multi_pattern_rule_merges_two_matmuls_into_one_and_a_split():
    rule = next(r for r in RULES if r.name == "merge-matmuls-shared-input")
    enc = egraph_from_graph(shared_input_matmuls())
    eg = enc.egraph
    runner = Runner(eg, [rule])
    assert runner.iterate([0])
    eg.check()
    matmuls = list(eg.nodes_by_op("matmul"))
    assert len(matmuls) == 3  # symmetric: applied once per unordered pair, not twice
    merged = next(n for n in matmuls if eg[eg.node(n).children[1]].types == (TensorType((16, 56)),))
    splits = [n for n in eg.nodes_by_op("split") if eg.node(n).children == (eg.class_of(merged),)]
    assert len(splits) == 1
    split_class = eg.class_of(splits[0])
    # Both outputs of the target are unioned with their source roots, through projections.
    for i, out in enumerate(enc.outputs):
        projections = [eg.node(n) for n in eg.nodes_of(out) if eg.node(n).op == PROJ]
        assert projections == [ENode(PROJ, Attrs({"index": i}), (split_class,))]
    # The merged matmul reads x too, so it pairs with the others in the next iteration.
    assert any(eg.class_of(merged) in m.roots for m in runner.search([0]))


def test_efficient_cycle_filter_rejects_taso_figure_6():
    """X = A relu(A B): merging the two matmuls of A would make A B its own descendant."""
    b = GraphBuilder(seed=0)
    a = b.input("A", (16, 16))
    x = b.matmul(a, b.relu(b.matmul(a, b.he_weight((16, 16)))))
    b.output(x, "X")
    rule = next(r for r in RULES if r.name == "merge-matmuls-shared-input")
    runner = Runner(egraph_from_graph(b.build()).egraph, [rule])
    assert not runner.iterate([0])
    assert runner.stats.rejected["cycle (filtered)"] == 1  # one unordered pair (symmetric)
    assert find_cycle(runner.egraph) is None


def test_cycles_that_slip_through_are_broken_by_blacklisting_the_newest_node():
    from graphsub.egraph.ematch import SourceIndex
    from graphsub.egraph.rewrite import apply_ematch
    from collections import Counter

    b = GraphBuilder(seed=0)
    a = b.input("A", (16, 16))
    x = b.matmul(a, b.relu(b.matmul(a, b.he_weight((16, 16)))))
    b.output(x, "X")
    eg = egraph_from_graph(b.build()).egraph
    original = set(range(eg.num_nodes))
    rule = next(r for r in RULES if r.name == "merge-matmuls-shared-input")
    match = SourceIndex(rule).search(eg, None)[0]
    assert apply_ematch(eg, match, 0, Counter())  # no filter: the cycle gets in
    eg.rebuild()
    cycle = find_cycle(eg)
    assert cycle is not None and not set(cycle) <= original
    removed = break_cycles(eg)
    assert removed >= 1 and find_cycle(eg) is None
    assert not eg.blacklist & original  # the input graph stays extractable


def test_semi_naive_saturation_leaves_nothing_for_a_full_search():
    """After semi-naive iterations saturate, a from-scratch search of every rule finds no
    match that changes the e-graph."""
    single = [r for r in RULES if len(r.sources) == 1]
    enc = egraph_from_graph(zoo.build("squeezenet"))
    runner = Runner(enc.egraph, single, node_limit=20_000)
    for _ in range(30):
        if not runner.iterate(range(len(single))):
            break
    else:
        pytest.fail("squeezenet did not saturate in 30 iterations")
    eg = enc.egraph
    assert runner.stats.applications > 0
    version = eg.version
    fresh = Runner(eg, single, node_limit=20_000)
    assert not fresh.iterate(range(len(single)))
    assert eg.version == version


def test_conditions_read_class_analyses():
    """`where (weight ?w)` holds on a class that is weight-only only after a union."""
    (rule,) = parse_rules("""
rule relu-of-weight: (relu ?w) => (relu (relu ?w)) where (weight ?w)
""")
    eg = EGraph()
    x, w = _leaf(eg, 1, weight=False), _leaf(eg, 2, weight=True)
    eg.add_op("relu", None, [x])
    ix = SourceIndex(rule)
    assert ix.search(eg, None) == []
    eg.union(x, w)
    eg.rebuild()
    assert len(SourceIndex(rule).search(eg, None)) == 1


def test_add_op_refuses_shapes_that_do_not_fit():
    from graphsub.errors import ShapeError

    eg = EGraph()
    x = _leaf(eg, 1, weight=False)
    y = eg.add(ENode("input", Attrs({"name": "y", "shape": (3, 5), "dtype": "float32"}), ()),
               (TensorType((3, 5)),))
    with pytest.raises(ShapeError):
        eg.add_op("matmul", EMPTY_ATTRS, [x, y])


def test_a_new_match_is_joined_with_old_matches_of_the_other_source():
    """Semi-naive multi-pattern search: a matmul added next to an old one (whose class did not
    change) pairs with it in the next search, though only one of the two is new."""
    rule = next(r for r in RULES if r.name == "merge-matmuls-shared-input")
    b = GraphBuilder(seed=0)
    x = b.input("x", (4, 16))
    w2 = b.input("w2", (16, 8))
    b.output(b.matmul(x, b.input("w1", (16, 8))), "y1")
    b.output(b.relu(w2), "y2")
    enc = egraph_from_graph(b.build())
    eg = enc.egraph
    runner = Runner(eg, [rule])
    assert runner.search([0]) == []  # one matmul: nothing to pair
    x_class, w2_class = enc.inputs[0], enc.inputs[1]
    (new,) = eg.add_op("matmul", None, [x_class, w2_class])
    eg.rebuild()
    (match,) = runner.search([0])
    assert new in match.roots and enc.outputs[0] in {eg.find(r) for r in match.roots}
