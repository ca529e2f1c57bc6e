"""The stage runner: stages take what earlier stages made and return what they make; the
runner gives each its clock, records its seconds and skips what makes no sense after a
Ctrl-C; no stage changes the graph it was handed."""

from __future__ import annotations

import ast
import time
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

import graphsub
from graphsub.targets import get_target
from graphsub.budget import PRICING_SHARE, Budget, StageClock
from graphsub.cost import AnalyticCostModel, MeasuredCostModel
from graphsub.pipeline import (EXPORT, FISSION, SEARCH, Found, RunContext, Settings, Stage,
                               run_stage, start_run)
from tests.onnx_io.helpers import init, make_model, vi
from tests.runtime.test_probe import rate_model

PIPELINE = Path(__file__).resolve().parents[1] / "src" / "graphsub" / "pipeline"


def small_model():
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "a"], ["p"]),
             helper.make_node("MatMul", ["x", "b"], ["q"]),
             helper.make_node("Add", ["p", "q"], ["y"])]
    return make_model(nodes, [vi("x", [4, 16])], [vi("y", [4, 16])],
                      [init("a", rng.standard_normal((16, 16)).astype(np.float32)),
                       init("b", rng.standard_normal((16, 16)).astype(np.float32))])


def context_of(model, **settings) -> RunContext:
    return start_run(graphsub.load(model), Settings.make(cost="analytic", **settings),
                     budget=Budget(5.0, measuring=False), original=model.SerializeToString())


def test_a_stage_gets_its_inputs_and_clock_and_its_seconds_are_recorded():
    context = context_of(small_model())
    seen = []

    def doubled(ctx: RunContext, clock: StageClock, value: int) -> int:
        seen.append((ctx, clock.name))
        return 2 * value

    assert run_stage(context, Stage("double", doubled), 21) == 42
    assert seen == [(context, "double")]
    assert "double" in context.budget.seconds


def test_a_pricing_stage_points_the_cost_models_deadline_at_its_clock():
    context = context_of(small_model())
    deadlines = []

    def priced(ctx: RunContext, clock: StageClock) -> None:
        deadlines.append((ctx.time_model.deadline, clock.deadline))

    run_stage(context, Stage("search", priced, prices=True))
    (timing_until, stage_deadline), = deadlines
    assert stage_deadline is not None and timing_until < stage_deadline


def test_timing_operators_takes_at_most_its_share_of_a_pricing_stage():
    clock = StageClock("search", start=100.0, end=110.0)
    assert clock.pricing_deadline() == pytest.approx(100.0 + 10 * PRICING_SHARE)
    assert StageClock("verify", start=100.0, end=None).pricing_deadline() is None


def many_signatures_model():
    """Ten products of one input with weights of ten widths, each through a ReLU (twenty
    signatures to time), and two products of it summed (what the search rewrites)."""
    rng = np.random.default_rng(1)
    nodes, inits, outputs = [], [], [vi("y", [4, 16])]
    for i in range(10):
        nodes += [helper.make_node("MatMul", ["x", f"w{i}"], [f"p{i}"]),
                  helper.make_node("Relu", [f"p{i}"], [f"r{i}"])]
        inits.append(init(f"w{i}", rng.standard_normal((16, 8 + i)).astype(np.float32)))
        outputs.append(vi(f"r{i}", [4, 8 + i]))
    nodes += [helper.make_node("MatMul", ["x", "a"], ["pa"]),
              helper.make_node("MatMul", ["x", "b"], ["pb"]),
              helper.make_node("Add", ["pa", "pb"], ["y"])]
    inits += [init(n, rng.standard_normal((16, 16)).astype(np.float32)) for n in "ab"]
    return make_model(nodes, [vi("x", [4, 16])], outputs, inits)


def test_a_search_whose_operators_time_slowly_still_searches(monkeypatch):
    """Timing each operator takes 0.25 s: pricing the input graph alone would take the whole
    time limit (it did, for a float16 decoder's part on a GPU, whose search then got none).
    Timing stops at PRICING_SHARE of the stage; the rest is priced in the timed operators'
    unit, and the search has its time."""
    target = get_target("ort-cpu", threads=1)
    analytic = AnalyticCostModel(target.analytic_profile, target.free_views)

    def slowly_timed(sig, cold_weights=False):
        time.sleep(0.25)
        return 3.0 * analytic.op_cost(sig)

    monkeypatch.setattr(target, "time_op", slowly_timed)
    time_model = MeasuredCostModel(target=target, cache=False)
    context = start_run(graphsub.load(many_signatures_model()),
                        Settings.make(cost=time_model, target=target),
                        budget=Budget(3.0, measuring=False))
    found = run_stage(context, SEARCH)
    assert time_model.late > 0 and 0 < time_model.measured < 20
    assert found.result.trace, "the search found nothing"
    assert found.result.final_cost < found.result.initial_cost


def test_after_a_ctrl_c_in_the_search_a_skippable_stage_returns_its_skipped_value():
    context = context_of(small_model())
    found = Found.unsearched(context)
    context.budget.interrupted()
    assert run_stage(context, FISSION, found) is found
    assert "fission" not in context.budget.seconds


def test_search_fission_and_export_hand_on_values():
    context = context_of(small_model(), fission=True)
    found = run_stage(context, SEARCH)
    assert found.fission is None and found.result.stats.seconds > 0
    split = run_stage(context, FISSION, found)
    assert split.fission is not None and split is not found
    assert found.fission is None  # what the search made is unchanged
    exported = run_stage(context, EXPORT, split, ())
    assert exported and all(e.model is not None for e in exported)
    assert [e.candidate.graph.structural_hash() for e in exported] == list(dict.fromkeys(
        e.candidate.graph.structural_hash() for e in exported))


def test_the_probe_changes_no_graph_it_was_handed():
    """The model runs only at sr=16000: the probe finds it, and the search, measuring and
    verification run there; the caller's graph keeps the facts it had (no input values)."""
    model = rate_model()
    graph = graphsub.load(model)
    facts = graph.facts
    _, report = graphsub.optimize_model(graph, model.SerializeToString(), cost="analytic",
                                        time_limit=5)
    assert any("it runs at sr=16000" in note for note in report.notes)
    assert graph.facts is facts and not facts.input_values


@pytest.mark.parametrize("peers", [True, False])
def test_the_settings_choose_the_optional_stages(peers):
    model = small_model()
    _, report = graphsub.optimize_model(graphsub.load(model), model.SerializeToString(),
                                        cost="analytic", time_limit=4, peers=peers)
    assert ("peers" in report.seconds) == peers
    assert {"probe", "search", "export", "measure", "verify", "report"} <= set(report.seconds)


def test_no_stage_assigns_to_what_another_stage_made():
    """Stages return values: none assigns to an attribute of its context (frozen) or of a
    value it was handed (where the probe finds the sizes the model runs at, its context
    has a cost model made for them: CostModel.at_profile)."""
    assigned = []
    for path in sorted(PIPELINE.glob("*_stage*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
            for target in targets:
                root = target
                while isinstance(root, (ast.Attribute, ast.Subscript)):
                    root = root.value
                if isinstance(target, (ast.Attribute, ast.Subscript)) and isinstance(
                        root, ast.Name) and root.id in ("context", "run", "found", "exported",
                                                        "selection", "verified"):
                    assigned.append(f"{path.name}:{node.lineno}")
    assert not assigned, assigned
