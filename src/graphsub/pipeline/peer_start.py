"""The peers' outputs as graphs the search can continue from.

A peer (graphsub.targets.peers) is a candidate as it stands; but what onnxsim or onnxslim
folded and what graphsub's rules rewrite are often different parts of one model, and a
candidate made of both beats either. So the search stage imports the peers' outputs, prices
them with the run's cost model, and continues the search from the one priced cheapest, in
a share of its time (search_stage.PEER_SEARCH_SHARE); the candidates found that way say which
peer they were built on (their trace starts with its step).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from graphsub.cost import CostModel
from graphsub.errors import GraphsubError
from graphsub.ir.graph import Graph
from graphsub.pipeline.run import RunContext
from graphsub.pipeline.values import Exported
from graphsub.runtime.ort_sessions import DetachedModel
from graphsub.search.result import Step, StepKind
from graphsub.tensors.types import TensorType

if TYPE_CHECKING:
    import onnx


#: What the import of the user's model learnt that holds for any graph of the same function
#: with the same inputs: the values given to inputs, how the inputs were declared.
_CARRIED_FACTS = ("input_values", "inputs_as_declared", "input_dims", "output_dims")


#: The peers' outputs imported and priced at most, fewest operators first (the more a peer
#: folded, the better a start; importing a 10 MB model takes seconds of the search's time).
MAX_PRICED = 2


@dataclass(frozen=True)
class PeerStart:
    """A peer's output imported: its graph, the step that names the peer, and its price."""

    graph: Graph
    step: Step
    cost: float


def peer_start(context: RunContext, peers: Sequence[Exported], cost_model: CostModel,
               below: float) -> PeerStart | None:
    """The peer output the search should continue from: of the MAX_PRICED of `peers` with
    the fewest operators, the one priced cheapest by `cost_model`, where that is below `below`
    (the input graph's price: a peer that gained nothing the cost model sees is no better a
    start than the input). A peer's output graphsub cannot import with the original's
    inputs and outputs is passed over, with a note."""
    import onnx

    outputs = [(candidate.trace[0], parsed if parsed is not None
                else onnx.load_from_string(bytes(data)))
               for candidate, data, parsed in peers
               if len(candidate.trace) == 1 and candidate.trace[0].kind is StepKind.PEER
               and data is not None and not isinstance(data, DetachedModel)]
    best: PeerStart | None = None
    for step, proto in sorted(outputs, key=lambda output: len(output[1].graph.node)
                              )[:MAX_PRICED]:
        try:
            graph = _imported(context.graph, proto)
        except Exception as exc:  # noqa: BLE001 (a peer's output: whatever fails, the run goes on)
            message = str(exc).strip().splitlines()[0] if str(exc).strip() else \
                type(exc).__name__
            context.log.note(f"the search could not start from {step.rule}'s output: "
                             f"{message}")
            continue
        cost = cost_model.graph_cost(graph)
        if math.isfinite(cost) and cost < below and (best is None or cost < best.cost):
            best = PeerStart(graph, step, cost)
    return best


def _imported(original: Graph, proto: onnx.ModelProto) -> Graph:
    """A peer's output as a graph with the original's inputs, outputs and what was learnt
    about them; GraphsubError where it differs from the original in those."""
    from graphsub.onnx_io.importer import load

    weights = {i.name for i in proto.graph.initializer}
    if [i.name for i in proto.graph.input if i.name not in weights] != \
            list(original.input_names):
        raise GraphsubError("its inputs differ from the original's")
    fixed = {original[i].attrs["name"]: tuple(original[i].type.shape) for i in original.inputs
             if original[i].type.is_static}
    graph = load(proto, fixed)
    if [(graph[i].attrs["name"], graph[i].type) for i in graph.inputs] != \
            [(original[i].attrs["name"], original[i].type) for i in original.inputs]:
        raise GraphsubError("its inputs differ from the original's")
    if graph.output_names != original.output_names or not all(
            _same_kind(graph.type_of(a), original.type_of(b))
            for a, b in zip(graph.outputs, original.outputs)):
        raise GraphsubError("its outputs differ from the original's")
    return graph.with_facts(**{key: getattr(original.facts, key) for key in _CARRIED_FACTS})


def _same_kind(a: TensorType, b: TensorType) -> bool:
    """Whether two output types agree where both are known: dtype, rank and the sizes both
    give as numbers (symbolic sizes may be written as different expressions of one size)."""
    return a.dtype == b.dtype and a.rank == b.rank and all(
        x == y for x, y in zip(a.shape, b.shape) if type(x) is int and type(y) is int)


__all__ = ["PeerStart", "peer_start"]
