"""One onnxruntime session of the original per run (graphsub.pipeline.sessions): the probe,
the measuring, the check at the profile's other shapes and the verification all run the same
original, and once built up to four sessions of it, each a copy of its weights and, for a
large model, seconds of building. Counted where onnxruntime builds them."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper

from graphsub.onnx_io import load
from graphsub.optimizer import optimize_model
from graphsub.pipeline import probe_stage
from graphsub.targets import get_target
from tests.markers import targets
from tests.onnx_io.helpers import init, make_model, vi
from tests.report.conftest import Slowed


def _counted_sessions(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The models of every onnxruntime session built from now on."""
    built: list[bytes] = []

    class Counted(ort.InferenceSession):
        def __init__(self, model, *args, **kwargs):
            built.append(model if isinstance(model, bytes) else b"")
            super().__init__(model, *args, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", Counted)
    return built


def _slowed(target):
    """The target, with the original sleeping in every run at every size (see
    tests/report/conftest.py), on whatever session it is prepared."""
    prepare = target.prepare

    def slow_original(graph, onnx=None, label="", session=None):
        runnable = prepare(graph, onnx, label, session=session)
        return Slowed(runnable) if label.startswith("original") else runnable

    target.prepare = slow_original
    return target


def _transposes_with_an_open_batch() -> bytes:
    """Two transposes that cancel (a rewrite the search always finds), over an open batch
    size: the probe runs the original, and a profile of two sizes has the chosen candidate
    timed against the original at the second one."""
    w = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32) / 8
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Transpose", ["r"], ["t1"], perm=[0, 2, 1]),
             helper.make_node("Transpose", ["t1"], ["t2"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["t2", "w"], ["m"]),
             helper.make_node("Tanh", ["m"], ["y"])]
    return make_model(nodes, [vi("x", ["batch", 64, 64])], [vi("y", ["batch", 64, 64])],
                      [init("w", w)]).SerializeToString()


@pytest.mark.parametrize("name", targets("ort-cpu", "torch-cpu"))
def test_the_original_is_one_onnxruntime_session_per_run(monkeypatch, name):
    probed = []
    probe = probe_stage.probe
    monkeypatch.setattr(probe_stage, "probe",
                        lambda *args, **kwargs: probed.append(1) or probe(*args, **kwargs))
    original = _transposes_with_an_open_batch()
    built = _counted_sessions(monkeypatch)
    # the original made slower on the target, so that a candidate is chosen on any machine
    # and the whole way runs: screening, confirmation, the second size, verification
    _, report = optimize_model(load(original), original, "transposes", time_limit=20,
                               measure_limit=6, cost="analytic", fission=False, peers=False,
                               target=_slowed(get_target(name, threads=1)), threads=1,
                               shape_profile=("batch=4", "batch=2:0.5"), evidence=False)
    assert probed, "the probe did not run"
    assert report.outcome == "faster", report.verdict
    assert report.verification["equivalent"]
    assert [t["shape"] for t in report.timings["profile"]] == ["batch=4", "batch=2:0.5"]
    assert built.count(original) == 1


def _tracked_candidates(monkeypatch: pytest.MonkeyPatch) -> dict[int, bool]:
    """Whether each candidate's onnxruntime runnable made from now on is closed, by id."""
    from graphsub.runtime.ort_sessions import OrtRunnable

    closed: dict[int, bool] = {}
    init, close = OrtRunnable.__init__, OrtRunnable.close

    def tracked_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if self.label.startswith("candidate"):
            closed[id(self)] = False

    def tracked_close(self):
        closed[id(self)] = True
        close(self)

    monkeypatch.setattr(OrtRunnable, "__init__", tracked_init)
    monkeypatch.setattr(OrtRunnable, "close", tracked_close)
    return closed


@pytest.mark.parametrize("ends", ["verified", "in an error after the measuring"])
def test_the_run_closes_the_chosen_candidate_however_it_ends(monkeypatch, ends):
    """The chosen candidate's runnable goes from the measuring to the verification through
    the run's sessions (pipeline.sessions.RunSessions), not through the Selection: it is
    closed whether the verification ran or an error ended the run between the two."""
    from graphsub.pipeline import verify_stage

    original = _transposes_with_an_open_batch()
    closed = _tracked_candidates(monkeypatch)
    if ends != "verified":
        def fails(*args, **kwargs):
            raise RuntimeError("the export broke")
        monkeypatch.setattr(verify_stage, "written", fails)
    run = lambda: optimize_model(  # noqa: E731
        load(original), original, "transposes", time_limit=20, measure_limit=6,
        cost="analytic", fission=False, peers=False,
        target=_slowed(get_target("ort-cpu", threads=1)), threads=1,
        shape_profile=("batch=4",), evidence=False)
    if ends == "verified":
        _, report = run()
        assert report.outcome == "faster" and report.verification["equivalent"]
    else:
        with pytest.raises(RuntimeError, match="the export broke"):
            run()
    assert closed and all(closed.values()), closed
