"""MetaFlow's multi-objective cost, reachable as `--objective`: peak memory computed by
liveness, and a memory weight that changes what the search keeps."""

from __future__ import annotations

import numpy as np
import pytest

import graphsub
from graphsub import zoo
from graphsub.cost import AnalyticCostModel
from graphsub.cost.multi import launch_count, peak_memory
from graphsub.ir import GraphBuilder
from graphsub.pipeline import Objective


def test_peak_memory_counts_what_is_alive_at_once():
    b = GraphBuilder(seed=0)
    x = b.input("x", (4, 256))                      # 4 KiB
    h = b.relu(b.matmul(x, b.he_weight((256, 512))))  # weight 512 KiB; two 8 KiB values
    y = b.add(b.matmul(h, b.he_weight((512, 256))), x)  # weight 512 KiB; 4 KiB out
    b.output(y, "y")
    g = b.build()
    weights = 2 * 256 * 512 * 4
    # matmul 1 runs with x alive (x is read again at the end): x + its output; relu adds its
    # output while the first product is still alive; then the product dies, matmul 2 adds 4
    # KiB, add 4 KiB more.
    x_b, h_b, y_b = 4 * 256 * 4, 4 * 512 * 4, 4 * 256 * 4
    assert peak_memory(g) == weights + max(x_b + 2 * h_b, x_b + h_b + 2 * y_b)
    assert launch_count(g) == 4


def test_a_memory_weight_trades_latency_for_peak_memory():
    """On SqueezeNet the cheapest rewrites enlarge 1x1 kernels to 3x3 to merge convolutions:
    faster, and more weights to hold. Weighing memory keeps fewer of them."""
    g = zoo.build("squeezenet")
    time_model = AnalyticCostModel("a100")
    results = {text: graphsub.optimize(g, cost=AnalyticCostModel("a100"), budget=60,
                                       time_limit=600, objective=Objective.parse(text))
               for text in ("latency", "latency,memory=1")}
    fast, lean = results["latency"].graph, results["latency,memory=1"].graph
    assert peak_memory(fast) > peak_memory(g)  # latency alone: more memory for speed
    assert peak_memory(lean) < peak_memory(fast)
    assert time_model.graph_cost(fast) <= time_model.graph_cost(lean) < time_model.graph_cost(g)


def test_the_objective_is_scaled_to_the_input_graph():
    g = zoo.build("squeezenet")
    time_model = AnalyticCostModel("a100")
    model = Objective.parse("latency,memory=0.5").cost_model(time_model, g)
    latency = time_model.graph_cost(g)
    assert model.graph_cost(g) == pytest.approx(1.5 * latency)
    assert Objective().cost_model(time_model, g) is time_model
    flops_only = Objective.parse("flops").cost_model(time_model, g)
    assert flops_only.graph_cost(g) == pytest.approx(latency)


def test_a_product_holds_its_weight_its_input_and_its_output():
    b = GraphBuilder(seed=0)
    x = b.input("x", (2, 8))
    b.output(b.matmul(x, b.weight(np.ones((8, 8), np.float32))), "y")
    g = b.build()
    assert peak_memory(g) == 8 * 8 * 4 + 2 * 8 * 4 + 2 * 8 * 4
