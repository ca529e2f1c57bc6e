"""The stages that choose and check: candidates timed on the target (graphsub.selection), and
the chosen one verified against the original before anything is written."""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from dataclasses import dataclass, replace

import numpy as np

from graphsub.budget import RUN_ALWAYS_BYTES, StageClock
from graphsub.errors import GraphsubError
from graphsub.ir.binding import bind_graph
from graphsub.ir.graph import Graph
from graphsub.pipeline.export_stages import written
from graphsub.pipeline.run import RunContext, Stage
from graphsub.pipeline.sessions import times_the_reference
from graphsub.pipeline.values import Exported
from graphsub.progress import step
from graphsub.runtime.check_sizes import ProfileShape, check_bindings
from graphsub.verdicts.equivalence import (SAME_FUNCTION, Comparison, Tolerance,
                                          compare_models, compare_runners, value_dtypes)
from graphsub.runtime.inputs import InputSpec, graph_input_specs, random_feeds
from graphsub.runtime.ort_sessions import ModelData, OrtRunnable
from graphsub.verdicts.speedup import Decision, describe, sequential
from graphsub.runtime.timing import Runnable
from graphsub.search.result import Candidate
from graphsub.selection import (Selection, measure_and_choose, run_original, time_once,
                                timing_options)

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


def measure(context: RunContext, clock: StageClock, exported: Sequence[Exported]
            ) -> Selection:
    """The original and the exported candidates timed on the target, side by side, the
    fastest confirmed head to head (graphsub.selection). A model with symbolic sizes is
    timed at its profile's heaviest shape; the candidate chosen there is then timed against
    the original at every other shape, and dropped where it is decided slower."""
    shapes = sorted(context.profile, key=lambda shape: -shape.weight)
    main = shapes[0].values if shapes else {}
    first = clock if len(shapes) < 2 else StageClock(
        clock.name, clock.start, time.perf_counter() + MAIN_SHAPE_SHARE * clock.remaining())
    candidates = [(_bound(e.candidate, main), e.model) for e in exported]
    graph = context.graph
    if not candidates:
        _original_runs(context, main)
    try:
        shared = _shared_session(context)
        selection, chosen = measure_and_choose(context.target, bind_graph(graph, main),
                                       context.original_model, candidates,
                                       random_feeds(graph_input_specs(graph, main)),
                                       first, context.settings.measure_seconds,
                                       say=context.say, tolerance=model_tolerance(graph),
                                       original_session=None if shared is None else (
                                           shared, context.sessions.build_seconds))
        context.sessions.hold_chosen(chosen)
    except GraphsubError as exc:
        if not main:
            raise
        # A model with open sizes may run at some sizes only (a text recognizer at a height
        # of 48): say which sizes graphsub chose, and how to give the right ones.
        raise GraphsubError(f"{exc}. The model was run with its sizes at "
                            f"{', '.join(f'{k}={v}' for k, v in sorted(main.items()))}; give "
                            "the sizes it runs at with --input-shape NAME=1x3x48x320 or "
                            "--shape-profile") from None
    if shapes:
        selection = replace(selection, timings={
            **selection.timings, "profile": [{"shape": str(shapes[0]), "role": "chosen here"}]})
        for k, shape in enumerate(shapes[1:]):
            if selection.chosen is None:
                break
            until = time.perf_counter() + clock.remaining() / (len(shapes) - 1 - k)
            selection = _not_slower_at(context, exported, selection, shape, until)
    # what the report calls predicted is latency, whatever the search minimized
    selection = replace(selection, candidates=tuple(
        replace(report, predicted_ms=context.time_model.graph_cost(candidate.graph) * 1e3)
        for report, (candidate, *_) in zip(selection.candidates, exported)))
    context.log.note_all(selection.notes)
    return selection


def _original_runs(context: RunContext, binding: dict[str, int]) -> None:
    """With no candidate to measure, the original is still run once on a target that runs
    the ONNX file, so that a model the target cannot run is refused whether or not the
    search found something (one policy: exit 2, one line, nothing written). Once the time
    limit is spent only a large model is left unrun, which a note then says: a small one
    runs in well under a second (a bfloat16 model onnxruntime's CPU provider cannot run was
    written back with exit 0 when a first run's rule checks had spent a limit of 10 s)."""
    if context.original_model is None or context.target.capabilities.runs != "onnx":
        return
    if context.budget.elapsed() >= context.budget.time_limit and \
            context.budget.measure_limit is None and \
            context.graph.weight_bytes() > RUN_ALWAYS_BYTES:
        context.log.note(f"the original was not run on {context.target.name}: the time "
                         f"limit was spent before it could be")
        return
    graph = bind_graph(context.graph, binding)
    runnable, _, _ = run_original(context.target, graph, context.original_model,
                                  random_feeds(graph_input_specs(context.graph, binding)),
                                  _shared_session(context))
    runnable.close()


def _timed_session(context: RunContext) -> Any:
    """The chosen candidate's onnxruntime session from the measuring, where the target runs
    ONNX as the reference session does (the same bytes, the same provider and threads):
    what the later checks of it run on instead of building another; else None."""
    runnable = context.sessions.chosen
    if isinstance(runnable, OrtRunnable) and times_the_reference(context.target,
                                                                 context.threads):
        return runnable.session
    return None


def _shared_session(context: RunContext) -> Any:
    """The run's session of the original for the target's `prepare`, where the target runs
    it as that session does (graphsub.pipeline.sessions); None where it prepares its own."""
    return context.sessions.for_target(context.original_model, context.threads, context.target)


#: The share of the measuring time the profile's heaviest shape gets when there are others.
MAIN_SHAPE_SHARE = 0.6


def _bound(candidate: Candidate, binding: dict[str, int]) -> Candidate:
    return candidate if not binding else dataclasses.replace(
        candidate, graph=bind_graph(candidate.graph, binding))


def _not_slower_at(context: RunContext, exported: Sequence[Exported], selection: Selection,
                   shape: ProfileShape, until: float) -> Selection:
    """Time the chosen candidate against the original at another shape of the profile: the
    selection with that timing, and, where the candidate is decided slower there, the
    original kept (with a note) and the candidate's runnable closed."""
    assert selection.chosen is not None
    binding = shape.values
    candidate, data = exported[selection.chosen].candidate, exported[selection.chosen].model
    feeds = random_feeds(graph_input_specs(context.graph, binding))
    context.say(f"timing the chosen candidate against the original at {shape}")
    original = context.target.prepare(bind_graph(context.graph, binding),
                                      context.original_model, f"original at {shape}",
                                      session=_shared_session(context))
    chosen = context.target.prepare(bind_graph(candidate.graph, binding), data,
                                    f"candidate {selection.chosen} at {shape}",
                                    session=_timed_session(context))
    try:
        run_s = max(time_once(original, feeds), time_once(chosen, feeds))
        _, result = sequential(original, chosen, feeds, until, min_gain=0.0,
                               **timing_options(run_s))
    finally:
        original.close()
        chosen.close()
    slower = result.decision is Decision.NOT_FASTER
    rows = [*selection.timings["profile"], {"shape": str(shape), **result.as_dict(),
                                            "slower": slower}]
    timed = replace(selection, timings={**selection.timings, "profile": rows})
    if not slower:
        return timed
    context.sessions.release_chosen()
    return replace(timed.noted(
        f"candidate {selection.chosen} is faster at {rows[0]['shape']} but slower at {shape} "
        f"({describe(result.as_dict())}): the original is kept"),
        chosen=None, outcome="slower-at-shape")


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
        candidate_session = None if on_target else _timed_session(context)
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


MEASURE = Stage("measure", measure)
VERIFY = Stage("verify", verify)

__all__ = ["MEASURE", "VERIFY", "VerificationError", "Verified", "check_equivalence",
           "check_equivalence_on_target", "model_tolerance"]
