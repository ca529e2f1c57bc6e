"""One optimize run shared by the report tests: a model whose search finds rewrites (two
transposes that cancel, an activation that fuses into a matmul), timed on onnxruntime with
the original made slower by a sleep in every run, so that the screening, the head-to-head
confirmation and the verification all happen on any machine: the report tests check what a
run records, not how fast this machine is."""

from __future__ import annotations

import time

import pytest

from graphsub.targets import get_target
from graphsub.ir import GraphBuilder
from graphsub.optimizer import optimize_model
from graphsub.runtime.timing import Runnable

#: Seconds the original sleeps in each run: far above the model's own run time.
SLOWER = 0.002


def transposes_model():
    b = GraphBuilder(seed=0)
    x = b.input("x", (8, 64, 64))
    t = b.transpose(b.transpose(b.relu(x), perm=(0, 2, 1)), perm=(0, 2, 1))
    b.output(b.tanh(b.matmul(t, b.he_weight((64, 64)))), "y")
    return b.build()


class Slowed(Runnable):
    """A runnable that sleeps SLOWER seconds in every run (and its timing)."""

    def __init__(self, inner: Runnable) -> None:
        self.inner, self.label = inner, inner.label

    def run(self, feeds):
        time.sleep(SLOWER)
        return self.inner.run(feeds)

    def bind(self, feeds):
        self.inner.bind(feeds)

    def timed(self, n):
        out = []
        for _ in range(n):
            start = time.perf_counter()
            self.inner.timed(1)
            time.sleep(SLOWER)
            out.append(time.perf_counter() - start)
        return out

    def close(self):
        self.inner.close()


@pytest.fixture(scope="session")
def optimize_run(tmp_path_factory):
    """(graph, report) of an analytic-cost run on ort-cpu (analytic, so that the search's
    result does not depend on this machine's timings), the original slowed down, with a
    measuring time of its own (on a loaded machine, a share of the time limit may not fit the
    rounds a head-to-head needs to decide)."""
    import os

    os.environ.setdefault("GRAPHSUB_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    target = get_target("ort-cpu", threads=1)
    prepare = target.prepare

    def slow_original(graph, onnx=None, label="", session=None):
        runnable = prepare(graph, onnx, label, session=session)
        return Slowed(runnable) if label == "original" else runnable

    target.prepare = slow_original
    graph = transposes_model()
    _, report = optimize_model(graph, None, "transposes", time_limit=8, cost="analytic",
                               target=target, threads=1, measure_limit=5)
    return graph, report
