"""The stages that choose and check: candidates timed on the target (graphsub.selection), and
the chosen one verified against the original before anything is written."""

from __future__ import annotations

from collections.abc import Sequence

from graphsub.budget import StageClock
from graphsub.errors import GraphsubError
from graphsub.pipeline.run import Run, Stage
from graphsub.runtime.equivalence import (SAME_FUNCTION, Comparison, compare_models,
                                          compare_runners)
from graphsub.runtime.inputs import InputSpec, graph_input_specs, random_feeds
from graphsub.runtime.timing import Runnable
from graphsub.selection import measure_and_choose

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
        return cls(f"the optimized model does not match the original ({'; '.join(failing)}); "
                   f"nothing was written. Rules applied, in order: {', '.join(rules)}",
                   rules, comparison)


def measure(run: Run, clock: StageClock) -> None:
    """The original and the exported candidates timed on the target, side by side, the
    fastest confirmed head to head (graphsub.selection)."""
    specs = graph_input_specs(run.graph)
    run.selection = measure_and_choose(run.target, run.graph, run.original_bytes, run.exported,
                                       random_feeds(specs), clock,
                                       run.settings.measure_seconds, say=run.say)
    # what the report calls predicted is latency, whatever the search minimized
    for report, (candidate, _) in zip(run.selection.candidates, run.exported):
        report.predicted_ms = run.time_model.graph_cost(candidate.graph) * 1e3
    run.notes += run.selection.notes


def verify(run: Run, clock: StageClock) -> None:
    """The chosen candidate checked against the original: in onnxruntime on the bytes to be
    written, then, unless the target is that reference runtime, on the target itself. A
    mismatch (here, or already in the measuring's first runs) raises VerificationError and
    nothing is written."""
    selection = run.selection
    run.chosen_bytes = run.original_bytes
    if selection is None or (selection.chosen is None and selection.mismatch is None):
        return
    specs = graph_input_specs(run.graph)
    if selection.mismatch is not None:  # the measurement already saw it compute otherwise
        index, comparison = selection.mismatch
        chosen = run.exported[index][0]
    else:
        chosen, data = run.exported[selection.chosen]
        run.say("verifying the optimized model against the original")
        try:
            comparison = check_equivalence(run.original_bytes, data, specs,
                                           run.threads)
            if comparison.equivalent and not run.target.capabilities.is_reference:
                comparison = check_equivalence_on_target(run.original_bytes, selection.runnable,
                                                         specs, run.threads)
        finally:
            selection.runnable.close()
    if not comparison.equivalent:
        raise VerificationError.of(comparison, [s.rule for s in chosen.trace])
    run.chosen, run.comparison = chosen, comparison
    run.chosen_bytes = run.exported[selection.chosen][1]


def check_equivalence(a: bytes, b: bytes, specs: Sequence[InputSpec], threads: int
                      ) -> Comparison:
    """Whether model b computes what model a computes, in onnxruntime on random inputs
    (runtime.equivalence.SAME_FUNCTION)."""
    return compare_models(a, b, specs, SAME_FUNCTION, trials=VERIFY_TRIALS, threads=threads)


def check_equivalence_on_target(original: bytes, runnable: Runnable,
                                specs: Sequence[InputSpec], threads: int) -> Comparison:
    """Whether the chosen graph, as the target runs it, computes what the original model
    computes in onnxruntime (runtime.equivalence.SAME_FUNCTION)."""
    from graphsub.runtime.ort import make_session, run

    session = make_session(original, threads)
    return compare_runners(lambda feeds: run(session, feeds), runnable.run, specs,
                           SAME_FUNCTION, trials=VERIFY_TRIALS)


MEASURE = Stage("measure", measure)
VERIFY = Stage("verify", verify)

__all__ = ["MEASURE", "VERIFY", "VerificationError", "check_equivalence",
           "check_equivalence_on_target"]
