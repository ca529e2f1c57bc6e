"""Other tools' optimizers as candidates: what onnxruntime, onnxscript and onnxslim make of
the original and of graphsub's best are timed beside graphsub's own candidates, so that the
model written is never one a peer beats in the measurement."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

import graphsub
from graphsub.budget import StageClock
from graphsub.pipeline import PEERS as PEERS_STAGE
from graphsub.pipeline import Settings, model_stages, start_run
from graphsub.pipeline.export_stages import peer_candidates
from graphsub.backends.peers import PEERS, Peer, apply_peer, installed_peers, operator_domains
from graphsub.errors import GraphsubError
from graphsub.search.result import StepKind
from tests.onnx_io.helpers import init, make_model, vi


def foldable_model() -> onnx.ModelProto:
    """y = relu(x @ (w1 + w2)) + b: a weight sum every optimizer folds into one constant."""
    rng = np.random.default_rng(0)
    w1, w2 = (rng.standard_normal((32, 32)).astype(np.float32) for _ in range(2))
    nodes = [helper.make_node("Add", ["w1", "w2"], ["w"]),
             helper.make_node("MatMul", ["x", "w"], ["m"]),
             helper.make_node("Relu", ["m"], ["r"]),
             helper.make_node("Add", ["r", "b"], ["y"])]
    return make_model(nodes, [vi("x", [8, 32])], [vi("y", [8, 32])],
                      [init("w1", w1), init("w2", w2),
                       init("b", rng.standard_normal(32).astype(np.float32))])


def _run(model: bytes, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def test_peers_fold_the_weight_sum_and_compute_the_same():
    model = foldable_model().SerializeToString()
    x = np.random.default_rng(1).standard_normal((8, 32)).astype(np.float32)
    names = [p.name for p in installed_peers(vendor=False)]
    assert {"onnxruntime (basic level, saved)", "onnxruntime (extended level, saved)"} <= \
        set(names)
    assert "onnxruntime transformers optimizer" not in names
    for peer in installed_peers(vendor=True):
        out = apply_peer(peer, model)
        if out is None:
            assert peer.name == "onnxruntime transformers optimizer"  # no attention here
            continue
        proto = onnx.load_from_string(out)
        assert [n.op_type for n in proto.graph.node][0] != "Add", peer.name  # w1 + w2 folded
        np.testing.assert_allclose(_run(out, x), _run(model, x), rtol=1e-5, atol=1e-5)


def test_operator_domains_tell_onnxruntime_fusions_apart():
    """onnxruntime's extended level writes a convolution and its relu as its own FusedConv."""
    w = np.random.default_rng(0).standard_normal((8, 3, 3, 3)).astype(np.float32)
    model = make_model([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                        helper.make_node("Relu", ["c"], ["y"])],
                       [vi("x", [1, 3, 16, 16])], [vi("y", [1, 8, 16, 16])],
                       [init("w", w)]).SerializeToString()
    assert operator_domains(model) == {""}
    fused = apply_peer(next(p for p in PEERS if "extended" in p.name), model)
    assert fused is not None and "com.microsoft" in operator_domains(fused)


def test_a_failing_peer_is_a_clear_error_of_its_own():
    def broken(model: bytes) -> bytes:
        raise ValueError("cannot read this graph\nmore detail")

    with pytest.raises(GraphsubError, match="broken peer failed: ValueError: cannot read"):
        apply_peer(Peer("broken peer", broken), b"")
    assert apply_peer(Peer("no-op", lambda m: m), b"x") is None


def test_peer_outputs_are_candidates_named_by_their_peer():
    model = foldable_model()
    graph = graphsub.load(model)
    settings = Settings.make(target="ort-cpu", cost="analytic", time_limit=10)
    assert PEERS_STAGE in model_stages(settings)
    assert PEERS_STAGE not in model_stages(Settings.make(target="ort-cpu", peers=False))
    run = start_run(graph, settings, original=model.SerializeToString())
    peer_candidates(run, StageClock("peers", 0.0, None))
    named = [c.trace[-1].rule for c, _ in run.exported]
    assert "onnxruntime (basic level, saved)" in named
    assert all(c.trace[-1].kind is StepKind.PEER for c, _ in run.exported)
    assert all(operator_domains(data) == {""} for _, data in run.exported)  # no --ort-fusions
    x = np.random.default_rng(1).standard_normal((8, 32)).astype(np.float32)
    for _, data in run.exported:
        np.testing.assert_allclose(_run(data, x), _run(model.SerializeToString(), x),
                                   rtol=1e-5, atol=1e-5)


def test_peers_left_when_their_share_of_the_window_runs_out_are_named():
    """A peer cannot be stopped halfway (onnxsim's import alone takes seconds), so none starts
    once the stage's share of the search's time is spent; the note names them."""
    model = foldable_model()
    run = start_run(graphsub.load(model), Settings.make(target="ort-cpu", cost="analytic"),
                    original=model.SerializeToString())
    peer_candidates(run, StageClock("peers", 0.0, 0.0))  # a deadline long past
    assert run.exported == []
    assert any(note.startswith("not run for lack of time") and
               "onnxruntime (basic level, saved)" in note for note in run.notes)


def test_the_peers_get_a_share_of_the_search_window():
    from graphsub.budget import PEERS_SHARE, Budget

    budget = Budget(40.0)
    clock = budget.clock("peers")
    window = budget.search_window_end() - clock.start
    assert clock.end is not None
    assert clock.end - clock.start == pytest.approx(PEERS_SHARE * window, rel=1e-3)
