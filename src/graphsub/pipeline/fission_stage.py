"""The fission stage: the search's best graph split into primitives and its kernels
orchestrated on the target (graphsub.fission), as one more candidate."""

from __future__ import annotations

import warnings
from dataclasses import replace

from graphsub.budget import StageClock
from graphsub.errors import GraphsubError
from graphsub.fission.stage import fission_and_orchestrate
from graphsub.pipeline.run import RunContext, Stage
from graphsub.pipeline.values import Found
from graphsub.search import Candidate
from graphsub.search.result import Step, StepKind


def fission(context: RunContext, clock: StageClock, found: Found) -> Found:
    """The search's best graph split into primitives and its kernels orchestrated on the
    target: a candidate of its own, placed among the first `settings.candidates` so that it
    is timed. A failure inside is a warning and a note, never the end of the run: what was
    found is then handed on as it was."""
    base = found.candidates()[0]
    seconds = clock.remaining()
    context.say(f"splitting operators and orchestrating kernels for up to {seconds:.1f} s")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # untimed operators: in the notes
            outcome = fission_and_orchestrate(
                base.graph, found.cost_model, context.target.runs_as_one_kernel,
                time_limit=seconds,
                generate=context.target.generates_kernels and context.generate_kernels)
    except (GraphsubError, ValueError, RuntimeError) as exc:
        warnings.warn(f"fission and orchestration failed and were skipped: {exc}",
                      context.warning, stacklevel=2)
        context.log.note(f"fission and orchestration failed and were skipped: {exc}")
        return found
    except KeyboardInterrupt:
        context.budget.interrupted()
        context.say("interrupted: fission skipped; measuring what the search found")
        return found
    candidates = list(found.result.candidates)
    known = {c.graph.structural_hash() for c in candidates} | {
        context.graph.structural_hash()}
    if outcome.graph.structural_hash() not in known:
        candidate = Candidate(outcome.graph, outcome.cost,
                              base.trace + (Step.of_kind(StepKind.FISSION, outcome.cost),))
        at = 0 if outcome.cost < base.cost else min(1, len(candidates))
        candidates.insert(min(at, max(context.settings.candidates - 1, 0)), candidate)
    return replace(found, result=replace(found.result, candidates=tuple(candidates)),
                   fission=outcome)


#: After a Ctrl-C, what was found goes on as it is: measured and verified, not split.
FISSION = Stage("fission", fission, prices=True, skipped=lambda found: found,
                out_of_time=lambda context, found: found)

__all__ = ["FISSION"]
