"""Numerical comparison (tolerances, worst element) and interleaved timing."""

from __future__ import annotations

import numpy as np
import pytest

import graphsub
from graphsub.ir import GraphBuilder
from graphsub.runtime import graph_input_specs, time_models
from graphsub.verdicts import compare_models, diff_arrays
from graphsub.verdicts.equivalence import Tolerance
from graphsub.runtime.inputs import random_feeds


def relu_model(scale: float = 1.0):
    b = GraphBuilder()
    x = b.input("x", (4, 8))
    y = b.relu(x)
    if scale != 1.0:
        y = b.mul(y, b.weight(np.full((8,), scale, np.float32)))
    b.output(y, "y")
    g = b.build()
    return g, graphsub.to_onnx(g).SerializeToString()


def test_identical_models_are_equivalent():
    g, m = relu_model()
    result = compare_models(m, m, graph_input_specs(g))
    assert result.equivalent and result.worst.max_abs == 0


def test_difference_beyond_tolerance_is_reported_with_the_worst_element():
    g, a = relu_model()
    _, b = relu_model(1.001)
    result = compare_models(a, b, graph_input_specs(g), Tolerance(rtol=1e-4))
    assert not result.equivalent
    worst = result.worst
    assert worst.name == "y" and not worst.ok
    assert worst.max_rel == pytest.approx(1e-3, rel=1e-2)
    assert len(worst.worst_index) == 2
    assert worst.actual == pytest.approx(worst.expected * 1.001, rel=1e-6)
    assert compare_models(a, b, graph_input_specs(g), Tolerance(rtol=1e-2)).equivalent


def test_diff_arrays_handles_nan_and_inf():
    assert diff_arrays("o", np.array([np.nan, 1.0]), np.array([np.nan, 1.0]), 1e-4, 0).ok
    assert not diff_arrays("o", np.array([1.0]), np.array([np.nan]), 1e-4, 0).ok
    assert not diff_arrays("o", np.array([1.0]), np.array([np.inf]), 1e-4, 0).ok


def test_random_feeds_are_reproducible():
    specs = [("a", graphsub.TensorType((3,))), ("i", graphsub.TensorType((2,), "int64"))]
    f1, f2 = random_feeds(specs, 7), random_feeds(specs, 7)
    np.testing.assert_array_equal(f1["a"], f2["a"])
    assert f1["i"].dtype == np.int64
    assert not np.array_equal(random_feeds(specs, 8)["a"], f1["a"])


def test_interleaved_timing_gives_the_same_number_of_runs_to_each_model():
    g, a = relu_model()
    _, b = relu_model(2.0)
    feeds = random_feeds(graph_input_specs(g))
    ta, tb = time_models([a, b], feeds, threads=1, rounds=4, warmup=1, block=3)
    assert len(ta.samples) == len(tb.samples) == 12
    assert 0 < ta.minimum <= ta.q1 <= ta.median <= ta.q3



def test_the_absolute_tolerance_scales_with_each_output_of_the_reference():
    """SAME_FUNCTION's absolute tolerance is a share of each output's own largest magnitude:
    near-zero elements of a large output may differ by rounding, and a small output next to a
    large one is held to its own scale (a shared scale once let it be wrong by 1e-4 x the
    other output's magnitude)."""
    from graphsub.verdicts.equivalence import SAME_FUNCTION, compare_outputs

    rng = np.random.default_rng(0)
    large = rng.standard_normal(100) * 1e4
    large[0] = 1e-3
    small = rng.standard_normal(100) * 1e-2
    near_zero_off = large.copy()
    near_zero_off[0] += 0.5  # well inside 1e-4 x the output's largest magnitude
    diffs, problems = compare_outputs({"a": large, "b": small},
                                      {"a": near_zero_off, "b": small}, SAME_FUNCTION)
    assert not problems and all(d.ok for d in diffs)
    small_off = small.copy()
    small_off[3] += 0.05  # small next to the large output's scale, large for its own
    diffs, _ = compare_outputs({"a": large, "b": small}, {"a": large, "b": small_off},
                               SAME_FUNCTION)
    assert [d.name for d in diffs if not d.ok] == ["b"]


def test_integer_outputs_are_equal_or_not():
    """A quantized output one step off is another answer, however loose the float tolerance
    (float16's scales with the output's magnitude: 4 epsilons of 255 is one step)."""
    from graphsub.verdicts.equivalence import SAME_FUNCTION, compare_outputs

    half = SAME_FUNCTION.for_precision({"float16"})
    q = np.arange(256, dtype=np.uint8)
    off = q.copy()
    off[200] += 1
    accumulators = np.array([1_000_000, -3], np.int32)
    for tolerance in (SAME_FUNCTION, half):
        diffs, _ = compare_outputs({"q": q, "acc": accumulators},
                                   {"q": off, "acc": accumulators + np.int32(1)}, tolerance)
        assert [d.ok for d in diffs] == [False, False]
        diffs, _ = compare_outputs({"q": q}, {"q": q.copy()}, tolerance)
        assert diffs[0].ok
    diffs, _ = compare_outputs({"f": q.astype(np.float16)}, {"f": off.astype(np.float16)}, half)
    assert diffs[0].ok  # the same step in a float16 output is within its tolerance


class FakeDevice:
    """A device whose clock advances only by the work queued on it, with events on it: what
    `event_timed_calls` needs of CUDA, on the CPU. `log` records what happened in order."""

    def __init__(self) -> None:
        self.clock = 0.0  # milliseconds
        self.log: list[str] = []

    def event(self) -> "FakeDevice.Event":
        return FakeDevice.Event(self)

    class Event:
        def __init__(self, device: "FakeDevice") -> None:
            self.device, self.at = device, None

        def record(self) -> None:
            self.at = self.device.clock
            self.device.log.append("record")

        def synchronize(self) -> None:
            self.device.log.append("synchronize")

        def elapsed_time(self, end: "FakeDevice.Event") -> float:
            return end.at - self.at


def test_the_device_timing_loop_times_each_call_between_two_events_and_waits_for_it():
    """The loop both torch-cuda timings use (a model's runs, an operator's repetitions): a
    sample is the device time between an event before and after one call, in seconds, and
    each call is waited for before the next is queued."""
    from graphsub.runtime.timing import event_timed_calls

    device = FakeDevice()
    work = iter([2.0, 3.0, 5.0])

    def call() -> None:
        device.log.append("call")
        device.clock += next(work)

    assert event_timed_calls(call, 3, device.event) == pytest.approx([0.002, 0.003, 0.005])
    assert device.log == ["record", "call", "record", "synchronize"] * 3


def test_a_call_timer_waits_for_the_device_before_and_after_each_call():
    from graphsub.runtime.timing import CallTimer

    log: list[str] = []
    timer = CallTimer(lambda: log.append("call"), lambda: log.append("sync"))
    timer.bind({})
    samples = timer.timed(2)
    assert len(samples) == 2 and all(s >= 0 for s in samples)
    assert log == ["sync", "call", "sync", "call", "sync"]


def test_interleaved_rounds_keep_one_set_of_books_across_batches():
    """A comparison that asks for more rounds adds them to the same books: same rotation,
    no second warm-up."""
    from graphsub.runtime.timing import Interleaved, Timer

    class Counting(Timer):
        def __init__(self, name: str, order: list[str]) -> None:
            self.name, self.order, self.calls = name, order, []

        def bind(self, feeds):
            pass

        def timed(self, n):
            self.calls.append(n)
            self.order.append(self.name)
            return [0.001] * n

    order: list[str] = []
    a, b = Counting("a", order), Counting("b", order)
    books = Interleaved([a, b], {}, warmup=2, block=3, pause=0.0)
    books.run(rounds=3)
    books.run(rounds=2)
    assert books.rounds == 5 and a.calls == [2] + [3] * 5 and b.calls == [2] + [3] * 5
    assert order[2:] == ["a", "b", "b", "a", "a", "b", "b", "a", "a", "b"]
    assert [len(t.samples) for t in books.timings()] == [15, 15]
    assert books.timings()[0].median_round == pytest.approx(0.001)


def test_only_timed_sessions_keep_onnxruntime_spinning_threads():
    """A reference or verification session's workers spinning after its run would take the
    cores from a torch program timed next in the same process; a timed session (a candidate,
    an operator) runs as users run onnxruntime, spinning included."""
    from onnx import TensorProto, helper

    from graphsub.runtime.ort_sessions import OrtRunnable, make_session

    model = helper.make_model(
        helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])]),
        opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    data = model.SerializeToString()
    key = "session.intra_op.allow_spinning"
    assert make_session(data).get_session_options().get_session_config_entry(key) == "0"
    for timed in (make_session(data, timed=True), OrtRunnable(data).session):
        with pytest.raises(Exception, match="does not have configuration"):
            timed.get_session_options().get_session_config_entry(key)


def test_mapped_weights_pages_are_given_back_while_a_session_builds(monkeypatch):
    """onnxruntime reads every weight once to pack it, with the GIL released: the pages it
    has read are given back as it goes (a 3 GB decoder's second session otherwise peaked at
    3.1 GB of them on top of both sessions' packed weights), and once more at the end."""
    import time

    from graphsub.runtime import ort_sessions as graphsub_ort

    calls: list[int] = []
    monkeypatch.setattr(graphsub_ort, "RELEASE_INTERVAL", 0.01)
    monkeypatch.setattr(graphsub_ort, "_release_mapped_pages",
                        lambda arrays: calls.append(len(list(arrays))))
    with graphsub_ort._mapped_pages_released([np.zeros(3)]):
        time.sleep(0.2)
    assert len(calls) >= 3 and set(calls) == {1}
    calls.clear()
    with graphsub_ort._mapped_pages_released([]):
        time.sleep(0.05)
    assert calls == []
