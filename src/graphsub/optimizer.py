"""The optimizer's Python API: `optimize` (the search alone) and `optimize_model` (search,
measure, choose, verify, report), both running graphsub.pipeline's stages.

The target (`graphsub.targets`) names where the model will run: onnxruntime on the CPU or a
GPU, or graphsub's torch backend on the CPU or a GPU. Search costs are predictions (measured
per operator on the target, or analytic). After the search, the original model and the few
best candidates are timed end to end on the target, side by side; the fastest is then timed
head to head against the original and replaces it only if the measurement shows it faster
(graphsub.selection). Otherwise the original is kept and the report says why. Whatever is
chosen is checked against the original on random inputs before anything is written (in
onnxruntime, on the ONNX bytes to be written, and on the target itself unless it is that
reference): a mismatch is an error, never a warning.

Settings come as one `Settings` (graphsub.pipeline.settings), or as keywords that make one:

    result = graphsub.optimize(graph, algorithm="mcts", time_limit=30, c=1.4)
    data, report = graphsub.optimize_model(graph, settings=Settings.make(target="ort-cpu"))

Rules given are added to the built-in library (its normal form and search rules stay);
`rules_only=True` searches with them alone (graphsub.pipeline.rule_sets):

    result = graphsub.optimize(graph, load_rules(["my.rules"]))                   # and the library
    result = graphsub.optimize(graph, load_rules(["my.rules"]), rules_only=True)  # mine alone
"""

from __future__ import annotations

import time
from dataclasses import replace
from collections.abc import Callable, Sequence
from typing import Any

from graphsub.budget import Budget
from graphsub.ir.graph import Graph
from graphsub.loaded import LoadedModel
from graphsub.pipeline import (SEARCH, RuleSet, Settings, VerificationError, optimize_stages,
                               run_stage, start_run)
from graphsub.progress import StepLog, current_reporter, reporting
from graphsub.report.optimize import OptimizeReport
from graphsub.rules import Rule
from graphsub.runtime.ort_sessions import ModelData
from graphsub.search import OptimizeResult
from graphsub.search.result import ProgressFn


def settings_of(settings: Settings | None, overrides: dict[str, Any]) -> Settings:
    """`settings` with `overrides` (keywords of Settings.make; None: not given), or Settings
    made from them. Another algorithm keeps only the options it has."""
    given = {k: v for k, v in overrides.items() if v is not None}
    if settings is None:
        return Settings.make(**given)
    if not given:
        return settings
    return settings.replace(**given)


def optimize(graph: Graph, rules: Sequence[Rule] | RuleSet | None = None,
             algorithm: str | None = None, *, rules_only: bool = False,
             settings: Settings | None = None, progress: ProgressFn | None = None,
             **overrides: Any) -> OptimizeResult:
    """Search for a cheaper equivalent graph under a cost model (the search alone, in the
    whole time limit). A cost model given by name is built for the target (measured there,
    or the analytic profile that approximates it). `rules` are added to the built-in library
    (a rule of a library rule's name used in its place), or searched with alone under
    `rules_only`, the normal form then being whatever normal-form rules they declare; a
    RuleSet (pipeline.load_rule_files) is taken as it was chosen.

    `overrides` are keywords of Settings.make: `time_limit`, `budget` (the algorithm's own
    unit of work: graphs expanded for backtracking and greedy, MCTS iterations per decision,
    e-graph iterations), `cost`, `target`, `split`, `executor`, `keep`, and the algorithm's
    options by name (`alpha`, `k`, `node_limit`, `c`, ...); one the algorithm does not have is
    a GraphsubError naming those it has."""
    if algorithm is not None:
        overrides["algorithm"] = algorithm
    chosen = settings_of(settings, overrides).replace(fission=False)
    context = start_run(graph, chosen, rules, Budget(chosen.time_limit, measuring=False),
                        rules_only=rules_only, progress=progress)
    return run_stage(context, SEARCH).result


def optimize_model(model: Graph | LoadedModel, original: ModelData | None = None,
                   label: str | None = None, rules: Sequence[Rule] | RuleSet | None = None, *,
                   rules_only: bool = False, settings: Settings | None = None,
                   progress: ProgressFn | None = None,
                   say: Callable[[str], None] | None = None, started: float | None = None,
                   **overrides: Any) -> tuple[ModelData, OptimizeReport]:
    """Optimize for a target, choose by measurement there, verify. `model` is what
    `graphsub.open_model` made of a file (with its input shapes and values: the original
    and the label come with it), or a graph, with the ONNX of the original where there is
    one. Returns the ONNX model to write with `graphsub.save` (the original model's when
    nothing beats it: bytes, or a
    runtime.ort.DetachedModel where its weights are kept apart) and the report. Raises
    VerificationError on a mismatch, and nothing should then be written. `say` is told what
    is happening (the search starting, then each stage), for progress displays. `rules` and
    `rules_only` are `optimize`'s; the report's notes say what the choice of rules left out.

    The time limit covers the whole run from `started` (a time.perf_counter() value;
    default: now): graphsub.budget shares it among the stages. A run may overshoot by the
    verification of a chosen candidate, which is never skipped. `overrides` are keywords of
    Settings.make (see `optimize`), among them `fission` (also split the best graph into
    primitives and orchestrate its kernels: one more candidate), `ort_fusions` (also write
    candidates with onnxruntime's fused operators, on targets that take them) and `evidence`
    (what the report's HTML page draws; callers that never show a report leave it out)."""
    if isinstance(model, LoadedModel):
        graph, original, label = model.graph, original or model.original, label or model.label
    else:
        graph = model
    chosen = settings_of(settings, overrides)
    budget = Budget(chosen.time_limit, chosen.measure_limit, fission=chosen.fission,
                    started=time.perf_counter() if started is None else started)
    context = start_run(graph, chosen, rules, budget, rules_only=rules_only, original=original,
                        label=label or "model", say=say or (lambda message: None),
                        progress=progress)
    log = StepLog(forward=current_reporter())
    with reporting(log):
        outcome = optimize_stages(context)
    # the run's seconds and long steps are known once every stage has ended
    return outcome.model, replace(outcome.report, seconds=budget.as_dict(), steps={
        **outcome.report.steps, **{name: count.as_dict() for name, count in log.steps.items()}})


__all__ = ["Settings", "VerificationError", "optimize", "optimize_model"]
