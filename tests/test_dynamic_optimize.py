"""Optimizing models with symbolic sizes: costs at a shape profile, rule conditions decided
for every size, the written model verified at many bindings and keeping its dimension names."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import graphsub
from graphsub.ir.facts import GraphFacts
from graphsub.budget import StageClock
from graphsub.cost.analytic import AnalyticCostModel
from graphsub.cost.base import make_signature
from graphsub.cost.multi import MultiObjectiveCostModel, Weights
from graphsub.errors import GraphsubError
from graphsub.ir import GraphBuilder
from graphsub.tensors.symbolic import SymbolRange, size_symbol
from graphsub.tensors.types import Attrs, TensorType
from graphsub.pipeline import Settings, start_run
from graphsub.pipeline.verify_stage import verify
from graphsub.pipeline.values import Exported
from graphsub.rules.expr import undecided_conditions
from graphsub.rules.matcher import find_matches
from graphsub.rules.parser import parse_rules
from graphsub.runtime.check_sizes import (ProfileShape, complete_profile, default_profile,
                                       parse_profile)
from graphsub.search.result import Candidate
from graphsub.selection import Selection
from tests.onnx_io.helpers import init, make_model, vi

BATCH, SEQ = size_symbol("batch"), size_symbol("seq")


def _projections_model() -> onnx.ModelProto:
    """x (batch, seq, 16) through two products of the same input, an added zero and a
    reshape the exporter writes as a shape computation."""
    rng = np.random.default_rng(0)
    w1, w2 = (rng.standard_normal((16, 16)).astype(np.float32) for _ in range(2))
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["a"]),
             helper.make_node("MatMul", ["x", "w2"], ["b"]),
             helper.make_node("Add", ["a", "zero"], ["a0"]),
             helper.make_node("Mul", ["a0", "b"], ["ab"]),
             helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Slice", ["s", "start", "two"], ["bs"]),
             helper.make_node("Concat", ["bs", "heads"], ["target"], axis=0),
             helper.make_node("Reshape", ["ab", "target"], ["y"])]
    inits = [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2"),
             init("zero", np.zeros(16, np.float32)), init("start", np.array([0], np.int64)),
             init("two", np.array([2], np.int64)), init("heads", np.array([4, 4], np.int64))]
    return make_model(nodes, [vi("x", ["batch", "seq", 16])], [vi("y", ["batch", "seq", 4, 4])],
                      inits)


def test_profiles_parse_complete_and_refuse_what_does_not_fit():
    assert parse_profile("batch=8,seq=512:0.25") == ProfileShape.of({"batch": 8, "seq": 512}, 0.25)
    symbols = {"batch": SymbolRange(), "seq": SymbolRange(1, 512), "width": SymbolRange(2)}
    (default,) = default_profile(symbols)
    assert default.values == {"batch": 1, "seq": 128, "width": 128}
    for bad in ("batch", "batch=0", "batch=1:-2", ""):
        with pytest.raises(GraphsubError, match="--shape-profile"):
            parse_profile(bad)
    with pytest.raises(GraphsubError, match="missing: width"):
        complete_profile([parse_profile("batch=1,seq=4")], symbols)
    with pytest.raises(GraphsubError, match="unknown: heads"):
        complete_profile([parse_profile("batch=1,seq=4,width=3,heads=2")], symbols)
    with pytest.raises(GraphsubError, match="seq=600 is outside"):
        complete_profile([parse_profile("batch=1,seq=600,width=3")], symbols)
    with pytest.raises(GraphsubError, match="shape_profile"):
        Settings.make(shape_profile=(3,))


def test_a_symbolic_operator_costs_the_weighted_mean_of_its_costs_at_the_profile():
    model = AnalyticCostModel()
    x = TensorType((BATCH, SEQ, 64))
    w = TensorType((64, 64))
    sig = make_signature("matmul", Attrs({"activation": None}), (x, w), (False, True),
                         (TensorType((BATCH, SEQ, 64)),), lambda: (None, None))
    with pytest.raises(GraphsubError, match="no shape profile"):
        model.signature_cost(sig)
    profiled = model.at_profile((ProfileShape.of({"batch": 1, "seq": 8}, 3.0),
                                 ProfileShape.of({"batch": 4, "seq": 64}, 1.0)))
    at = [profiled.signature_cost(sig.bound(s.values)) for s in profiled.shape_profile]
    assert profiled.signature_cost(sig) == pytest.approx((3 * at[0] + at[1]) / 4)
    assert at[1] > at[0]
    with pytest.raises(GraphsubError, match="no shape profile"):  # the model it came from
        model.signature_cost(sig)
    # a model that prices through another prices at its profile (MetaFlow's weighted sum)
    weighted = MultiObjectiveCostModel(model, Weights(time=1.0, launches=1e-6))
    assert weighted.at_profile(profiled.shape_profile).signature_cost(sig) == \
        pytest.approx(profiled.signature_cost(sig) + 1e-6)


def test_a_shape_condition_that_depends_on_the_sizes_does_not_apply_and_is_counted():
    (rule,) = parse_rules("""
rule drop-unit-reshape:
  (reshape ?x :shape ?s) => ?x
  where (eq (shape $0) (shape ?x))
""")
    b = GraphBuilder()
    x = b.input("x", (BATCH, 4))
    b.output(b.reshape(x, shape=(BATCH, 4)), "same")        # equal for every batch
    b.output(b.reshape(b.input("z", (SEQ, 1)), shape=(SEQ,)), "fewer")  # never equal
    g = b.build()
    before = undecided_conditions()
    assert len(list(find_matches(g, rule))) == 1
    assert undecided_conditions() == before
    b = GraphBuilder()
    y = b.reshape(b.input("x", (BATCH, SEQ)), shape=(SEQ, BATCH))  # equal where batch == seq
    b.output(y, "y")
    assert list(find_matches(b.build(), rule)) == []
    assert undecided_conditions() == before + 1


def test_a_dynamic_model_is_searched_and_written_with_its_sizes():
    model = _projections_model()
    graph = graphsub.load(model)
    result = graphsub.optimize(graph, cost="analytic", time_limit=20)
    rules = {s.rule for s in result.trace}
    assert "remove-add-zeros" in rules
    assert result.graph.facts.symbols == graph.facts.symbols
    exported = graphsub.to_onnx(result.graph)
    assert [d.dim_param or d.dim_value for d in exported.graph.input[0].type.tensor_type.shape.dim] \
        == ["batch", "seq", 16]
    data, report = graphsub.optimize_model(graph, model.SerializeToString(), cost="analytic",
                                           time_limit=30, fission=False,
                                           shape_profile=("batch=1,seq=32", "batch=4,seq=8:0.5"))
    assert report.shapes["symbols"] == {"batch": "1..", "seq": "1.."}
    assert report.shapes["profile"] == ["batch=1,seq=32", "batch=4,seq=8:0.5"]
    assert not report.shapes["default_profile"]
    written = onnx.load_from_string(data)
    assert [d.dim_param or d.dim_value for d in written.graph.output[0].type.tensor_type.shape.dim] \
        == ["batch", "seq", 4, 4]
    if not report.kept_original:
        assert len(report.shapes["verified_at"]) >= 5


def _verify(candidate_graph, model):
    """The verify stage on a hand-made choice of `candidate_graph` for `model`."""
    graph = graphsub.load(model)
    context = start_run(graph, Settings.make(cost="analytic"), original=model.SerializeToString())
    data = graphsub.to_onnx(candidate_graph).SerializeToString()
    exported = [Exported(Candidate(candidate_graph, 0.0, ()), data)]
    context.sessions.hold_chosen(context.target.prepare(candidate_graph, data, "candidate"))
    try:
        return verify(context, StageClock.lasting(60), exported, Selection("faster", chosen=0))
    finally:
        context.sessions.close()


def test_verification_checks_every_binding_and_a_size_dependent_mistake_fails_it():
    model = make_model([helper.make_node("Mul", ["x", "two"], ["y"])],
                       [vi("x", ["batch", 4])], [vi("y", ["batch", 4])],
                       [init("two", np.float32(2))])
    b = GraphBuilder()
    x = b.input("x", (BATCH, 4))
    b.output(b.mul(x, b.weight(np.float32(2))), "y")
    right = b.build(GraphFacts(symbols={"batch": SymbolRange()}))
    verified = _verify(right, model)
    assert verified.chosen is not None and len(verified.verified_at) >= 5
    assert {"batch": 1} in verified.verified_at
    # right at the profile's batch of 1 only: the first row, repeated
    b = GraphBuilder()
    x = b.input("x", (BATCH, 4))
    first = b.slice(x, starts=(0,), ends=(1,), axes=(0,))
    b.output(b.mul(b.add(b.sub(x, x), first), b.weight(np.float32(2))), "y")
    wrong = b.build(GraphFacts(symbols={"batch": SymbolRange()}))
    with pytest.warns(RuntimeWarning, match="verification failed"):
        failed = _verify(wrong, model)
    assert "does not match" in str(failed.failure)
    assert failed.chosen is None and failed.model == model.SerializeToString()
    assert failed.selection.chosen is None
    assert failed.selection.outcome == "verification-failed"


def test_an_operator_reading_sizes_is_timed_at_the_sizes_it_will_see():
    """A Tile by the input's own shape (a `sizes` node; Tile is an operator graphsub does not
    model) is timed with that shape bound at the profile, not with made-up values that do not
    run."""
    from graphsub.targets import get_target
    from graphsub.cost import make_cost_model

    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Tile", ["b", "s"], ["e"]),
             helper.make_node("Add", ["x", "e"], ["y"])]
    model = make_model(nodes, [vi("x", ["batch", "seq", 8])], [vi("y", ["batch", "seq", 8])],
                       [init("b", np.full((1, 1, 1), 0.5, dtype=np.float32))])
    graph = graphsub.load(model)
    assert {"sizes", "opaque"} <= {graph[n].op for n in graph.topo_order()}
    cost_model = make_cost_model("measured", target=get_target("ort-cpu", threads=1))
    cost_model = cost_model.at_profile((ProfileShape.of({"batch": 2, "seq": 16}),))
    assert 0 < cost_model.graph_cost(graph) < 1.0
    assert cost_model.notes() == []


def test_a_model_with_open_sizes_is_optimized_under_another_objective():
    """MetaFlow's weighted sum prices symbolic operators at the run's profile (it once had
    none of its own and ended the run), and the API takes the objective as the command
    line's text."""
    rng = np.random.default_rng(5)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["h"]),
                        helper.make_node("Relu", ["h"], ["r"]),
                        helper.make_node("Relu", ["r"], ["y"])],
                       [vi("x", ["batch", 64])], [vi("y", ["batch", 64])],
                       [init("w", rng.standard_normal((64, 64)).astype(np.float32))])
    graph = graphsub.load(model)
    _, report = graphsub.optimize_model(graph, model.SerializeToString(), cost="analytic",
                                        time_limit=8, objective="latency,memory=0.3")
    assert any("minimized latency=1,memory=0.3" in note for note in report.notes)
    assert min(c.predicted_ms for c in report.candidates) < report.predicted_ms_before
    with pytest.raises(GraphsubError, match="objective takes"):
        Settings.make(objective=3)
