"""Structural hash: invariant to node ids and insertion order, sensitive to every change."""

from __future__ import annotations

import numpy as np
import pytest

from graphsub.ir import Graph, GraphBuilder, Value


def build(variant: str = "", order: str = "forward"):
    """Two convolutions of x combined by add, with weights whose insertion order can be swapped;
    `variant` introduces one single change."""
    b = GraphBuilder(seed=0)
    x = b.input("x", (1, 4, 8, 8) if variant != "shape" else (1, 4, 8, 9))
    w_data = np.random.default_rng(1).standard_normal((4, 4, 3, 3)).astype(np.float32)
    v_data = np.random.default_rng(2).standard_normal((4, 4, 1, 1)).astype(np.float32)
    if variant == "weight":
        w_data = w_data.copy()
        w_data[0, 0, 0, 0] += 1e-3
    if order == "forward":
        w, v = b.weight(w_data), b.weight(v_data)
    else:
        v, w = b.weight(v_data), b.weight(w_data)
    a = b.conv2d(x, w, stride=2 if variant == "attr" else 1, activation="relu")
    c = b.conv2d(x, v, stride=2 if variant == "attr" else 1)
    r = b.relu(a if variant == "edge" else c)  # "edge": one input edge moved
    y = b.add(a, r) if variant != "op" else b.mul(a, r)
    b.output(y, "y")
    return b.build()


def renumber(g: Graph, offset: int = 1000, reverse: bool = True) -> Graph:
    ids = list(g.nodes)
    mapping = {old: offset + (len(ids) - i if reverse else i) for i, old in enumerate(ids)}
    def mv(v): return Value(mapping[v.node], v.index)
    nodes = {}
    for old, n in g.nodes.items():
        nodes[mapping[old]] = type(n)(n.op, n.attrs, tuple(mv(v) for v in n.inputs), n.outputs, n.name)
    return Graph(nodes, [mapping[i] for i in g.inputs], [mv(v) for v in g.outputs], g.output_names)


def test_hash_is_invariant_to_node_ids():
    g = build()
    assert renumber(g).structural_hash() == g.structural_hash()


def test_hash_is_invariant_to_insertion_order():
    assert build(order="forward").structural_hash() == build(order="reverse").structural_hash()


@pytest.mark.parametrize("variant", ["op", "attr", "shape", "weight", "edge"])
def test_any_single_change_changes_the_hash(variant):
    assert build(variant).structural_hash() != build().structural_hash()


def test_swapping_operands_of_a_non_commutative_op_changes_the_hash():
    b1, b2 = GraphBuilder(), GraphBuilder()
    for b, flip in ((b1, False), (b2, True)):
        x = b.input("x", (3,))
        z = b.input("z", (3,))
        b.output(b.sub(z, x) if flip else b.sub(x, z), "y")
    assert b1.build().structural_hash() != b2.build().structural_hash()


def test_output_index_is_part_of_the_edge():
    hashes = set()
    for idx in (0, 1):
        b = GraphBuilder()
        x = b.input("x", (4,))
        parts = b.split(x, axis=0, sizes=(2, 2))
        b.output(b.relu(parts[idx]), "y")
        hashes.add(b.build().structural_hash())
    assert len(hashes) == 2
