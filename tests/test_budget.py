"""The run's time budget: each stage's clock, and what a Ctrl-C in the search leaves to
measuring."""

from __future__ import annotations

import time

import pytest

from graphsub.budget import Budget, measure_reserve


def test_the_search_leaves_the_measure_reserve_and_measuring_ends_at_the_limit():
    budget = Budget(time_limit=300.0)
    search = budget.clock("search")
    assert search.deadline == pytest.approx(budget.started + 300.0 - measure_reserve(300.0))
    assert budget.clock("measure").deadline == pytest.approx(budget.started + 300.0)


def test_after_a_ctrl_c_measuring_gets_its_reserve_from_then_not_the_whole_limit():
    budget = Budget(time_limit=300.0, started=time.perf_counter() - 10.0)
    budget.clock("search")
    budget.interrupted()
    measure = budget.clock("measure")
    assert measure.remaining() == pytest.approx(measure_reserve(300.0), abs=1.0)
    assert measure_reserve(300.0) == 60.0  # not the 290 s the limit had left


def test_an_interruption_after_the_window_changes_nothing():
    budget = Budget(time_limit=10.0, started=time.perf_counter() - 9.5)
    budget.interrupted()
    assert budget.clock("measure").deadline == pytest.approx(budget.started + 10.0)


def test_a_measure_limit_is_measurings_own_whatever_the_search_did():
    budget = Budget(time_limit=5.0, measure_limit=30.0)
    budget.interrupted()
    assert budget.clock("measure").remaining() == pytest.approx(30.0, abs=1.0)


def test_a_large_models_writing_comes_out_of_the_search_not_after_the_limit():
    """Writing a candidate of half a GiB of weights takes seconds (VGG-19: 7.8 s): the search
    leaves that time before measuring, and measuring still ends at the limit."""
    from graphsub.budget import WRITE_ALWAYS_BYTES, writing_seconds

    assert writing_seconds(WRITE_ALWAYS_BYTES) == 0.0
    writing = writing_seconds(575 << 20)
    assert writing > 5.0
    budget = Budget(time_limit=60.0, writing=writing)
    assert budget.clock("search").deadline == pytest.approx(
        budget.started + 60.0 - measure_reserve(60.0) - writing, abs=0.5)
    assert budget.clock("measure").deadline == pytest.approx(budget.started + 60.0)


def test_the_limit_is_spent_for_the_search_once_the_run_has_taken_it():
    budget = Budget(time_limit=5.0, started=time.perf_counter() - 6.0)
    assert budget.spent("search") and budget.spent("export")
    given = Budget(time_limit=5.0, measure_limit=30.0, started=time.perf_counter() - 6.0)
    assert given.spent("search") and not given.spent("export")  # measuring's own time
    assert not Budget(time_limit=5.0).spent("search")


def test_a_run_whose_loading_spent_the_limit_keeps_the_original_as_read(tmp_path):
    """Loading counts: where it took the whole limit, nothing is searched, written or timed,
    each said in a note, and the original's bytes are what is handed back, at once."""
    import onnx

    import graphsub
    from graphsub import zoo
    from graphsub.onnx_io import to_onnx_bytes

    path = tmp_path / "m.onnx"
    path.write_bytes(to_onnx_bytes(zoo.build("squeezenet")))
    model = graphsub.open_model(path)
    start = time.perf_counter()
    data, report = graphsub.optimize_model(model, target="ort-cpu", time_limit=5,
                                           started=time.perf_counter() - 6.0)
    assert time.perf_counter() - start < 5.0
    assert bytes(data) == path.read_bytes()
    skipped = [n for n in report.notes if "did not run: the time limit" in n]
    assert {n.split()[0] for n in skipped} >= {"search", "fission", "export"}
    assert onnx.load_from_string(bytes(data)).graph.node


def test_a_small_model_the_target_cannot_run_is_refused_even_after_the_limit(tmp_path):
    """A first run's rule checks can spend a short limit: a small model is still run once on
    the target, so one onnxruntime's CPU provider cannot run (bfloat16) is refused, not
    handed back as if it had been confirmed."""
    import pytest

    import graphsub
    from graphsub.errors import GraphsubError
    from tests.test_bfloat16 import bf16_model

    path = tmp_path / "bf16.onnx"
    path.write_bytes(bf16_model().SerializeToString())
    model = graphsub.open_model(path)
    with pytest.raises(GraphsubError, match="cannot run the original model"):
        graphsub.optimize_model(model, target="ort-cpu", time_limit=5,
                                started=time.perf_counter() - 6.0)
