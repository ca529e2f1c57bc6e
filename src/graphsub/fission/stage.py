"""Fission and orchestration as one step of the optimizer: split a graph into primitives, price
every candidate kernel on the target, choose the orchestration, and put it back together.

The result is one more candidate for the optimizer's end-to-end measurement, which keeps it
only where it runs faster on the target than the original and the search's best: a fused
kernel that pays on one target can lose on another.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from graphsub.cost.analytic import AnalyticCostModel
from graphsub.cost.base import CostModel
from graphsub.fission.candidates import (Kernel, group_kernels, library_kernels,
                                         primitive_kernels)
from graphsub.fission.orchestrate import Orchestration, assemble, orchestrate
from graphsub.fission.primitives import (category, cleanup_rules, fission, fission_rules,
                                         kernel_rules)
from graphsub.ir.graph import Graph
from graphsub.ops.base import Category
from graphsub.progress import step
from graphsub.rules.fixed_point import rewrite_to_fixed_point

#: Whether a target runs a kernel's graph as one call (its kernel library): given the
#: kernel's graph. Torch lowers every fused operator to one call; onnxruntime has a fused
#: operator only from the opset that introduced it.
LibraryFn = Callable[[Graph], bool]


@dataclass
class KernelChoice:
    """One kernel of the orchestration, for the report."""

    kernel: str              #: what runs: the fused operator, or the primitive
    kind: str                #: "library", "generated" or "primitive"
    replaced: dict[str, int]  #: the primitives it computes, by operator
    cost: float              #: the predicted cost of all of them on the target
    count: int = 1           #: how many such kernels were chosen

    def as_dict(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "kind": self.kind, "replaced": self.replaced,
                "total_ms": self.cost * 1e3, "count": self.count}


@dataclass
class FissionOutcome:
    """What fission and orchestration made of a graph."""

    graph: Graph                    #: the orchestrated graph
    cost: float                     #: its predicted cost
    primitives: int                 #: operators of the primitive graph that cost something
    split: dict[str, int]           #: coarse operators split, by operator
    candidates: dict[str, int]      #: candidate kernels, by kind
    orchestration: Orchestration
    chosen: list[KernelChoice] = field(default_factory=list)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        o = self.orchestration
        return {"split": self.split, "primitives": self.primitives,
                "candidates": self.candidates, "status": o.status,
                "solve_seconds": round(o.solve_seconds, 3), "cut_rounds": o.cut_rounds,
                "predicted_ms": self.cost * 1e3,
                "kernels": [c.as_dict() for c in self.chosen if c.kind != "primitive"],
                "seconds": round(self.seconds, 3)}


def _summary(kernels: list[Kernel], primitive: Graph) -> list[KernelChoice]:
    """The chosen kernels grouped by what they are and what they replace."""
    groups: dict[tuple[str, str, tuple[tuple[str, int], ...]], KernelChoice] = {}
    for k in kernels:
        replaced = dict(sorted(Counter(primitive[n].op for n in k.nodes).items()))
        key = (k.label, k.kind, tuple(replaced.items()))
        if key in groups:
            groups[key].count += 1
            groups[key].cost += k.cost
        else:
            groups[key] = KernelChoice(k.label, k.kind, replaced, k.cost)
    return sorted(groups.values(), key=lambda c: -c.cost)


#: The most primitives in one generated kernel: candidates grow exponentially with it, and
#: Korch's largest useful groups (a softmax with its neighbours, a normalization) hold fewer.
MAX_GROUP = 6
#: Seconds below which generated kernels are not tried: one compilation takes seconds (about
#: 2 s on a quiet 2-core machine, docs/fission.md), and the first in a process more
#: (inductor starting up).
MIN_GENERATE_SECONDS = 2.0


def generated_kernels(primitive: Graph, cost_model: CostModel, deadline: float,
                      max_size: int = MAX_GROUP) -> list[Kernel]:
    """Generated-kernel candidates priced by `cost_model` (on a torch target: compiled by
    inductor and timed) until `deadline`, most promising first: the analytic model's saving
    over the primitives run one by one orders them, and those it predicts no saving for are
    not priced. Groups of the same body and input types are priced once (the cost model's
    memo), so a model's repeated layers cost one compilation."""
    analytic = AnalyticCostModel()
    alone = analytic.priced(primitive)[1]
    groups = group_kernels(primitive, max_size, analytic.graph_cost)
    gain = {id(k): sum(alone[n] for n in k.nodes) - k.cost for k in groups}
    priced = []
    longest = 0.0  # the longest pricing so far (a compilation): one must fit before the deadline
    for k in sorted(groups, key=lambda k: -gain[id(k)]):
        if gain[id(k)] <= 0 or time.perf_counter() + longest > deadline:
            break
        start = time.perf_counter()
        priced.append(dataclasses.replace(k, cost=cost_model.graph_cost(k.graph)))
        longest = max(longest, time.perf_counter() - start)
    return priced


def preload_rules() -> None:
    """Read every rule fission uses: a run reads them while loading, not inside the fission
    stage's share of the time limit."""
    fission_rules()
    kernel_rules()
    cleanup_rules()


def fission_and_orchestrate(graph: Graph, cost_model: CostModel,
                            one_kernel: LibraryFn = lambda g: True,
                            time_limit: float = 10.0, generate: bool = False) -> FissionOutcome:
    """Split `graph`'s coarse operators into primitives, enumerate the candidate kernels (each
    primitive alone; each fused operator a kernel rule finds and the target runs as one call;
    with `generate`, groups of primitives the code generator compiles as one kernel), price
    them with `cost_model`, choose by Korch's program within `time_limit` seconds, and rebuild
    the graph from the choice. Generated kernels get half the time limit for compiling and
    timing (none below MIN_GENERATE_SECONDS)."""
    start = time.perf_counter()
    split = dict(Counter(n.op for nid, n in graph.nodes.items()
                         if category(n.op) is Category.COARSE
                         and nid not in graph.weight_only()))
    primitive = fission(graph)
    with step("fission", None, "candidate kernels priced") as tracker:
        prims = primitive_kernels(primitive, cost_model)
        tracker.advance(len(prims))
        library = [k for k in library_kernels(primitive, kernel_rules(), cost_model)
                   if one_kernel(k.graph)]
        tracker.advance(len(library))
        generated = (generated_kernels(primitive, cost_model, start + time_limit / 2)
                     if generate and time_limit / 2 >= MIN_GENERATE_SECONDS else [])
        tracker.advance(len(generated))
    left = max(time_limit - (time.perf_counter() - start), 0.5)
    plan = orchestrate(primitive, prims + library + generated, time_limit=left)
    result = rewrite_to_fixed_point(assemble(primitive, plan), cleanup_rules())[0]
    return FissionOutcome(result, cost_model.graph_cost(result), len(prims), split,
                          dict(Counter(k.kind for k in prims + library + generated)), plan,
                          _summary(plan.kernels, primitive), time.perf_counter() - start)
