"""Graph structure: inference on construction, topological order, DCE, cycles, copy-on-write."""

from __future__ import annotations

import numpy as np
import pytest

from graphsub.errors import CycleError, GraphsubError, OpAttributeError, ShapeError
from graphsub.ir import Graph, GraphBuilder, Node, TensorType, Value
from graphsub.runtime import evaluate


def small_graph():
    b = GraphBuilder(seed=1)
    x = b.input("x", (2, 4))
    w1, w2 = b.he_weight((4, 4)), b.he_weight((4, 4))
    h = b.relu(b.matmul(x, w1))
    y = b.add(b.matmul(h, w2), x)
    b.output(y, "y")
    return b.build()


def test_types_are_inferred_when_nodes_are_made():
    g = small_graph()
    (out,) = g.outputs
    assert g.type_of(out) == TensorType((2, 4), "float32")


def test_builder_rejects_mismatched_shapes_with_a_clear_message():
    b = GraphBuilder()
    x = b.input("x", (2, 3))
    with pytest.raises(ShapeError, match=r"matmul: inner dimensions differ: \(2, 3\) @ \(4, 5\)"):
        b.matmul(x, b.he_weight((4, 5)))
    with pytest.raises(OpAttributeError, match="unknown attribute"):
        b.relu(x, slope=2)
    with pytest.raises(OpAttributeError, match="'perm' is required"):
        b.transpose(x)
    with pytest.raises(GraphsubError, match="defined twice"):
        b.input("x", (1,))
    with pytest.raises(AttributeError, match="no method or operator 'frobnicate'"):
        b.frobnicate(x)


def test_topological_order_puts_producers_first():
    g = small_graph()
    order = g.topo_order()
    pos = {nid: i for i, nid in enumerate(order)}
    for nid in order:
        for v in g[nid].inputs:
            assert pos[v.node] < pos[nid]
    assert set(order) == set(g.nodes)


def test_dce_removes_nodes_no_output_needs():
    b = GraphBuilder()
    x = b.input("x", (3,))
    b.exp(x)  # dead
    b.output(b.relu(x), "y")
    g = b.build()
    assert sorted(n.op for n in g.nodes.values()) == ["input", "relu"]


def test_unused_graph_inputs_are_kept():
    b = GraphBuilder()
    x = b.input("x", (3,))
    b.input("unused", (2,))
    b.output(b.relu(x), "y")
    assert b.build().input_names == ("x", "unused")


def test_cycle_is_detected_and_named():
    t = TensorType((2,))
    from graphsub.tensors.types import Attrs

    inp = Node("input", Attrs({"name": "x", "shape": (2,), "dtype": "float32"}), (), (t,))
    a = Node("add", Attrs(), (Value(0), Value(2)), (t,))
    r = Node("relu", Attrs(), (Value(1),), (t,))
    with pytest.raises(CycleError, match="cycle: .*add#1.*relu#2|cycle: .*relu#2.*add#1"):
        Graph({0: inp, 1: a, 2: r}, [0], [Value(2)], ["y"])


def test_dangling_reference_is_an_error():
    t = TensorType((2,))
    from graphsub.tensors.types import Attrs

    r = Node("relu", Attrs(), (Value(7),), (t,))
    with pytest.raises(GraphsubError, match="does not exist"):
        Graph({0: r}, [], [Value(0)], ["y"])


def test_edit_is_copy_on_write_and_shares_unchanged_nodes():
    g = small_graph()
    relu_id = g.nodes_by_op("relu")[0]
    ed = g.edit()
    (sig,) = ed.add("sigmoid", [g[relu_id].inputs[0]])
    ed.replace_uses(Value(relu_id), sig)
    g2 = ed.finish()
    # The original is untouched.
    assert g.nodes_by_op("relu") == [relu_id] and not g.nodes_by_op("sigmoid")
    # The new graph shares every node the edit did not touch (same objects).
    changed = {relu_id} | {u for u, _ in g.users()[relu_id]}
    for nid, node in g.nodes.items():
        if nid not in changed:
            assert g2[nid] is node
    assert relu_id not in g2  # dead after the replacement
    assert g2.nodes_by_op("sigmoid")
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    assert not np.allclose(evaluate(g, {"x": x})["y"], evaluate(g2, {"x": x})["y"])


def test_a_new_node_repointed_to_a_later_new_node_is_placed_after_it():
    """replace_uses re-points new readers too, so a node made early in an edit can end up
    reading one made later (a rule target that reads the value it replaces did this): the
    edited graph must still be ordered, as the full path orders it."""
    g = small_graph()
    relu_id = g.nodes_by_op("relu")[0]
    (y,) = g.outputs
    ed = g.edit()
    (early,) = ed.add("tanh", [Value(relu_id)])           # reads the value about to be replaced
    (late,) = ed.add("sigmoid", [g[relu_id].inputs[0]])
    ed.replace_uses(Value(relu_id), late)                 # early now reads late
    ed.replace_uses(y, early)                             # ... and is what the graph returns
    g2 = ed.finish()
    assert g2.delta is not None  # the local path handled it
    assert g2[early.node].inputs == (late,)
    pos = g2.delta.position
    assert all(pos(v.node) < pos(nid) for nid in g2.delta.changed for v in g2[nid].inputs)
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    full = Graph(g2.nodes, g2.inputs, g2.outputs, g2.output_names)
    np.testing.assert_allclose(evaluate(g2, {"x": x})["y"], evaluate(full, {"x": x})["y"])


def test_replacement_must_keep_the_type():
    g = small_graph()
    relu_id = g.nodes_by_op("relu")[0]
    ed = g.edit()
    (t,) = ed.add("transpose", [Value(relu_id)], {"perm": (1, 0)})
    with pytest.raises(ShapeError, match="types differ"):
        ed.replace_uses(Value(relu_id), t)


def test_edit_that_creates_a_cycle_is_rejected():
    g = small_graph()
    (add_id,) = g.nodes_by_op("add")
    ed = g.edit()
    # The first matmul's readers now read the output, which depends on them: TASO figure 6.
    (mm1,) = [nid for nid in g.nodes_by_op("matmul") if g[nid].inputs[0].node == g.inputs[0]]
    ed.replace_uses(Value(mm1), Value(add_id))
    with pytest.raises(CycleError):
        ed.finish()


def test_weight_only_nodes():
    b = GraphBuilder()
    x = b.input("x", (2, 3))
    w = b.he_weight((4, 3))
    wt = b.transpose(w, perm=(1, 0))  # weight-only
    b.output(b.matmul(x, wt), "y")
    g = b.build()
    wo = g.weight_only()
    assert {g[n].op for n in wo} == {"weight", "transpose"}


def test_constant_is_immutable_and_compared_by_content():
    from graphsub.tensors.types import Constant

    arr = np.arange(6, dtype=np.float32)
    c = Constant(arr)
    arr[0] = 100  # the caller's array is not shared
    assert c.array[0] == 0
    with pytest.raises(ValueError):
        c.array[0] = 1
    assert Constant(np.arange(6, dtype=np.float32)) == c
    assert Constant(np.arange(6, dtype=np.int64)) != c


def test_cse_merges_repeated_computations_and_equal_weights():
    from graphsub.ir import GraphBuilder

    b = GraphBuilder(seed=0)
    x = b.input("x", (4, 8))
    w = np.ones((8, 8), np.float32)
    r1, r2 = b.reshape(x, shape=(32,)), b.reshape(x, shape=(32,))  # the same reshape twice
    y1 = b.matmul(b.reshape(r1, shape=(4, 8)), b.weight(w))
    y2 = b.matmul(b.reshape(r2, shape=(4, 8)), b.weight(w.copy()))  # equal content
    b.output(b.add(y1, y2), "y")
    g = b.build()
    c = g.cse()
    assert len(c) == len(g) - 4
    assert len(c.nodes_by_op("reshape")) == 2 and len(c.nodes_by_op("weight")) == 1
    feeds = {"x": np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)}
    np.testing.assert_allclose(evaluate(c, feeds)["y"], evaluate(g, feeds)["y"])
    assert c.cse() is c


def test_weight_nodes_are_not_kept_alive_by_the_inference_cache():
    """The inference cache is keyed by attributes; a weight's attributes are its data, so
    caching them kept every weight ever made alive (operator timing makes thousands)."""
    import numpy as np

    from graphsub.ir import graph as graph_module
    from graphsub.ir.graph import make_node
    from graphsub.tensors.types import Constant

    make_node("weight", (), (), {"value": Constant(np.ones((64, 64), np.float32))})
    assert not any(key[0] == "weight" for key in graph_module._INFERRED)


def test_the_inference_cache_stays_small_in_a_process_that_makes_many_nodes():
    """A long-lived process (a notebook, the fuzzer's workers) makes ever new operator
    signatures; the cache must not grow with them, or every full garbage collection walks it
    (at 200,000 entries, 1.5-2 s: searches overran 0.5 s limits). It holds what one search
    needs: 15 s of MCTS on Inception-v3 with TASO's rules makes about 1,100 entries."""
    from graphsub.ir import graph as graph_module
    from graphsub.ir.graph import make_node
    from graphsub.tensors.types import TensorType

    assert graph_module._INFERRED_MAX <= 10_000, "a full collection walks every entry"
    for n in range(1, 3 * graph_module._INFERRED_MAX):
        make_node("relu", (), (TensorType((n,), "float32"),))
    assert len(graph_module._INFERRED) <= graph_module._INFERRED_MAX


def test_a_cached_shape_error_keeps_nothing_of_its_raisers_alive():
    """make_node caches inference failures; raising the cached instance itself would attach
    the raiser's frames to it, keeping a search's graphs alive (found by the fuzzer's runs)."""
    import gc
    import weakref

    from graphsub.errors import GraphsubError
    from graphsub.ir.graph import Value, make_node
    from graphsub.tensors.types import TensorType

    class State:
        pass

    def step() -> weakref.ref:
        state = State()
        with pytest.raises(GraphsubError):
            make_node("matmul", [Value(0), Value(1)],
                      [TensorType((2, 3), "float32"), TensorType((4, 5), "float32")])
        return weakref.ref(state)

    step()  # the first failure is cached
    ref = step()  # the second is raised from the cache
    gc.collect()
    assert ref() is None
