"""Cost models: memoization, weight-only nodes are free, the persistent measured cache (and
its recovery from corruption), device profiles, MetaFlow's multi-objective cost."""

from __future__ import annotations

import math
import sqlite3

import numpy as np
import pytest

from graphsub.targets import get_target
from graphsub.cost import (AnalyticCostModel, MeasuredCostModel, MultiObjectiveCostModel,
                           Weights, node_signature)
from graphsub.cost.measured import CostCache
from graphsub.ir import GraphBuilder


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHSUB_CACHE_DIR", str(tmp_path))
    return tmp_path


def conv_graph(folded_weight: bool = True):
    b = GraphBuilder(seed=0)
    x = b.input("x", (1, 8, 16, 16))
    w = b.he_weight((8, 8, 3, 3))
    if folded_weight:
        w = b.mul(w, b.weight(np.full((1,), 0.5, np.float32)))  # weight-only
    b.output(b.relu(b.conv2d(x, w)), "y")
    return b.build()


def test_weight_only_nodes_and_inputs_cost_nothing():
    model = AnalyticCostModel()
    g1, g2 = conv_graph(True), conv_graph(False)
    assert model.graph_cost(g1) == pytest.approx(model.graph_cost(g2))
    mul = g1.nodes_by_op("mul")[0]
    assert model.node_cost(g1, mul) == 0.0


def test_costs_are_memoized_by_signature():
    model = AnalyticCostModel()
    g = conv_graph()
    model.graph_cost(g)
    sigs = len(model._memo)
    model.graph_cost(conv_graph())
    assert len(model._memo) == sigs
    conv = g.nodes_by_op("conv2d")[0]
    sig = node_signature(g, conv)
    assert sig.constant_inputs == (False, True)
    assert "conv2d" in sig.key()


def test_device_profiles_rank_devices():
    g = conv_graph()
    cpu, v100 = AnalyticCostModel("cpu"), AnalyticCostModel("v100")
    assert v100.graph_cost(g) < cpu.graph_cost(g)
    from graphsub.errors import GraphsubError

    with pytest.raises(GraphsubError, match="unknown device profile 'tpu'"):
        AnalyticCostModel("tpu")


def test_measured_costs_persist_in_the_cache(cache_dir):
    g = conv_graph()
    first = MeasuredCostModel(get_target("ort-cpu", threads=1))
    cost = first.graph_cost(g)
    assert cost > 0 and first.measured == 2  # conv and relu
    first.cache.close()
    second = MeasuredCostModel(get_target("ort-cpu", threads=1))
    assert second.graph_cost(g) == pytest.approx(cost)
    assert second.measured == 0
    assert (cache_dir / "op_costs.sqlite").exists()
    other_threads = MeasuredCostModel(get_target("ort-cpu", threads=2))
    other_threads.graph_cost(g)
    assert other_threads.measured == 2  # the thread count is part of the key


def test_corrupt_cache_file_is_rebuilt(cache_dir):
    path = cache_dir / "op_costs.sqlite"
    path.write_bytes(b"this is not an sqlite database" * 100)
    model = MeasuredCostModel(get_target("ort-cpu", threads=1))
    assert model.graph_cost(conv_graph()) > 0
    model.cache.close()
    with sqlite3.connect(path) as conn:
        # conv, relu and the calibrated per-operator overhead
        assert conn.execute("SELECT count(*) FROM costs").fetchone()[0] == 3


def test_cache_is_safe_under_concurrent_writers(tmp_path):
    import threading

    path = tmp_path / "c.sqlite"

    def writer(k):
        c = CostCache(path, "ctx")
        for i in range(50):
            c.put(f"{k}-{i}", float(i))
        c.close()

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    c = CostCache(path, "ctx")
    assert all(c.get(f"{k}-{i}") == float(i) for k in range(4) for i in range(50))


def test_multi_objective_cost_and_memory_cap():
    g = conv_graph()
    base = AnalyticCostModel()
    launches = MultiObjectiveCostModel(base, Weights(time=0.0, launches=1.0))
    assert launches.graph_cost(g) == 2  # conv and relu; the weight-only mul is folded
    memory = MultiObjectiveCostModel.memory(g)
    assert memory == 8 * 8 * 9 * 4 + 2 * 8 * 16 * 16 * 4  # folded weight + two activations
    capped = MultiObjectiveCostModel(base, memory_cap=memory - 1)
    assert math.isinf(capped.graph_cost(g))
    assert MultiObjectiveCostModel(base, memory_cap=memory).graph_cost(g) == pytest.approx(base.graph_cost(g))


def test_a_locked_cache_is_not_mistaken_for_a_damaged_one(tmp_path, monkeypatch):
    """sqlite reports "database is locked" as an OperationalError, a kind of DatabaseError:
    the cache must not delete a file another process is writing because it was busy."""
    import sqlite3

    path = tmp_path / "c.sqlite"
    c = CostCache(path, "ctx")
    c.put("a", 1.0)

    class Locked:
        def execute(self, *args):
            raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(c, "_connect", lambda: Locked())
    c.put("b", 2.0)
    assert c.get("a") is None  # not readable now, but not gone
    monkeypatch.undo()
    assert path.exists() and CostCache(path, "ctx").get("a") == 1.0
