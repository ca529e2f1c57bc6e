"""The values the main job's stages hand each other (graphsub.pipeline.model writes out who
hands what to whom): immutable, so that no stage changes what another made."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from graphsub.cost import CostModel
from graphsub.fission.stage import FissionOutcome
from graphsub.pipeline.bodies import BodyOutcome
from graphsub.pipeline.run import RunContext
from graphsub.runtime.ort_sessions import ModelData
from graphsub.search import Candidate, OptimizeResult, SearchStats
from graphsub.search.result import StopReason

if TYPE_CHECKING:
    import onnx


class Exported(NamedTuple):
    """A candidate and its ONNX as the target runs it."""

    candidate: Candidate
    #: None: written only if it is chosen, on a target that runs graphsub's graph, not the file.
    model: ModelData | None
    #: The model as parsed, kept where it was read anyway (a peer's output: the peers stage
    #: reads its operators, the search's start imports it), so that it is parsed once.
    parsed: onnx.ModelProto | None = None


@dataclass(frozen=True)
class Found:
    """What the search stage made (and fission added to): the search's result, its
    candidates best first; what it priced with; how its best cost fell; what it did in
    control-flow bodies; fission's outcome, where that ran."""

    result: OptimizeResult
    #: What the search minimized (the latency model, or the objective's weighted sum of it).
    cost_model: CostModel
    #: (seconds, best predicted cost) as the search went.
    progress_points: tuple[tuple[float, float | None], ...] = ()
    bodies: tuple[BodyOutcome, ...] = ()
    fission: FissionOutcome | None = None

    @classmethod
    def unsearched(cls, context: RunContext) -> Found:
        """The input graph as the only candidate: what fission starts from in a run without
        a search (the fuzzer's)."""
        return cls(OptimizeResult(context.graph, (), SearchStats(), math.nan, math.nan),
                   context.time_model)

    @property
    def interrupted(self) -> bool:
        return self.result.stats.stopped_by == StopReason.INTERRUPT

    def candidates(self) -> list[Candidate]:
        """The search's candidates (the input graph alone where it found none)."""
        if self.result.candidates:
            return list(self.result.candidates)
        return [Candidate(self.result.graph, self.result.initial_cost, ())]
