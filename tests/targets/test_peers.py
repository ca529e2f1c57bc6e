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
from graphsub.pipeline import Settings, start_run
from graphsub.pipeline.peers_stage import peer_candidates
from graphsub.targets.peers import PEERS, ModelOperators, Peer, apply_peer, installed_peers
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


def test_model_operators_tell_onnxruntime_fusions_apart():
    """onnxruntime's extended level writes a convolution and its relu as its own FusedConv."""
    w = np.random.default_rng(0).standard_normal((8, 3, 3, 3)).astype(np.float32)
    model = make_model([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                        helper.make_node("Relu", ["c"], ["y"])],
                       [vi("x", [1, 3, 16, 16])], [vi("y", [1, 8, 16, 16])],
                       [init("w", w)]).SerializeToString()
    assert ModelOperators.of(onnx.load_from_string(model)).domains == {""}
    fused = apply_peer(next(p for p in PEERS if "extended" in p.name), model)
    assert fused is not None
    assert "com.microsoft" in ModelOperators.of(onnx.load_from_string(fused)).domains


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
    context = start_run(graph, settings, original=model.SerializeToString())
    peers = peer_candidates(context, StageClock("peers", 0.0, None))
    named = [e.candidate.trace[-1].rule for e in peers]
    assert "onnxruntime (basic level, saved)" in named
    assert all(e.candidate.trace[-1].kind is StepKind.PEER for e in peers)
    assert all(e.parsed is not None and ModelOperators.of(e.parsed).domains == {""} for e in peers)  # no --ort-fusions
    x = np.random.default_rng(1).standard_normal((8, 32)).astype(np.float32)
    for data in (e.model for e in peers):
        np.testing.assert_allclose(_run(data, x), _run(model.SerializeToString(), x),
                                   rtol=1e-5, atol=1e-5)


def test_peers_left_when_their_share_of_the_window_runs_out_are_named():
    """A peer cannot be stopped halfway (onnxsim's import alone takes seconds), so none starts
    once the stage's share of the search's time is spent; the note names them."""
    model = foldable_model()
    context = start_run(graphsub.load(model), Settings.make(target="ort-cpu", cost="analytic"),
                        original=model.SerializeToString())
    assert peer_candidates(context, StageClock("peers", 0.0, 0.0)) == ()  # a deadline long past
    assert any(note.startswith("not run for lack of time") and
               "onnxruntime (basic level, saved)" in note for note in context.log.notes)


def test_the_peers_get_a_share_of_the_search_window():
    from graphsub.budget import PEERS_SHARE, Budget

    budget = Budget(40.0)
    clock = budget.clock("peers")
    window = budget.search_window_end() - clock.start
    assert clock.end is not None
    assert clock.end - clock.start == pytest.approx(PEERS_SHARE * window, rel=1e-3)


def conv_bn_branches_model() -> onnx.ModelProto:
    """A convolution and its batch norm (onnxruntime's basic level folds them, graphsub's
    normal form does not), then two matrix products of one input added (graphsub's search
    distributes them, no peer does): a candidate with both beats either alone."""
    rng = np.random.default_rng(0)

    def f(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "g", "b", "m", "v"], ["n"]),
             helper.make_node("Relu", ["n"], ["r"]),
             helper.make_node("MatMul", ["r", "p"], ["a"]),
             helper.make_node("MatMul", ["r", "q"], ["d"]),
             helper.make_node("Add", ["a", "d"], ["y"])]
    return make_model(nodes, [vi("x", [1, 8, 16, 16])], [vi("y", [1, 8, 16, 16])],
                      [init("w", f(8, 8, 3, 3)), init("g", f(8)), init("b", f(8)),
                       init("m", f(8)), init("v", np.abs(f(8)) + 0.5), init("p", f(16, 16)),
                       init("q", f(16, 16))])


def _searched_after_peers(model: onnx.ModelProto, peers: list[Peer], monkeypatch):
    from graphsub.targets import peers as peers_module
    from graphsub.pipeline.search_stage import search

    monkeypatch.setattr(peers_module, "PEERS", tuple(peers))
    context = start_run(graphsub.load(model),
                        Settings.make(target="ort-cpu", cost="analytic", time_limit=10),
                        original=model.SerializeToString())
    peers = peer_candidates(context, StageClock("peers", 0.0, None))
    return context, peers, search(context, StageClock.lasting(6.0, "search"), peers)


def test_the_search_goes_on_from_a_peer_output_priced_below_the_input(monkeypatch):
    model = conv_bn_branches_model()
    basic = next(p for p in PEERS if p.name == "onnxruntime (basic level, saved)")
    context, _, found = _searched_after_peers(model, [basic], monkeypatch)
    assert any(n.startswith(f"the search went on from {basic.name}'s output")
               for n in context.log.notes)
    built = [c for c in found.result.candidates if c.trace and c.trace[0].kind is StepKind.PEER]
    assert len(built) == 1 and built[0].trace[0].rule == basic.name
    assert len(built[0].trace) > 1  # rewritten further by graphsub's rules
    assert found.result.candidates.index(built[0]) < context.settings.candidates  # it is timed
    x = np.random.default_rng(1).standard_normal((1, 8, 16, 16)).astype(np.float32)
    np.testing.assert_allclose(_run(graphsub.to_onnx(built[0].graph).SerializeToString(), x),
                               _run(model.SerializeToString(), x), rtol=1e-4, atol=1e-4)


def test_a_peer_output_graphsub_cannot_start_from_is_passed_over_with_a_note(monkeypatch):
    """A peer that renamed the model's input computes the function under another name: the
    search does not start from it (its output still is a candidate, timed as it came)."""
    def renaming(model: bytes) -> bytes:
        proto = onnx.load_from_string(_ORT_BASIC(model))
        for node in proto.graph.node:
            node.input[:] = ["image" if i == "x" else i for i in node.input]
        proto.graph.input[0].name = "image"
        return proto.SerializeToString()

    context, peers, found = _searched_after_peers(
        conv_bn_branches_model(), [Peer("renamer", renaming)], monkeypatch)
    assert [e.candidate.trace[0].rule for e in peers] == ["renamer"]
    assert "the search could not start from renamer's output: its inputs differ from the " \
           "original's" in context.log.notes
    assert not any(c.trace and c.trace[0].kind is StepKind.PEER
                   for c in found.result.candidates)


_ORT_BASIC = next(p for p in PEERS if p.name == "onnxruntime (basic level, saved)").apply


def test_what_a_peer_prints_does_not_reach_graphsubs_output(capsys):
    """onnxsim prints its own warnings to stdout, which would break `optimize --json`."""
    def chatty(model: bytes) -> bytes:
        print("WARNING: certify failed internally")
        return model + b"!"

    assert apply_peer(Peer("chatty", chatty), b"m") == b"m!"
    assert capsys.readouterr().out == ""


def test_each_peer_output_is_parsed_once(monkeypatch):
    """The peers stage reads a peer's output (its operators: did it change anything, does it
    bring onnxruntime's own) and the search's start imports it: one parse serves both (it
    was parsed four times)."""
    parsed = []
    load = onnx.load_from_string
    monkeypatch.setattr(onnx, "load_from_string",
                        lambda data, *args, **kwargs: parsed.append(bytes(data)) or
                        load(data, *args, **kwargs))
    model = conv_bn_branches_model()
    basic = next(p for p in PEERS if p.name == "onnxruntime (basic level, saved)")
    context, peers, _ = _searched_after_peers(model, [basic], monkeypatch)
    (output,) = peers
    assert any(n.startswith(f"the search went on from {basic.name}'s output")
               for n in context.log.notes)  # the search's start imported it
    assert parsed.count(bytes(output.model)) == 1
