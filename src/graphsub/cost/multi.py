"""MetaFlow's multi-dimensional cost (section 4.1): a weighted combination of execution time,
FLOPs, memory and kernel launches, with an optional memory cap that makes any graph over
budget infinitely expensive.

Memory is the graph's peak: the weights it holds (initializers, folded weight-only values)
plus the most activation bytes alive at once when the nodes run in topological order, each
value alive from the node that makes it to the last node that reads it (graph inputs from the
start, graph outputs to the end). A runtime's own memory planner may reuse buffers
differently; this is the figure every candidate is compared by, computed, not measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from graphsub.cost.base import CostModel, OpSignature, costs_nothing, node_signature
from graphsub.ir.graph import Graph
from graphsub.ops import get_op
from graphsub.runtime.check_sizes import ProfileShape


@dataclass(frozen=True)
class Weights:
    time: float = 1.0       # per second of the time model
    flops: float = 0.0      # per FLOP
    memory: float = 0.0     # per byte of the graph's peak memory (weights included)
    launches: float = 0.0   # per operator launched


class MultiObjectiveCostModel(CostModel):
    name = "multi"

    def __init__(self, time_model: CostModel, weights: Weights = Weights(),
                 memory_cap: float | None = None) -> None:
        super().__init__()
        self.time_model = time_model
        self.weights = weights
        self.memory_cap = memory_cap
        self.parallel_safe = time_model.parallel_safe
        # operators priced where they read views are priced so here too
        self.layouts, self.layout_ops = time_model.layouts, time_model.layout_ops

    @property
    def deadline(self) -> float | None:
        return self.time_model.deadline

    @deadline.setter
    def deadline(self, value: float | None) -> None:
        self.time_model.deadline = value

    # The time model's profile is what it prices symbolic operators at.
    @property
    def shape_profile(self) -> tuple[ProfileShape, ...]:
        return self.time_model.shape_profile

    def _profile_changed(self, profile: tuple[ProfileShape, ...]) -> None:
        self.time_model = self.time_model.at_profile(profile)

    def notes(self) -> list[str]:
        return self.time_model.notes()

    def op_cost(self, sig: OpSignature) -> float:
        w = self.weights
        cost = w.time * self.time_model.signature_cost(sig) + w.launches
        if w.flops:
            cost += w.flops * get_op(sig.op).flops(sig.attrs, sig.inputs, sig.outputs)
        return cost

    @staticmethod
    def memory(graph: Graph) -> int:
        """The graph's peak memory in bytes (see the module's docstring)."""
        return peak_memory(graph)

    def graph_cost(self, graph: Graph) -> float:
        memory = self.memory(graph) if (self.weights.memory or self.memory_cap) else 0
        if self.memory_cap is not None and memory > self.memory_cap:
            return math.inf
        return super().graph_cost(graph) + self.weights.memory * memory


def peak_memory(graph: Graph) -> int:
    """Weights held plus the most activation bytes alive at once, in topological order."""
    weight_only = graph.weight_only()
    users = graph.users()
    order = graph.topo_order()
    position = {nid: i for i, nid in enumerate(order)}
    outputs = {v.node for v in graph.outputs}
    weights = 0
    #: bytes freed after each position (the last reader of a value runs there)
    freed = [0] * (len(order) + 1)
    alive = 0
    peak = 0
    for i, nid in enumerate(order):
        node = graph[nid]
        size = sum(t.nbytes for t in node.outputs)
        readers = [u for u, _ in users[nid] if u not in weight_only]
        if nid in weight_only:
            # materialized only where computation reads it (an initializer of the model)
            if readers or nid in outputs:
                weights += size
            continue
        alive += size
        peak = max(peak, alive)
        if nid not in outputs:
            last = max((position[u] for u in readers), default=i)
            freed[last] += size
        alive -= freed[i]
    return weights + peak


def _computing(graph: Graph) -> list[int]:
    weight_only = graph.weight_only()
    return [nid for nid in graph.topo_order()
            if not costs_nothing(graph[nid].op, nid in weight_only)]


def flop_count(graph: Graph) -> int:
    """FLOPs of one run: every operator that computes (weight-only nodes are folded)."""
    total = 0
    for nid in _computing(graph):
        sig = node_signature(graph, nid)
        total += get_op(sig.op).flops(sig.attrs, sig.inputs, sig.outputs)
    return total


def launch_count(graph: Graph) -> int:
    """Operators launched in one run: those that compute."""
    return len(_computing(graph))


__all__ = ["MultiObjectiveCostModel", "Weights", "flop_count", "launch_count",
           "peak_memory"]
