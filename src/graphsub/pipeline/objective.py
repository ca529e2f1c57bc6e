"""What the search minimizes: latency alone (the default), or MetaFlow's weighted combination
of latency with peak memory, FLOPs and kernel launches (`--objective latency,memory=0.3`).

Weights are relative to the input graph: `memory=0.3` makes a graph whose peak memory is
the input's cost 0.3 of the input's latency on top of its own latency, so that a rewrite
which saves 10% of the latency is worth making unless it adds more than a third to the peak
memory. The terms have different units (seconds, bytes, FLOPs, launches), so a weight per
byte would mean nothing to a user; a weight relative to where the model starts does.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphsub.cost import CostModel
from graphsub.cost.multi import MultiObjectiveCostModel, Weights, flop_count, launch_count, \
    peak_memory
from graphsub.errors import GraphsubError
from graphsub.ir.graph import Graph

#: The terms an objective may weigh, in the order they are written.
TERMS = ("latency", "memory", "flops", "launches")


@dataclass(frozen=True)
class Objective:
    latency: float = 1.0
    memory: float = 0.0
    flops: float = 0.0
    launches: float = 0.0

    def __post_init__(self) -> None:
        for term in TERMS:
            if not getattr(self, term) >= 0:
                raise GraphsubError(f"the objective's {term} weight must be at least 0 "
                                    f"(got {getattr(self, term)})")
        if self.latency == 0 and not any(getattr(self, t) for t in TERMS[1:]):
            raise GraphsubError("the objective weighs nothing: give latency or another term a "
                                "positive weight")

    @classmethod
    def parse(cls, text: str) -> Objective:
        """"latency,memory=0.3": each term with its weight (1 when omitted); a term left out
        weighs 0, latency included."""
        weights: dict[str, float] = {}
        for part in (p.strip() for p in text.split(",")):
            if not part:
                continue
            term, eq, raw = part.partition("=")
            term = term.strip()
            if term not in TERMS:
                raise GraphsubError(f"--objective {text!r}: unknown term {term!r}; use "
                                    f"{', '.join(TERMS)}, each optionally =WEIGHT")
            try:
                weights[term] = float(raw) if eq else 1.0
            except ValueError:
                raise GraphsubError(f"--objective {text!r}: {raw!r} is not a weight") from None
        if not weights:
            raise GraphsubError("--objective is empty; e.g. latency,memory=0.3")
        return cls(**{t: weights.get(t, 0.0) for t in TERMS})

    @property
    def latency_only(self) -> bool:
        return not any(getattr(self, t) for t in TERMS[1:])

    def describe(self) -> str:
        return ",".join(f"{t}={getattr(self, t):g}" for t in TERMS if getattr(self, t))

    def cost_model(self, time_model: CostModel, graph: Graph) -> CostModel:
        """The cost model this objective prices with: `time_model` itself for latency alone,
        else MetaFlow's weighted sum, each term scaled to the input graph's latency."""
        if self.latency_only:
            return time_model
        latency = time_model.graph_cost(graph)
        per = {"memory": peak_memory(graph), "flops": flop_count(graph),
               "launches": launch_count(graph)}
        scale = {t: (getattr(self, t) * latency / per[t] if per[t] else 0.0) for t in per}
        return MultiObjectiveCostModel(time_model, Weights(
            time=self.latency, memory=scale["memory"], flops=scale["flops"],
            launches=scale["launches"]))


__all__ = ["TERMS", "Objective"]
