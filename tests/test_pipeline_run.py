"""The stage runner: stages take what earlier stages made and return what they make; the
runner gives each its clock, records its seconds and skips what makes no sense after a
Ctrl-C; no stage changes the graph it was handed."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

import graphsub
from graphsub.budget import Budget, StageClock
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
    assert deadlines[0][0] == deadlines[0][1] is not None


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
    assert exported and all(data is not None for _, data in exported)
    assert [c.graph.structural_hash() for c, _ in exported] == list(dict.fromkeys(
        c.graph.structural_hash() for c, _ in exported))


def test_the_probe_changes_no_graph_it_was_handed():
    """The model runs only at sr=16000: the probe finds it, and the search, measuring and
    verification run there; the caller's graph keeps the meta it had."""
    model = rate_model()
    graph = graphsub.load(model)
    meta = dict(graph.meta)
    _, report = graphsub.optimize_model(graph, model.SerializeToString(), cost="analytic",
                                        time_limit=5)
    assert any("it runs at sr=16000" in note for note in report.notes)
    assert graph.meta == meta


@pytest.mark.parametrize("peers", [True, False])
def test_the_settings_choose_the_optional_stages(peers):
    model = small_model()
    _, report = graphsub.optimize_model(graphsub.load(model), model.SerializeToString(),
                                        cost="analytic", time_limit=4, peers=peers)
    assert ("peers" in report.seconds) == peers
    assert {"probe", "search", "export", "measure", "verify", "report"} <= set(report.seconds)


def test_no_stage_assigns_to_what_another_stage_made():
    """Stages return values: none assigns to an attribute of its context (frozen) or of a
    value it was handed. The cost model is a service, not a value: where the probe finds
    the sizes the model runs at, it is told to price there."""
    assigned = []
    for path in sorted(PIPELINE.glob("*_stage*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
            for target in targets:
                root = target
                while isinstance(root, (ast.Attribute, ast.Subscript)):
                    root = root.value
                if ast.unparse(target) == "run.time_model.shape_profile":
                    continue
                if isinstance(target, (ast.Attribute, ast.Subscript)) and isinstance(
                        root, ast.Name) and root.id in ("context", "run", "found", "exported",
                                                        "verified"):
                    assigned.append(f"{path.name}:{node.lineno}")
    assert not assigned, assigned
