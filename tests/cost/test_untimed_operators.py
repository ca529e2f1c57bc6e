"""Operators the measured cost model times on a target: opaque ones with the shapes and
indices they really read, and any that cannot be timed priced analytically with a note, so
that one operator never ends a run (a Llama export's Expand once crashed `optimize`; Expand is
graphsub's expand now, and Tile, which graphsub does not model, stands for such operators)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphsub
from graphsub.targets import get_target
from graphsub.cost import MeasuredCostModel, node_signature
from graphsub.optimizer import optimize_model


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHSUB_CACHE_DIR", str(tmp_path))


def tile_model() -> bytes:
    """Grouped-query attention's copies written as a Tile (keys (1, 2, 1, 8, 4) repeated to
    four heads per group) whose repeats are an initializer, then a matmul."""
    repeats = numpy_helper.from_array(np.array([1, 1, 4, 1, 1], np.int64), "repeats")
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 4))
                                .astype(np.float32), "w")
    nodes = [helper.make_node("Tile", ["k", "repeats"], ["e"]),
             helper.make_node("MatMul", ["e", "w"], ["y"])]
    graph = helper.make_graph(
        nodes, "gqa", [helper.make_tensor_value_info("k", TensorProto.FLOAT, [1, 2, 1, 8, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4, 8, 4])], [repeats, w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_an_opaque_tile_is_timed_with_its_real_repeats():
    graph = graphsub.load(tile_model())
    (tile,) = graph.nodes_by_op("opaque")
    sig = node_signature(graph, tile)
    assert sig.values is not None and sig.values[1].array.tolist() == [1, 1, 4, 1, 1]
    assert "values=" in sig.key()
    model = MeasuredCostModel(target=get_target("ort-cpu", threads=1), cache=False)
    assert model.graph_cost(graph) > 0 and model.untimed == {} and model.measured == 2


def test_an_expand_is_graphsubs_own_operator():
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Expand", ["k", "shape"], ["e"])], "gqa",
        [helper.make_tensor_value_info("k", TensorProto.FLOAT, [1, 2, 1, 8, 4])],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, [1, 2, 4, 8, 4])],
        [numpy_helper.from_array(np.array([1, 2, 4, 8, 4], np.int64), "shape")]),
        opset_imports=[helper.make_opsetid("", 17)])
    graph = graphsub.load(model.SerializeToString())
    (expand,) = graph.nodes_by_op("expand")
    assert graph[expand].attrs["shape"] == (1, 2, 4, 8, 4) and not graph.nodes_by_op("opaque")


def test_an_operator_that_cannot_be_timed_is_priced_analytically_with_a_note(monkeypatch):
    target = get_target("ort-cpu", threads=1)
    timed = target.time_op

    def refuse_opaque(sig, cold_weights=False):
        if sig.op == "opaque":
            raise RuntimeError("[ONNXRuntimeError] : 1 : FAIL : invalid tile repeats")
        return timed(sig, cold_weights)

    monkeypatch.setattr(target, "time_op", refuse_opaque)
    graph = graphsub.load(tile_model())
    model = MeasuredCostModel(target=target, cache=False)
    with pytest.warns(RuntimeWarning, match="could not time opaque Tile"):
        assert model.graph_cost(graph) > 0
    assert model.untimed["opaque Tile"][0] == 1
    (note,) = model.notes()
    assert "opaque Tile" in note and "invalid tile repeats" in note
    # The limit covers checking the rules into this test's empty cache (seconds on a slow
    # machine) as well as the search, which ends as soon as the two-operator graph is done.
    _, report = optimize_model(graph, tile_model(), "gqa", target=target, time_limit=60,
                               threads=1, measure_seconds=0.2)
    assert any("opaque Tile" in n for n in report.notes), report.notes
    assert report.verdict


def test_operators_not_timed_by_the_deadline_are_priced_analytically():
    """Timing a large model's operators for the first time can outlast the search's time
    limit; past the deadline the rest are priced analytically (and not cached), with a note."""
    import time

    graph = graphsub.load(tile_model())
    model = MeasuredCostModel(target=get_target("ort-cpu", threads=1))
    model.deadline = time.perf_counter() - 1.0
    assert model.graph_cost(graph) > 0
    assert model.measured == 0 and model.late == 2
    (note,) = model.notes()
    assert "the time for timing operators on ort-cpu ran out" in note and "2 signature(s)" in note
    again = MeasuredCostModel(target=get_target("ort-cpu", threads=1))
    again.graph_cost(graph)
    assert again.measured == 2  # nothing analytic was cached as a timing


def matmul_relu_model(rows: int) -> bytes:
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((16, 16))
                                .astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Relu", ["p"], ["y"])],
        "mm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, 16])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_late_operators_are_priced_in_the_unit_of_the_timed_ones(monkeypatch):
    """Past the deadline an operator's analytic price is scaled by what timed operators of
    its kind cost against theirs (of all kinds, where none of its kind was timed): a graph
    whose new operators came late is compared with the one it replaces in one unit."""
    import time

    from graphsub.cost import AnalyticCostModel

    target = get_target("ort-cpu", threads=1)
    analytic = AnalyticCostModel(target.analytic_profile, target.free_views)
    factor = {"matmul": 4.0, "relu": 9.0}
    monkeypatch.setattr(target, "time_op",
                        lambda sig, cold=False: factor[sig.op] * analytic.op_cost(sig))
    model = MeasuredCostModel(target=target, cache=False)
    model.graph_cost(graphsub.load(matmul_relu_model(8)))
    assert model.measured == 2
    model.deadline = time.perf_counter() - 1.0
    late = graphsub.load(matmul_relu_model(32))
    for nid in late.topo_order():
        sig = node_signature(late, nid)
        if sig.op in factor:
            assert model.signature_cost(sig) == pytest.approx(
                factor[sig.op] * analytic.op_cost(sig))
    assert model.late == 2
    assert model.scale("softmax") == pytest.approx(6.5)  # the median of 4 and 9
