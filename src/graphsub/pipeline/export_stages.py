"""The stages that write candidates as the target runs them: ONNX bytes, and, where asked,
onnxruntime's fused operators."""

from __future__ import annotations

from collections.abc import Sequence

from graphsub.budget import StageClock, writing_seconds
from graphsub.errors import GraphsubError
from graphsub.onnx_io.exporter import to_model_data
from graphsub.pipeline.run import RunContext, Stage
from graphsub.pipeline.values import Exported, Found
from graphsub.runtime.ort_sessions import DetachedModel, ModelData
from graphsub.search import Candidate
from graphsub.search.result import Step, StepKind
from graphsub.targets import ort_fusions as ort_fusions_module
from graphsub.targets.peers import ModelOperators




def export(context: RunContext, clock: StageClock, found: Found,
           peers: Sequence[Exported] = ()) -> tuple[Exported, ...]:
    """The distinct candidates found as ONNX, at most `settings.candidates`, with the
    `peers`' outputs after graphsub's two best; one that cannot be written is dropped with a
    note. On a target that runs the ONNX file, given the user's file, graphsub's own export
    of the unchanged graph (shape computations folded, dead and no-op nodes gone) is a
    candidate of its own where it differs from the file. A large model (RunContext.large)
    gets one candidate, the search's best: each one timed is a session holding a copy of
    the weights."""
    out: list[Exported] = []
    if context.target.capabilities.runs == "onnx" and not _export_fits(context):
        return ()
    seen = {context.graph.structural_hash()}
    limit = 1 if context.large else context.settings.candidates
    external_data = context.settings.external_data
    # A target that runs graphsub's graph (a torch program) needs no ONNX to time it: the
    # chosen candidate alone is written, after the choice (verify_stage.verify), and the
    # other candidates' export (seconds for a large model's weights) is not paid for
    deferred = context.target.capabilities.runs != "onnx"
    for c in found.result.candidates:
        if len(out) >= limit:
            break
        h = c.graph.structural_hash()
        if h in seen:
            continue
        seen.add(h)
        try:
            out.append(Exported(c, None if deferred else to_model_data(
                c.graph, external_data=external_data)))
        except GraphsubError as exc:
            context.log.note(f"candidate {len(out)} could not be written as ONNX and "
                             f"was dropped ({exc})")
    if context.large and limit < context.settings.candidates:
        context.log.note(f"the model holds {context.graph.weight_bytes() / 2**30:.1f} GiB "
                         "of weights: only the best candidate is timed against the "
                         "original, so that two copies of them are in memory at most")
    if context.original is not None and context.target.capabilities.runs == "onnx" \
            and not context.large:
        data = to_model_data(context.graph, external_data=external_data)
        if _operators(data) != _operators(context.original):
            out.insert(0, Exported(Candidate(context.graph, found.result.initial_cost, ()), data))
    # the peers' outputs (peer_candidates) after graphsub's two best: where time runs short
    # for timing them all, those are the candidates that must not go untimed
    return (*out[:2], *peers, *out[2:])


def written(context: RunContext, exported: Sequence[Exported], index: int) -> ModelData | None:
    """The ONNX of exported candidate `index`, written now where its export was deferred;
    None, with a note, where it cannot be written."""
    candidate, data = exported[index].candidate, exported[index].model
    if data is not None:
        return data
    try:
        return to_model_data(candidate.graph, external_data=context.settings.external_data)
    except GraphsubError as exc:
        context.log.note(f"candidate {index} could not be written as ONNX ({exc})")
        return None


def ort_fusions(context: RunContext, clock: StageClock, found: Found,
                exported: Sequence[Exported]) -> tuple[Exported, ...]:
    """The exported candidates, and the original and the best of them written with
    onnxruntime's fused operators, where onnxscript's patterns match them: the fusions apply
    to what graphsub's rewrites leave as well as to what the exporter wrote, and either can
    be the faster."""
    context.say("writing candidates with onnxruntime's fused operators")
    sources = [Exported(Candidate(context.graph, found.result.initial_cost, ()),
                        context.original_model), *exported[:1]]
    if any(isinstance(source.model, DetachedModel) for source in sources):
        context.log.note("onnxruntime fusions: not written for a model with external "
                         "data (onnxscript's rewriter would read all its weights into "
                         "memory)")
        return tuple(exported)
    fused_candidates = []
    for candidate, data, _ in sources:
        if data is None:
            continue
        assert not isinstance(data, DetachedModel)  # such a model returned above
        try:
            fused = ort_fusions_module.fuse(data)
        except GraphsubError as exc:
            context.log.note(f"a candidate could not be written with onnxruntime's "
                             f"fused operators: {exc}")
            continue
        if fused is not None:
            step = Step.of_kind(StepKind.ORT_FUSIONS, candidate.cost)
            fused_candidates.append(Exported(
                Candidate(candidate.graph, candidate.cost, (*candidate.trace, step)), fused))
    if not fused_candidates:
        context.log.note("onnxruntime fusions: onnxscript's patterns matched nothing in "
                         "this model")
    return (*exported, *fused_candidates)


def _operators(model: ModelData) -> ModelOperators:
    """The model's operators (bodies included): whether the normalized graph differs from
    the file."""
    import onnx

    return ModelOperators.of(onnx.load_from_string(
        model.proto if isinstance(model, DetachedModel) else model))


def _export_fits(context: RunContext) -> bool:
    """Whether writing a candidate (and so measuring it) fits in what is left of the time
    limit; where it does not, a note says so and the original is kept. A measuring limit
    given on the command line is the user's time for it."""
    budget = context.budget
    weights = context.graph.weight_bytes()
    needed = writing_seconds(weights)
    if budget.measure_limit is not None or not needed:
        return True
    left = budget.time_limit - budget.elapsed()
    if needed <= left:
        return True
    context.log.note(f"no candidate was written: writing one ({weights / 2**20:.0f} MB of "
                     f"weights, about {needed:.0f} s) does not fit in the {max(left, 0):.1f} s "
                     f"left of the time limit (--measure-limit SECONDS gives measuring its "
                     f"own time)")
    return False


#: With the time limit spent, no candidate is written (the original is kept, as read).
EXPORT = Stage("export", export, out_of_time=lambda context, found, peers=(): ())
ORT_FUSIONS = Stage("ort-fusions", ort_fusions,
                    out_of_time=lambda context, found, exported: tuple(exported))

__all__ = ["EXPORT", "ORT_FUSIONS"]
