"""The peers stage: what the optimizers a user would otherwise run (onnxruntime's levels,
onnxscript's optimizer, onnxslim: graphsub.targets.peers) make of the original, as candidates
measured beside graphsub's."""

from __future__ import annotations

from graphsub.budget import StageClock
from graphsub.errors import GraphsubError
from graphsub.pipeline.run import RunContext, Stage
from graphsub.pipeline.values import Exported
from graphsub.runtime.ort_sessions import DetachedModel
from graphsub.search import Candidate
from graphsub.search.result import Step, StepKind
from graphsub.targets.peers import ModelOperators, apply_peer, installed_peers


def peer_candidates(context: RunContext, clock: StageClock) -> tuple[Exported, ...]:
    """What the optimizers a user would otherwise run (graphsub.targets.peers) make of the
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
        return ()
    import onnx

    original = ModelOperators.of(onnx.load_from_string(bytes(context.original)))
    known = {original.counts}
    made: list[Exported] = []
    peers = installed_peers(vendor=context.settings.ort_fusions)
    for at, peer in enumerate(peers):
        if clock.expired():
            context.log.note(f"not run for lack of time (their share of the search's window "
                             f"ran out): {', '.join(p.name for p in peers[at:])}; a longer "
                             "--time-limit runs them")
            break
        context.say(f"running {peer.name}")
        try:
            out = apply_peer(peer, bytes(context.original))
        except GraphsubError as exc:
            context.log.note(f"a peer's candidate was left out: {exc}")
            continue
        if out is None:
            continue
        parsed = onnx.load_from_string(out)
        operators = ModelOperators.of(parsed)
        if operators.counts in known:
            continue
        if not context.settings.ort_fusions and not operators.domains <= original.domains:
            continue  # onnxruntime's own operators: only with --ort-fusions
        known.add(operators.counts)
        trace = (Step(peer.name, float("nan"), StepKind.PEER),)
        made.append(Exported(Candidate(context.graph, float("nan"), trace), out, parsed))
    return tuple(made)


PEERS = Stage("peers", peer_candidates, out_of_time=lambda context: ())

__all__ = ["PEERS"]
