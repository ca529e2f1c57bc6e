"""Choosing by measurement within the time limit: candidates a target cannot build are dropped
with a note, the run fits its limit, and the verdict says what happened with its figures."""

from __future__ import annotations

import math
import time

import pytest

import graphsub
from graphsub.backends import get_target
from graphsub.ir import GraphBuilder
from graphsub.budget import measure_reserve
from graphsub.optimizer import optimize_model
from graphsub.report.optimize import OptimizeReport, verdict
from graphsub.runtime.timing import PairedComparison, Timing
from graphsub.selection import CandidateReport, Selection


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHSUB_CACHE_DIR", str(tmp_path))


def chain():
    """A matmul chain the analytic model prices cheaper reassociated: there are candidates."""
    b = GraphBuilder(seed=0)
    x = b.input("x", (1, 64))
    b.output(b.matmul(b.matmul(x, b.he_weight((64, 512))), b.he_weight((512, 64))), "y")
    return b.build()


def test_a_candidate_the_target_cannot_build_is_dropped_with_a_note(monkeypatch):
    target = get_target("ort-cpu", threads=1)
    prepare = target.prepare

    def refuse_candidates(graph, onnx=None, label=""):
        if label.startswith("candidate"):
            raise RuntimeError("[ONNXRuntimeError] : 1 : FAIL : MatMulAddFusion left a "
                               "dangling input")
        return prepare(graph, onnx, label)

    monkeypatch.setattr(target, "prepare", refuse_candidates)
    data, report = optimize_model(chain(), cost="analytic", target=target, time_limit=6,
                                  threads=1, measure_seconds=0.2)
    assert report.kept_original and report.outcome == "not-run"
    assert report.candidates and all("cannot build" in c.note for c in report.candidates)
    assert any("dangling input" in n for n in report.notes)
    assert "No candidate could run on ort-cpu" in report.verdict


def test_the_whole_run_fits_the_time_limit():
    limit = 6.0
    _, report = optimize_model(chain(), cost="analytic", time_limit=limit, threads=1,
                               budget=10**9, algorithm="backtracking")
    t = report.seconds
    assert t["search"] <= limit - measure_reserve(limit) + 1.0
    # Timing and confirming fit the rest; verifying a chosen candidate may come on top.
    assert t["search"] + t["measure"] <= limit + 1.0, t
    assert t["total"] <= limit + t["verify"] + 1.0, t


def test_too_little_measuring_time_keeps_the_original_and_says_how_to_get_more():
    _, report = optimize_model(chain(), cost="analytic", time_limit=2, measure_limit=0.001,
                               threads=1)
    assert report.kept_original and report.outcome == "no-time"
    assert "--measure-limit" in report.verdict


def test_measure_reserve_is_a_bounded_share_of_the_limit():
    assert measure_reserve(60) == 15 and measure_reserve(4) == 2 and measure_reserve(1) == 0.5
    assert measure_reserve(3600) == 60


def report_for(outcome: str, confirmation: dict | None = None) -> OptimizeReport:
    return OptimizeReport(
        model="m", settings={}, target="ort-cpu", device={}, predicted_cost_before=1.0,
        predicted_cost_after=1.0, latency_before_ms=2.0, latency_after_ms=2.0, speedup=1.0,
        kept_original=outcome != "faster", trace=[], rules_used={},
        search={"seconds": 3.2, "explored": 41, "stopped_by": "time"},
        candidates=[CandidateReport(0.9, 1.96, ["r"]), CandidateReport(0.95, 2.1, ["s"])],
        confirmation=confirmation or {}, outcome=outcome)


def paired(speedups: list[float]) -> PairedComparison:
    return PairedComparison(Timing(tuple(speedups), 1), Timing(tuple([1.0] * len(speedups)), 1))


@pytest.mark.parametrize("outcome, confirm, fragments", [
    ("faster", [1.2] * 9 + [0.9], ["1.200x as fast", "10 head-to-head rounds", "90%"]),
    ("not-confirmed", [1.017] * 6 + [0.98] * 5, ["predicted 10.0% cheaper", "+1.7%", "55% of 11",
                                                  "needs 2% and 70%"]),
    ("not-faster", None, ["2 candidate(s)", "predicted 10.0% cheaper", "0.980x"]),
    ("no-cheaper-graph", None, ["no graph predicted cheaper", "41 expanded", "stopped by time"]),
    ("no-time", None, ["within the time limit", "--measure-limit", "takes 2 ms"]),
])
def test_the_verdict_names_what_happened_with_its_figures(outcome, confirm, fragments):
    comparison = paired(confirm) if confirm else None
    selection = Selection(outcome, screen_ratio=0.98, confirm=comparison, original_run_s=0.002)
    report = report_for(outcome, selection.confirmation())
    text = verdict(report, selection)
    for fragment in fragments:
        assert fragment in text, text
    interrupted = verdict(report, selection, interrupted=True)
    assert interrupted.startswith("The search was interrupted after 3.2 s.")
    assert not math.isnan(report.predicted_cost_before)


def test_a_candidate_onnxruntimes_optimizations_break_is_dropped_not_blamed(monkeypatch):
    """onnxruntime's fusions have broken valid models (found by the fuzzer: a candidate right
    as written, wrong at the ALL level). A candidate that is right with onnxruntime's
    optimizations off is dropped with a note; only a wrong rewrite is a verification error."""
    target = get_target("ort-cpu", threads=1)
    prepare = target.prepare

    class Broken:
        def __init__(self, inner):
            self.inner = inner

        def run(self, feeds):
            return {k: v + 1.0 for k, v in self.inner.run(feeds).items()}

        def __getattr__(self, name):
            return getattr(self.inner, name)

    def breaking_candidates(graph, onnx=None, label=""):
        runnable = prepare(graph, onnx, label)
        return Broken(runnable) if label.startswith("candidate") else runnable

    monkeypatch.setattr(target, "prepare", breaking_candidates)
    _, report = optimize_model(chain(), cost="analytic", target=target, time_limit=6,
                               threads=1, measure_seconds=0.2)
    assert report.kept_original and report.outcome == "not-run"
    assert any("onnxruntime optimizer bug" in n for n in report.notes), report.notes


def test_the_fuzzers_candidate_that_onnxruntime_breaks_is_dropped_with_a_note():
    """x[4,5] @ W[5,2] @ v[2], and the candidate matmul-as-transposed-product makes of it:
    Transpose(MatMul(W^T, Transpose(x))) @ v. onnxruntime 1.32's MatMul-Transpose fusion turns
    that into a FusedMatMul that computes other values at the ALL level; graphsub drops the
    candidate with a note instead of failing the run (fuzzer finding)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from graphsub.runtime.ort import run
    from graphsub.search.result import Candidate
    from graphsub.selection import measure_and_choose

    w = np.random.default_rng(0).standard_normal((5, 2)).astype(np.float32)

    def model(nodes, inits):
        graph = helper.make_graph(
            nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 5]),
                         helper.make_tensor_value_info("v", TensorProto.FLOAT, [2])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]
                                 ).SerializeToString()

    original = model([helper.make_node("MatMul", ["x", "w"], ["h"]),
                      helper.make_node("MatMul", ["h", "v"], ["y"])],
                     [numpy_helper.from_array(w, "w")])
    candidate = model([helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0]),
                       helper.make_node("MatMul", ["wt", "xt"], ["p"]),
                       helper.make_node("Transpose", ["p"], ["h"], perm=[1, 0]),
                       helper.make_node("MatMul", ["h", "v"], ["y"])],
                      [numpy_helper.from_array(np.ascontiguousarray(w.T), "wt")])
    graph = graphsub.load(original)
    feeds = {"x": np.random.default_rng(1).standard_normal((4, 5)).astype(np.float32),
             "v": np.random.default_rng(2).standard_normal(2).astype(np.float32)}
    as_written = run(candidate, feeds, optimize=False)["y"]
    assert np.allclose(as_written, run(original, feeds, optimize=False)["y"], rtol=1e-4, atol=1e-5)
    ort_breaks_it = not np.allclose(run(candidate, feeds)["y"], as_written, rtol=1e-3, atol=1e-4)
    selection = measure_and_choose(
        get_target("ort-cpu", threads=1), graph, original,
        [(Candidate(graphsub.load(candidate), 0.5, ()), candidate)], feeds,
        deadline=time.perf_counter() + 10, measure_seconds=0.2)
    assert selection.mismatch is None  # never blamed on graphsub
    if ort_breaks_it:
        assert "onnxruntime optimizer bug" in selection.notes[0]
    else:  # an onnxruntime that fixed its fusion: an ordinary candidate
        assert selection.candidates[0].measured_ms is not None


class _Closable:
    def close(self) -> None:
        pass


@pytest.mark.parametrize("second, chosen", [([1.1] * 10, 1), ([1.0] * 10, None)])
def test_when_the_fastest_fails_its_confirmation_the_runner_up_gets_one(monkeypatch, second,
                                                                        chosen):
    """Three candidates faster than the original in the screening: the fastest (index 2) is
    not confirmed head to head; the runner-up (index 1) is confirmed in its turn, or, failing
    too, the verdict still reports the fastest's figures; the third is never tried."""
    from graphsub import selection as sel

    monkeypatch.setattr(sel, "time_runnables", lambda runnables, feeds, **kw: [
        Timing((2.0,) * 5), Timing((1.9,) * 5), Timing((1.5,) * 5), Timing((1.8,) * 5)])
    confirms = iter([paired([1.01] * 10), paired(second)])
    monkeypatch.setattr(sel, "compare_runnables", lambda *args, **kw: next(confirms))
    ready = [(0, _Closable(), 0.001), (1, _Closable(), 0.001), (2, _Closable(), 0.001)]
    ready = [ready[0], ready[2], ready[1]]  # order of `ready` is not the screening's order
    selection = sel._screen_and_confirm(
        Selection("not-run", candidates=[CandidateReport(1.0, None, [])] * 3,
                  original_run_s=0.001),
        _Closable(), ready, {}, time.perf_counter() + 60, 0.0, 1.0, get_target("ort-cpu"),
        lambda message: None)
    assert selection.chosen == chosen
    if chosen is None:
        assert selection.outcome == "not-confirmed"
        assert selection.confirm.speedup == pytest.approx(1.01)  # the fastest's figures
        assert any("runner-up" in n for n in selection.notes)
    else:
        assert selection.outcome == "faster" and selection.confirm.speedup == pytest.approx(1.1)
