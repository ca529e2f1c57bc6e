"""Cost of a graph as a fusing compiler runs it: the kernels inductor builds, each priced as
compiled (Korch, sections 4-5: a kernel is priced by compiling and timing it, cached by its
signature).

Priced operator by operator, a rewrite that removes an elementwise operator saves a kernel;
handed on to inductor, that operator was never a kernel of its own, only a few loads in a
kernel that fuses its neighbours. The search then proposes rewrites that win on paper and
lose after compilation, and misses what does win there: a library kernel fewer (attention
as one SDPA call, two products as one). This model prices what will run:

- **Library kernels** (products, convolutions, attention, operators inductor calls as they
  are) keep the inner model's price: inductor calls the same kernel graphsub's program times.
- **Everything else** (elementwise, reductions, layout, the normalizations and softmax it
  decomposes) is cut into the groups inductor fuses: connected and convex, so that no
  library kernel sits between two members (a kernel cannot wait for a product that reads its
  own output). Each group is one `fused` operator (graphsub.ops.fused), its body the group's
  operators: the inner model prices it as that, and on a torch target the measured model
  compiles it with inductor and times it (CUDA-graph replays where the target runs them),
  cached by body and input types across runs. Views alone cost nothing: inductor makes them
  without a kernel.

A compilation takes seconds (about 2 s for a C++ kernel on the CPU), an operator's timing
milliseconds: a search that compiled every group it met would look at a handful of graphs.
So groups are compiled only in the first COMPILE_SHARE of the time up to the cost model's
deadline (the groups of the input graph and its normal form come first, and those matter
most); a group met later, and not already in the cache, is priced by the roofline of its
fused operator scaled by what the compiled ones measured against theirs (the median ratio),
and counted in the notes. Each run compiles what the last did not reach: the cache keeps them.

Only whole graphs are priced this way: a node alone (the e-graph extraction's unit) keeps the
inner model's price, so e-graph extraction still sees operator-by-operator costs.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from graphsub.cost.analytic import AnalyticCostModel
from graphsub.cost.base import CostModel, OpSignature, costs_nothing, make_signature, runs_as_view
from graphsub.errors import GraphsubError
from graphsub.ir.graph import Graph, Value, make_node
from graphsub.ir.region import fused_body, read_outside
from graphsub.ops import get_op
from graphsub.ops.base import Category
from graphsub.runtime.check_sizes import ProfileShape

#: Categories inductor generates code for (and so fuses with their neighbours).
GENERATED_CATEGORIES = frozenset({Category.ELEMENTWISE, Category.REDUCE, Category.LAYOUT,
                                  Category.COARSE})
#: Operators of those categories that run as a library kernel (SDPA), and operators of
#: others that inductor decomposes and fuses like the rest.
LIBRARY_OPS = frozenset({"attention"})
DECOMPOSED_OPS = frozenset({"guarded_softmax"})
#: Nodes that compute no tensor at run time (sizes are integer arithmetic on shapes).
SHAPE_OPS = frozenset({"sizes"})
#: A value's strides where views make it non-contiguous (None where contiguous).
StridesFn = Callable[[Graph, Value], "tuple[int, ...] | None"]
#: The share of the time up to the deadline in which new groups are compiled and timed.
COMPILE_SHARE = 0.5


def is_generated(op: str) -> bool:
    """Whether inductor writes the operator's code itself (and can fuse it with its
    neighbours), rather than calling a library kernel for it."""
    if op in LIBRARY_OPS:
        return False
    return op in DECOMPOSED_OPS or get_op(op).category in GENERATED_CATEGORIES


@dataclass(frozen=True)
class CompiledKernels:
    """A graph cut into the kernels a fusing compiler runs: library nodes, one kernel each,
    and groups of generated nodes, each fused into one kernel (or a few, as the compiler
    decides: the group is priced as it compiles)."""

    library: tuple[int, ...]
    groups: tuple[frozenset[int], ...]


def compiled_kernels(graph: Graph, generated: Callable[[str], bool] = is_generated
                     ) -> CompiledKernels:
    """The kernels of `graph` under a fusing compiler. A generated node's *stage* is the
    number of library kernels on the longest path before it; neighbours of one stage share a
    group. Any path from a group back into it passes a library kernel, and so a later stage:
    the groups are convex, and together with the library kernels they form an acyclic
    schedule."""
    weight_only = graph.weight_only()
    stage: dict[int, int] = {}
    library: list[int] = []
    is_library: set[int] = set()
    parent: dict[int, int] = {}

    def find(n: int) -> int:
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for nid in graph.topo_order():
        node = graph[nid]
        ins = [v.node for v in node.inputs]
        if costs_nothing(node.op, nid in weight_only) or node.op in SHAPE_OPS:
            stage[nid] = max((stage[i] for i in ins), default=0)
            continue
        if not generated(node.op):
            stage[nid] = max((stage[i] for i in ins), default=0)
            library.append(nid)
            is_library.add(nid)
            continue
        s = max((stage[i] + (i in is_library) for i in ins), default=0)
        stage[nid] = s
        parent[nid] = nid
        for i in ins:
            if i in parent and stage[i] == s:
                parent[find(i)] = find(nid)
    groups: dict[int, set[int]] = {}
    for nid in parent:
        groups.setdefault(find(nid), set()).add(nid)
    return CompiledKernels(tuple(library), tuple(frozenset(g) for g in groups.values()))


class CompiledCostModel(CostModel):
    """A graph's cost as the sum of its compiled kernels' (`compiled_kernels`), each priced
    by `inner`: library nodes as themselves, groups as one `fused` operator. `free_views` are
    the kinds of view the compiler makes without a kernel (a group of those alone costs
    nothing); `estimate` prices a group not compiled in time (scaled by the compiled ones);
    `strides` gives a value's strides where views make it non-contiguous
    (`TorchTarget.strides_of`), so that a group reading a transposed view is timed reading
    one, as the inner model times an operator."""

    name = "compiled"
    compiles = True

    def __init__(self, inner: CostModel,
                 free_views: frozenset[str] = frozenset({"alias", "strided"}),
                 estimate: CostModel | None = None, strides: StridesFn | None = None) -> None:
        super().__init__()
        if isinstance(inner, CompiledCostModel):
            raise GraphsubError("the compiled cost model prices kernels with an operator "
                                "cost model (measured or analytic), not with another compiled one")
        self.inner = inner
        self.free_views = free_views
        self.estimate = estimate or AnalyticCostModel("cpu", free_views)
        self.strides = strides
        self.parallel_safe = inner.parallel_safe
        self.unit = inner.unit
        #: Past this time.perf_counter() value, groups not yet priced are estimated.
        self.compile_until: float | None = None
        #: Each compiled group's cost over its estimate.
        self._ratios: dict[OpSignature, float] = {}
        self._estimated: set[OpSignature] = set()  # groups priced by the scaled estimate

    # The inner model keeps the clock and the shape profile: it is what measures.
    @property
    def deadline(self) -> float | None:
        return self.inner.deadline

    @deadline.setter
    def deadline(self, value: float | None) -> None:
        self.inner.deadline = value
        now = time.perf_counter()
        self.compile_until = None if value is None else now + COMPILE_SHARE * max(value - now, 0)

    @property
    def shape_profile(self) -> tuple[ProfileShape, ...]:
        return self.inner.shape_profile

    def _profile_changed(self, profile: tuple[ProfileShape, ...]) -> None:
        self.inner = self.inner.at_profile(profile)
        self._ratios, self._estimated = dict(self._ratios), set(self._estimated)

    @property
    def estimated(self) -> int:
        """How many groups were priced by the scaled estimate rather than compiled."""
        return len(self._estimated)

    def notes(self) -> list[str]:
        notes = self.inner.notes()
        if self.estimated:
            notes.append(f"{self.estimated} group(s) of fused operators were not compiled in "
                         f"the time given: priced by their roofline x {self.scale():.2f}, the "
                         f"median of {len(self._ratios)} compiled group(s) against theirs "
                         "(a longer time limit, or a second run, compiles more)")
        return notes

    def scale(self) -> float:
        """What compiled groups cost against their estimate (1 before any was compiled)."""
        return statistics.median(self._ratios.values()) if self._ratios else 1.0

    def op_cost(self, sig: OpSignature) -> float:
        return self.inner.signature_cost(sig)

    def node_cost(self, graph: Graph, nid: int) -> float:
        return self.inner.node_cost(graph, nid)

    def graph_cost(self, graph: Graph) -> float:
        return self.priced(graph)[0]

    def priced(self, graph: Graph) -> tuple[float, dict[int, float]]:
        """The graph's cost, and each node's share: a library node its own price, a group's
        price on the node that writes its last output (the others nothing)."""
        entry = graph.memo.get(self)
        if entry is None:
            kernels = compiled_kernels(graph)
            costs = {nid: 0.0 for nid in graph.nodes}
            for nid in kernels.library:
                costs[nid] = self.inner.node_cost(graph, nid)
            for group in kernels.groups:
                outputs = read_outside(graph, group)
                costs[outputs[-1].node if outputs else max(group)] += \
                    self.group_cost(graph, group, outputs)
            entry = (sum(costs.values()), costs)
            graph.memo[self] = entry
        return entry

    def group_cost(self, graph: Graph, group: frozenset[int],
                   outputs: tuple[Value, ...] | None = None) -> float:
        """What the kernel(s) compiled from `group` cost."""
        if all(runs_as_view(graph[n].op, self.free_views) for n in group):
            return 0.0
        if len(group) == 1:
            return self.inner.node_cost(graph, next(iter(group)))
        sig = fused_signature(graph, group, outputs, self.strides)
        if not sig.is_static:  # priced at the shape profile by the inner model
            return self.inner.signature_cost(sig)
        known = self.inner.known_cost(sig)
        if known is None and (self.compile_until is None
                              or time.perf_counter() < self.compile_until):
            known = self.inner.signature_cost(sig)
        estimate = self.estimate.signature_cost(sig)
        if known is None:
            self._estimated.add(sig)
            return estimate * self.scale()
        if estimate > 0 and known > 0:
            self._ratios[sig] = known / estimate
        return known


def fused_signature(graph: Graph, group: frozenset[int],
                    outputs: tuple[Value, ...] | None = None,
                    strides: StridesFn | None = None) -> OpSignature:
    """The signature of `group` computed by one `fused` operator: its body, the types of what
    it reads (weights marked constant, as a node's signature marks them) and, given
    `strides`, the strides of those that arrive as views."""
    if outputs is None:
        outputs = read_outside(graph, group)
    body, reads = fused_body(graph, group, outputs)
    types = [graph.type_of(v) for v in reads]
    node = make_node("fused", reads, types, {"body": body})
    weight_only = graph.weight_only()
    constant = tuple(v.node in weight_only or graph[v.node].op in SHAPE_OPS for v in reads)
    layouts = None if strides is None else tuple(strides(graph, v) for v in reads)
    return make_signature("fused", node.attrs, tuple(types), constant, node.outputs,
                          lambda: (), layouts if layouts and any(layouts) else None)
