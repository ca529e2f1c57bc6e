"""The measure stage: the original and the candidates timed on the target, side by side
(graphsub.selection), the fastest confirmed head to head and at every shape of the profile.
What is chosen is verified next (pipeline.verify_stage)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any
from dataclasses import replace

from graphsub.budget import RUN_ALWAYS_BYTES, StageClock
from graphsub.errors import GraphsubError
from graphsub.ir.binding import bind_graph
from graphsub.pipeline.run import RunContext, Stage
from graphsub.pipeline.values import Exported
from graphsub.pipeline.verify_stage import chosen_session, model_tolerance
from graphsub.runtime.check_sizes import ProfileShape
from graphsub.runtime.inputs import graph_input_specs, random_feeds
from graphsub.verdicts.speedup import Decision, describe, sequential
from graphsub.search.result import Candidate
from graphsub.selection import (Selection, measure_and_choose, run_original, time_once,
                                timing_options)


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
                                    session=chosen_session(context))
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


MEASURE = Stage("measure", measure)

__all__ = ["MEASURE"]
