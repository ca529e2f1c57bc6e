"""The verify stage: the chosen candidate checked against the original before anything is
written, on random inputs at several bindings of its sizes, by onnxruntime (the reference
runtime) and on the target; a candidate that differs is not written, the original is."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from graphsub.budget import StageClock
from graphsub.errors import GraphsubError
from graphsub.ir.graph import Graph
from graphsub.pipeline.export_stages import written
from graphsub.pipeline.run import RunContext, Stage
from graphsub.pipeline.sessions import times_the_reference
from graphsub.pipeline.values import Exported
from graphsub.progress import step
from graphsub.runtime.check_sizes import check_bindings
from graphsub.runtime.inputs import InputSpec, graph_input_specs, random_feeds
from graphsub.runtime.ort_sessions import ModelData, OrtRunnable
from graphsub.runtime.timing import Runnable
from graphsub.search.result import Candidate
from graphsub.selection import Selection
from graphsub.verdicts.equivalence import (SAME_FUNCTION, Comparison, Tolerance,
                                          compare_models, compare_runners, value_dtypes)

#: Sets of random inputs each verification tries.
VERIFY_TRIALS = 2


class VerificationError(GraphsubError):
    """The optimized model does not compute what the original computes."""

    def __init__(self, message: str, trace: Sequence[str], comparison: Comparison) -> None:
        super().__init__(message)
        self.trace = list(trace)
        self.comparison = comparison

    @classmethod
    def of(cls, comparison: Comparison, rules: Sequence[str]) -> VerificationError:
        """The error for a failed comparison: what failed (a missing output or a shape, then
        the outputs whose values differ; never one that passed), and the rules applied."""
        failing = list(comparison.problems) + [d.describe() for d in comparison.outputs
                                               if not d.ok]
        return cls(f"the optimized model does not match the original ({'; '.join(failing)}). "
                   f"Rules applied, in order: {', '.join(rules)}.", rules, comparison)


def chosen_session(context: RunContext) -> Any:
    """The chosen candidate's onnxruntime session from the measuring, where the target runs
    ONNX as the reference session does (the same bytes, the same provider and threads):
    what the later checks of it run on instead of building another; else None."""
    runnable = context.sessions.chosen
    if isinstance(runnable, OrtRunnable) and times_the_reference(context.target,
                                                                 context.threads):
        return runnable.session
    return None


@dataclass(frozen=True)
class Verified:
    """What the verify stage made: the model to write and what was checked. `selection` is
    the measuring's, or, where the candidate it chose was dropped here, a copy that says so
    (chosen None, the outcome why)."""

    selection: Selection
    #: The ONNX to write: the chosen candidate's, or the original's.
    model: ModelData
    #: The candidate kept (None: the original stays).
    chosen: Candidate | None = None
    #: The check of the candidate kept, or of the one that failed it.
    comparison: Comparison | None = None
    #: The candidate that failed verification (a bug of graphsub's; the original is written).
    failure: VerificationError | None = None
    #: The bindings of the sizes the chosen candidate was verified at (symbolic models).
    verified_at: tuple[dict[str, int], ...] = ()


def verify(context: RunContext, clock: StageClock, exported: Sequence[Exported],
           selection: Selection) -> Verified:
    """The chosen candidate checked against the original: in onnxruntime on the bytes to be
    written, then, unless the target is that reference runtime, on the target itself. A
    model with symbolic sizes is checked at every shape of its profile and at the bindings
    that find size-dependent mistakes (runtime.check_sizes.check_bindings: the smallest, each
    largest, odd sizes). The tolerance is float32's, or that of the half precision the model
    computes in. A mismatch (here, or already in the measuring's first runs) is a bug of
    graphsub's, reported loudly (a warning, the report's notes and `Verified.failure`); the
    original model is then written: a valid model never ends in an error."""
    original = Verified(selection, context.original_model)
    if selection.chosen is None and selection.mismatch is None:
        return original
    graph = context.graph
    shapes = sorted(context.profile, key=lambda shape: -shape.weight)
    main = shapes[0].values if shapes else {}
    tolerance = model_tolerance(graph)
    verified_at: list[dict[str, int]] = []
    if selection.mismatch is not None:  # the measurement already saw it compute otherwise
        index, comparison = selection.mismatch
        chosen, data = exported[index].candidate, None
    else:
        assert selection.chosen is not None
        chosen, data = exported[selection.chosen].candidate, written(context, exported,
                                                              selection.chosen)
        if data is None:  # it cannot be written as ONNX: the original stays (a note says why)
            context.sessions.release_chosen()
            return replace(original, selection=replace(selection, chosen=None,
                                                       outcome="not-written"))
        bindings = check_bindings(graph.facts.symbols,
                                  [s.values for s in shapes]) or [{}]
        context.say("verifying the optimized model against the original"
                    + (f" at {len(bindings)} bindings of its sizes" if main else ""))
        on_target = not context.target.capabilities.is_reference
        # on the reference runtime the candidate's timed session is the one to check (two
        # sessions in memory, the original's and its, and neither built again)
        candidate_session = None if on_target else chosen_session(context)
        if not on_target and candidate_session is None:  # two in memory at a time, not three
            context.sessions.release_chosen()
        specs = [graph_input_specs(graph, binding) for binding in bindings]
        reference = _reference_session(context)
        try:
            if on_target and reference is None:
                # onnxruntime has no kernels for the model (bfloat16 on its CPU provider):
                # graphsub's reference evaluator, computing in float32, is the reference
                context.say("onnxruntime cannot run this model: verifying with graphsub's "
                            "reference evaluator (float32 inside) and on the target")
                comparison = check_equivalence_by_reference(
                    graph, chosen.graph, context.sessions.chosen, specs, tolerance)
            else:
                comparison, compared = check_equivalence(
                    context.original_model if reference is None else reference,
                    data if candidate_session is None else candidate_session, specs,
                    context.threads, tolerance)
                bindings = [bindings[k] for k in compared]
                if comparison.equivalent and on_target:
                    assert reference is not None  # else checked by the reference evaluator
                    comparison = check_equivalence_on_target(
                        reference, context.sessions.chosen, graph_input_specs(graph, main),
                        tolerance)
        finally:
            context.sessions.release_chosen()
        if main:
            verified_at = bindings
    if not comparison.equivalent:
        failure = VerificationError.of(comparison, [s.rule for s in chosen.trace])
        message = (f"graphsub bug: verification failed: {failure} The original model is "
                   "kept; please report this with the model and the command.")
        warnings.warn(message, context.warning, stacklevel=2)
        context.log.note(message)
        return replace(original, comparison=comparison, failure=failure, selection=replace(
            selection, chosen=None, outcome="verification-failed"))
    assert data is not None
    return Verified(selection, data, chosen, comparison, verified_at=tuple(verified_at))


def model_tolerance(graph: Graph) -> Tolerance:
    """SAME_FUNCTION for the precision the graph computes in."""
    return SAME_FUNCTION.for_precision(value_dtypes(graph))


def check_equivalence(a: ModelData | Any, b: ModelData | Any,
                      bindings: Sequence[Sequence[InputSpec]], threads: int,
                      tolerance: Tolerance = SAME_FUNCTION) -> tuple[Comparison, list[int]]:
    """Whether model b computes what model a computes, in onnxruntime on random inputs of
    each binding's input types in turn (verdicts.equivalence.SAME_FUNCTION, or that for the
    model's precision): the first comparison that fails, else the last; and the bindings
    compared. A binding where the original itself fails to run is not one the model is
    defined at (a recognizer at another height than 48): it is passed over; one where only b
    fails is a failed comparison. One session of each serves every binding: `a` and `b` are
    models, or sessions of them already built (the run's session of its original)."""
    from graphsub.runtime.ort_sessions import make_session, run

    first, second = (m if hasattr(m, "run") else make_session(m, threads) for m in (a, b))
    compared: list[int] = []
    comparison = Comparison(False, (), tolerance, 0, ("the original runs at none of the sizes "
                                                      "it was checked at",))
    with step("verify", len(bindings), "bindings") as tracker:
        for k, specs in enumerate(bindings):
            tracker.advance()
            try:
                comparison = compare_models(first, second, specs, tolerance,
                                            trials=VERIFY_TRIALS)
            except Exception as exc:  # noqa: BLE001 (onnxruntime's own types)
                try:  # the original run again only where a run failed: which one was it?
                    run(first, random_feeds(specs))
                except Exception:  # noqa: BLE001 - the model is not defined at these sizes
                    continue
                first_line = str(exc).strip().splitlines()[0][:200] if str(exc) else ""
                comparison = Comparison(False, (), tolerance, VERIFY_TRIALS, (
                    f"the optimized model fails where the original runs ({first_line})",))
            compared.append(k)
            if not comparison.equivalent:
                break
    return comparison, compared


def check_equivalence_on_target(original: Any, runnable: Runnable,
                                specs: Sequence[InputSpec],
                                tolerance: Tolerance = SAME_FUNCTION) -> Comparison:
    """Whether the chosen graph, as the target runs it, computes what the original model
    computes in onnxruntime (`original`: its session; verdicts.equivalence.SAME_FUNCTION, or
    the tolerance for its precision)."""
    from graphsub.runtime.ort_sessions import run

    return compare_runners(lambda feeds: run(original, feeds), runnable.run, specs,
                           tolerance, trials=VERIFY_TRIALS)


def _reference_session(context: RunContext) -> Any:
    """The run's onnxruntime session of the original (pipeline.sessions), or None where
    onnxruntime cannot build one (it has no kernels for the model: bfloat16 on its CPU
    provider)."""
    try:
        return context.sessions.reference(context.original_model, context.threads,
                                          context.target)
    except Exception:  # noqa: BLE001 - onnxruntime's own error types
        return None


def check_equivalence_by_reference(original: Graph, candidate: Graph, runnable: Runnable,
                                   bindings: Sequence[Sequence[InputSpec]],
                                   tolerance: Tolerance = SAME_FUNCTION) -> Comparison:
    """Whether the candidate graph computes what the original graph computes, both by
    graphsub's reference evaluator (half precision computed in float32 and rounded), at each
    binding; and whether the target's run of it does too (at the first): for models
    onnxruntime has no kernels for."""
    from graphsub.runtime.reference import evaluate

    def by_reference(graph: Graph) -> Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]:
        return lambda feeds: evaluate(graph, dict(feeds))

    comparison = compare_runners(by_reference(original), runnable.run, bindings[0], tolerance,
                                 trials=VERIFY_TRIALS)
    for specs in bindings if comparison.equivalent else ():
        comparison = compare_runners(by_reference(original), by_reference(candidate), specs,
                                     tolerance, trials=VERIFY_TRIALS)
        if not comparison.equivalent:
            break
    return comparison


VERIFY = Stage("verify", verify)

__all__ = ["VERIFY", "VERIFY_TRIALS", "VerificationError", "Verified", "check_equivalence",
           "check_equivalence_by_reference", "check_equivalence_on_target", "chosen_session",
           "model_tolerance"]
