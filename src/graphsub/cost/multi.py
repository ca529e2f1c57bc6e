"""MetaFlow's multi-dimensional cost (section 4.1): a weighted combination of execution time,
FLOPs, memory and kernel launches, with an optional memory cap that makes any graph over
budget infinitely expensive."""

from __future__ import annotations

import math
from dataclasses import dataclass

from graphsub.cost.base import CostModel, OpSignature
from graphsub.ir.graph import Graph
from graphsub.ops import get_op


@dataclass(frozen=True)
class Weights:
    time: float = 1.0       # per second of the time model
    flops: float = 0.0      # per FLOP
    memory: float = 0.0     # per byte of tensors the graph materializes (weights included)
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

    def op_cost(self, sig: OpSignature) -> float:
        w = self.weights
        cost = w.time * self.time_model.signature_cost(sig) + w.launches
        if w.flops:
            cost += w.flops * get_op(sig.op).flops(sig.attrs, sig.inputs, sig.outputs)
        return cost

    @staticmethod
    def memory(graph: Graph) -> int:
        """Bytes of every tensor the optimized model holds: folded weights and activations."""
        weight_only = graph.weight_only()
        total = 0
        for nid in graph.topo_order():
            node = graph[nid]
            if node.op == "input":
                continue
            if nid in weight_only:
                # Only weight-only values read by computation are materialized (as initializers).
                if any(u not in weight_only for u, _ in graph.users()[nid]) or any(
                        v.node == nid for v in graph.outputs):
                    total += sum(t.nbytes for t in node.outputs)
                continue
            total += sum(t.nbytes for t in node.outputs)
        return total

    def graph_cost(self, graph: Graph) -> float:
        memory = self.memory(graph) if (self.weights.memory or self.memory_cap) else 0
        if self.memory_cap is not None and memory > self.memory_cap:
            return math.inf
        return super().graph_cost(graph) + self.weights.memory * memory


__all__ = ["MultiObjectiveCostModel", "Weights"]
