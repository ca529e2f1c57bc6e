"""The stages that write candidates as the target runs them: ONNX bytes, and, where asked,
onnxruntime's fused operators."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

from graphsub.backends import ort_fusions as ort_fusions_module
from graphsub.backends.peers import apply_peer, installed_peers, operator_domains
from graphsub.budget import StageClock, writing_seconds
from graphsub.errors import GraphsubError
from graphsub.onnx_io.exporter import to_model_data
from graphsub.ops.control_flow import all_graphs
from graphsub.pipeline.run import RunContext, Stage
from graphsub.runtime.ort import DetachedModel, ModelData
from graphsub.search import Candidate
from graphsub.search.result import Step, StepKind

if TYPE_CHECKING:
    from graphsub.pipeline.search_stages import Found

#: A candidate and its ONNX as the target runs it (None: written only if it is chosen, on a
#: target that runs graphsub's graph, not the file).
Exported = tuple[Candidate, ModelData | None]


def export(context: RunContext, clock: StageClock, found: Found,
           peers: Sequence[Exported] = ()) -> list[Exported]:
    """The distinct candidates found as ONNX, at most `settings.candidates`, with the
    `peers`' outputs after graphsub's two best; one that cannot be written is dropped with a
    note. On a target that runs the ONNX file, given the user's file, graphsub's own export
    of the unchanged graph (shape computations folded, dead and no-op nodes gone) is a
    candidate of its own where it differs from the file. A large model (RunContext.large)
    gets one candidate, the search's best: each one timed is a session holding a copy of
    the weights."""
    out: list[Exported] = []
    if context.target.capabilities.runs == "onnx" and not _export_fits(context):
        return out
    seen = {context.graph.structural_hash()}
    limit = 1 if context.large else context.settings.candidates
    external_data = context.settings.external_data
    # A target that runs graphsub's graph (a torch program) needs no ONNX to time it: the
    # chosen candidate alone is written, after the choice (measure_stages.verify), and the
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
            out.append((c, None if deferred else to_model_data(c.graph,
                                                               external_data=external_data)))
        except GraphsubError as exc:
            context.notes.append(f"candidate {len(out)} could not be written as ONNX and "
                                 f"was dropped ({exc})")
    if context.large and limit < context.settings.candidates:
        context.notes.append(f"the model holds {context.graph.weight_bytes() / 2**30:.1f} GiB "
                             "of weights: only the best candidate is timed against the "
                             "original, so that two copies of them are in memory at most")
    if context.original is not None and context.target.capabilities.runs == "onnx" \
            and not context.large:
        data = to_model_data(context.graph, external_data=external_data)
        if _op_counts(data) != _op_counts(context.original):
            out.insert(0, (Candidate(context.graph, found.result.initial_cost, ()), data))
    # the peers' outputs (peer_candidates) after graphsub's two best: where time runs short
    # for timing them all, those are the candidates that must not go untimed
    return out[:2] + list(peers) + out[2:]


def written(context: RunContext, exported: Sequence[Exported], index: int) -> ModelData | None:
    """The ONNX of exported candidate `index`, written now where its export was deferred;
    None, with a note, where it cannot be written."""
    candidate, data = exported[index]
    if data is not None:
        return data
    try:
        return to_model_data(candidate.graph, external_data=context.settings.external_data)
    except GraphsubError as exc:
        context.notes.append(f"candidate {index} could not be written as ONNX ({exc})")
        return None


def ort_fusions(context: RunContext, clock: StageClock, found: Found,
                exported: Sequence[Exported]) -> list[Exported]:
    """The exported candidates, and the original and the best of them written with
    onnxruntime's fused operators, where onnxscript's patterns match them: the fusions apply
    to what graphsub's rewrites leave as well as to what the exporter wrote, and either can
    be the faster."""
    context.say("writing candidates with onnxruntime's fused operators")
    sources = [(Candidate(context.graph, found.result.initial_cost, ()),
                context.original_model), *exported[:1]]
    if any(isinstance(data, DetachedModel) for _, data in sources):
        context.notes.append("onnxruntime fusions: not written for a model with external "
                             "data (onnxscript's rewriter would read all its weights into "
                             "memory)")
        return list(exported)
    fused_candidates = []
    for candidate, data in sources:
        if data is None:
            continue
        assert not isinstance(data, DetachedModel)  # such a model returned above
        try:
            fused = ort_fusions_module.fuse(data)
        except GraphsubError as exc:
            context.notes.append(f"a candidate could not be written with onnxruntime's "
                                 f"fused operators: {exc}")
            continue
        if fused is not None:
            step = Step.of_kind(StepKind.ORT_FUSIONS, candidate.cost)
            fused_candidates.append(
                (Candidate(candidate.graph, candidate.cost, (*candidate.trace, step)), fused))
    if not fused_candidates:
        context.notes.append("onnxruntime fusions: onnxscript's patterns matched nothing in "
                             "this model")
    return [*exported, *fused_candidates]


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
    context.notes.append(f"no candidate was written: writing one ({weights / 2**20:.0f} MB of "
                         f"weights, about {needed:.0f} s) does not fit in the {max(left, 0):.1f} s "
                         f"left of the time limit (--measure-limit SECONDS gives measuring its "
                         f"own time)")
    return False


def peer_candidates(context: RunContext, clock: StageClock) -> list[Exported]:
    """What the optimizers a user would otherwise run (graphsub.backends.peers) make of the
    original, as candidates the export stage keeps beside graphsub's: graphsub then never
    hands back a model slower than the best of them that it measured. Run before the search,
    so that their seconds (a few for a 10 MB model) come out of the search's time, not the
    measuring's. Only on a target that runs the ONNX file in onnxruntime, and not for a large
    model (RunContext.large: each candidate timed is a session with a copy of its weights); a peer
    that fails or changes nothing is left out, with a note where it failed, and so is one
    that brings in operators of another domain (onnxruntime's com.microsoft) unless the user
    accepts them (--ort-fusions). The peers run cheapest first, each started while the
    stage's share of the search's window (budget.PEERS_SHARE) lasts: a peer cannot be stopped
    halfway, and onnxsim's import alone takes seconds."""
    if context.target.capabilities.runs != "onnx" or context.large \
            or context.original is None or isinstance(context.original, DetachedModel):
        return []
    original = bytes(context.original)
    known = [_op_counts(original)]
    made: list[Exported] = []
    peers = installed_peers(vendor=context.settings.ort_fusions)
    for at, peer in enumerate(peers):
        if clock.expired():
            context.notes.append(f"not run for lack of time (their share of the search's window "
                             f"ran out): {', '.join(p.name for p in peers[at:])}; a longer "
                             "--time-limit runs them")
            break
        context.say(f"running {peer.name}")
        try:
            out = apply_peer(peer, original)
        except GraphsubError as exc:
            context.notes.append(f"a peer's candidate was left out: {exc}")
            continue
        if out is None or _op_counts(out) in known:
            continue
        if not context.settings.ort_fusions and not operator_domains(out) <= \
                operator_domains(original):
            continue  # onnxruntime's own operators: only with --ort-fusions
        known.append(_op_counts(out))
        trace = (Step(peer.name, float("nan"), StepKind.PEER),)
        made.append((Candidate(context.graph, float("nan"), trace), out))
    return made


def _op_counts(model: ModelData) -> Counter[str]:
    """The model's operators by type, those of its control-flow bodies included."""
    import onnx

    proto = onnx.load_from_string(model.proto if isinstance(model, DetachedModel) else model)
    return Counter(n.op_type for g in all_graphs(proto.graph) for n in g.node)


#: With the time limit spent, no candidate is written (the original is kept, as read).
EXPORT = Stage("export", export, out_of_time=lambda context, found, peers=(): [])
ORT_FUSIONS = Stage("ort-fusions", ort_fusions,
                    out_of_time=lambda context, found, exported: list(exported))
PEERS = Stage("peers", peer_candidates, out_of_time=lambda context: [])

__all__ = ["EXPORT", "Exported", "ORT_FUSIONS", "PEERS"]
