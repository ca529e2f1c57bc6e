"""The cost-model protocol and the memoization every cost model shares.

A cost model prices one operator application by its *signature* (op, attributes, input types
and which inputs are constants); a graph costs the sum over its computing nodes. What costs
nothing is one notion, `costs_nothing`: graph inputs, weights and weight-only nodes (folded at
export: TASO 7.3) everywhere, and the views a target runs without a kernel (`Target.free_views`)
wherever kernels are what is priced.
"""

from __future__ import annotations

import copy
import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, cast

from graphsub.errors import GraphsubError
from graphsub.ir.binding import bound_value
from graphsub.tensors.symbolic import bind_all
from graphsub.ir.graph import Graph, Node, Value
from graphsub.ir.view import GraphDelta
from graphsub.ir.hashing import attrs_key
from graphsub.tensors.types import Attrs, Constant, TensorType
from graphsub.ops import all_ops, get_op
from graphsub.ops.base import Category
from graphsub.runtime.check_sizes import ProfileShape

#: Graph inputs and weights: nothing computes them.
SOURCES = frozenset(name for name, op in all_ops().items() if op.category is Category.SOURCE)


def runs_as_view(op: str, free_views: frozenset[str]) -> bool:
    """Whether a target whose `free_views` are these runs `op` as a view of its input, with no
    kernel: the operator is a view (`OpDef.view`) of a kind the target runs free."""
    return bool(free_views) and get_op(op).view in free_views


def costs_nothing(op: str, weight_only: bool, free_views: frozenset[str] = frozenset()) -> bool:
    """Whether a node costs nothing, wherever it is priced (a graph, a dry-run rewrite, an
    e-graph): sources; nodes computed from weights alone, which export folds into
    initializers; and, given the target's `free_views`, the views it runs without a kernel.
    Callers that price through a `CostModel` leave `free_views` out: the model's signature
    prices those views (the analytic model charges them nothing; the measured one times them,
    since on torch's CPU target making a view costs as much host time as a small kernel)."""
    return weight_only or op in SOURCES or runs_as_view(op, free_views)

#: An opaque operator's constant inputs of at most this many elements are part of its
#: signature: they are shapes, indices and axes, which decide what it computes (and whether a
#: one-operator model of it runs at all: an Expand fed a made-up shape is invalid).
VALUE_LIMIT = 4096


@dataclass(frozen=True)
class SizesValue:
    """The value of a `sizes` node an operator reads (a Range's limit, an Expand's shape),
    in the signature of an operator over symbolic sizes: its size expressions, made the
    constant they are at a binding when the signature is bound, so that the operator is
    timed on the sizes it will see rather than on made-up ones (an Expand to a shape of
    zeros does not run)."""

    values: tuple[Any, ...]
    shape: tuple[int, ...]
    dtype: str

    def bound(self, binding: Mapping[str, int]) -> Constant:
        import numpy as np

        return Constant(np.array(bind_all(self.values, binding), dtype=self.dtype)
                        .reshape(self.shape))


@dataclass(frozen=True)
class OpSignature:
    """Everything an operator's cost may depend on."""

    op: str
    attrs: Attrs
    inputs: tuple[TensorType, ...]
    constant_inputs: tuple[bool, ...]
    outputs: tuple[TensorType, ...]
    #: Strides of inputs that arrive as non-contiguous views (None: contiguous), on targets
    #: where operators read views (torch); None when every input is contiguous.
    layouts: tuple[tuple[int, ...] | None, ...] | None = None
    #: The values of an opaque operator's small constant inputs (None where unknown or not a
    #: small constant; sizes over symbols until the signature is bound); None for every
    #: other operator, whose constants are data (weights).
    values: tuple[Constant | SizesValue | None, ...] | None = None

    @property
    def is_static(self) -> bool:
        """Whether every shape in it is concrete (a symbolic one is priced at a profile)."""
        return all(t.is_static for t in self.inputs) and all(t.is_static for t in self.outputs)

    def bound(self, binding: Mapping[str, int]) -> OpSignature:
        """The signature with each size symbol at its value in `binding`."""
        values = None if self.values is None else tuple(
            v.bound(binding) if isinstance(v, SizesValue) else v for v in self.values)
        return dataclasses.replace(
            self, attrs=bound_value(self.attrs, binding),
            inputs=tuple(t.bound(binding) for t in self.inputs),
            outputs=tuple(t.bound(binding) for t in self.outputs),
            layouts=bound_value(self.layouts, binding), values=values)

    def key(self) -> str:
        """A stable text key (the same across processes), for persistent caches."""
        ins = ",".join(f"{t}{'c' if c else ''}" for t, c in zip(self.inputs, self.constant_inputs))
        key = f"{self.op}|{attrs_key(self.attrs)}|{ins}"
        if self.layouts is not None:
            key += "|strides=" + ";".join("" if s is None else ",".join(map(str, s))
                                          for s in self.layouts)
        if self.values is not None:
            # a key is made of a bound signature, whose values are Constants
            key += "|values=" + ";".join("" if v is None else cast(Constant, v).digest.hex()
                                         for v in self.values)
        return key


def signature_values(op: str, constants: tuple[Constant | SizesValue | None, ...]
                     ) -> tuple[Constant | SizesValue | None, ...] | None:
    """What OpSignature.values holds for an op whose constant inputs are `constants` (None
    where an input is not a constant with known data)."""
    if op != "opaque":
        return None
    return tuple(c if isinstance(c, SizesValue) or (c is not None and c.type.numel <= VALUE_LIMIT)
                 else None for c in constants)


def make_signature(op: str, attrs: Attrs, inputs: tuple[TensorType, ...],
                   constant_inputs: tuple[bool, ...], outputs: tuple[TensorType, ...],
                   constants: Callable[[], tuple[Constant | SizesValue | None, ...]],
                   layouts: tuple[tuple[int, ...] | None, ...] | None = None) -> OpSignature:
    """The signature of one operator application, however its host stores it. `constants`
    gives the inputs' weight values (None where not a weight); it is read for opaque
    operators only."""
    values = signature_values(op, constants()) if op == "opaque" else None
    return OpSignature(op, attrs, inputs, constant_inputs, outputs, layouts, values)


LayoutFn = Callable[[Graph, int], "tuple[tuple[int, ...] | None, ...] | None"]


def node_signature(graph: Graph, nid: int, layouts: LayoutFn | None = None) -> OpSignature:
    node = graph[nid]
    weight_only = graph.weight_only()
    return make_signature(
        node.op, node.attrs, graph.input_types(nid),
        tuple(v.node in weight_only or graph[v.node].op == "sizes" for v in node.inputs),
        node.outputs, lambda: tuple(input_value(graph[v.node]) for v in node.inputs),
        layouts(graph, nid) if layouts is not None else None)


def input_value(producer: Node) -> Constant | SizesValue | None:
    """What a signature knows of an input's value from the node that produces it: a
    weight's data, a `sizes` node's expressions, or nothing."""
    if producer.op == "weight":
        weight: Constant = producer.attrs["value"]
        return weight
    if producer.op == "sizes":
        a = producer.attrs
        return SizesValue(a["values"], a["shape"], a["dtype"])
    return None


class DeviceKey(Protocol):
    def key(self) -> str:
        """A stable text that changes whenever cached operator timings stop applying."""
        ...


class TimingTarget(Protocol):
    """What the measured and compiled cost models need of the target they time operators on
    (graphsub.targets' `Target` is one, and says so): the cost layer sits below the targets,
    which price their own graphs with its signatures, so it names them by this protocol."""

    name: str
    #: The view kinds (`OpDef.view`) the target runs without a kernel.
    free_views: frozenset[str]
    #: The analytic model's device profile for what cannot be timed.
    analytic_profile: str
    #: Where calibration figures persist (the measured cost model lends its cache).
    cache: Any

    def device(self) -> DeviceKey: ...

    def time_op(self, sig: OpSignature, cold_weights: bool = False) -> float: ...

    def cache_bytes(self) -> int: ...

    def input_layouts(self, graph: Graph, nid: int
                      ) -> tuple[tuple[int, ...] | None, ...] | None: ...

    def strides_of(self, graph: Graph, value: Value) -> tuple[int, ...] | None: ...


class CostModel(ABC):
    """Prices graphs. Subclasses implement `op_cost`; lookups are memoized by signature.

    `layouts`, when set, gives the strides of each node's inputs on the target (views feed
    operators directly on torch), so that a matmul reading a transposed view is priced as one.
    """

    name = "cost"
    unit = "s"
    layouts: LayoutFn | None = None
    #: Whether searches in several processes may price graphs at once: true for models that
    #: compute, false for those that time operators on this machine (concurrent timings skew).
    parallel_safe = False
    #: Past this time.perf_counter() value a model that measures stops measuring (None: no
    #: limit); the stage that prices sets it from its clock.
    deadline: float | None = None
    #: Whether pricing a graph compiles the kernels it has not seen (seconds per new graph,
    #: not the milliseconds of an operator timing): graphs on the way to another, which
    #: nothing runs, are then left unpriced (the normal form's intermediate steps).
    compiles = False

    def notes(self) -> list[str]:
        """What a report should say about how the model priced (operators it could not
        time, ...); nothing for a model that computes its prices."""
        return []

    def __init__(self) -> None:
        self._memo: dict[OpSignature, float] = {}
        # Per node object: graphs made by editing share most nodes, so their costs are found by
        # identity (the node is kept alive by the entry, so its id is not reused).
        self._by_node: dict[int, tuple[object, tuple[object, ...], float]] = {}

    def __getstate__(self) -> dict[str, Any]:
        """A copy for another process (a split search's workers) leaves the caches behind:
        they can be large, and identities mean nothing there."""
        state = dict(self.__dict__)
        state["_memo"], state["_by_node"] = {}, {}
        return state

    @abstractmethod
    def op_cost(self, sig: OpSignature) -> float:
        """The cost of one operator application."""

    def known_cost(self, sig: OpSignature) -> float | None:
        """The signature's cost if it is known without measuring anything (computed, or
        already measured); None where finding it would take a measurement."""
        return self._memo.get(sig)

    def signature_cost(self, sig: OpSignature) -> float:
        cost = self._memo.get(sig)
        if cost is None:
            cost = self.op_cost(sig) if sig.is_static else self._profiled_cost(sig)
            self._memo[sig] = cost
        return cost

    _shape_profile: tuple[ProfileShape, ...] = ()

    @property
    def shape_profile(self) -> tuple[ProfileShape, ...]:
        """The shapes an operator over symbolic sizes is priced at (runtime.check_sizes.
        ProfileShape); its cost is the weighted mean of its costs there, so a static graph
        and a symbolic one are priced in the same unit. Fixed for a model's life: another
        profile is another model (`at_profile`), since every price of a symbolic operator
        it gave depends on it."""
        return self._shape_profile

    def at_profile(self, profile: tuple[ProfileShape, ...]) -> CostModel:
        """This model pricing symbolic operators at `profile`: itself where that is its
        profile, else a copy that shares what it measured of static operators (and its
        persistent cache) and has priced nothing symbolic yet. The model it was made from is
        unchanged, so whoever holds it (a run that began at the default profile, a user's
        own model) keeps the prices it had."""
        profile = tuple(profile)
        if profile == self.shape_profile:
            return self
        model = copy.copy(self)
        model._memo = {sig: cost for sig, cost in self._memo.items() if sig.is_static}
        model._by_node = {}
        model._profile_changed(profile)
        return model

    def _profile_changed(self, profile: tuple[ProfileShape, ...]) -> None:
        """Take `profile` in a copy `at_profile` just made (a model that prices through
        another hands that one the profile instead)."""
        self._shape_profile = profile

    def _profiled_cost(self, sig: OpSignature) -> float:
        if not self.shape_profile:
            raise GraphsubError(f"{sig.op} has symbolic sizes ({', '.join(map(str, sig.inputs))})"
                                " and the cost model was given no shape profile to price it at")
        total = sum(shape.weight for shape in self.shape_profile)
        return sum(shape.weight * self.signature_cost(sig.bound(shape.values))
                   for shape in self.shape_profile) / total

    def node_cost(self, graph: Graph, nid: int) -> float:
        return self._priced_node(graph, nid)

    #: Ops whose output strides follow their input's (the views the target runs as views),
    #: through which a change of layout travels to readers further down; only read when
    #: `layouts` is set.
    layout_ops: frozenset[str] = frozenset()

    def graph_cost(self, graph: Graph) -> float:
        """The sum of node costs. A graph edited from one already priced is priced from its
        parent: only nodes the edit can have changed the price of are looked at."""
        return self._priced(graph)[0]

    @property
    def sum_of_nodes(self) -> bool:
        """Whether a graph's cost is the sum of `priced`'s node costs, each depending on the
        node's signature alone (no strides that travel through views): then a rewrite can be
        priced from the nodes it removes and adds (graphsub.search.pricing)."""
        return self.layouts is None and type(self).graph_cost is CostModel.graph_cost

    def priced(self, graph: Graph) -> tuple[float, Mapping[int, float]]:
        """The graph's cost and each node's (computed once per graph, from its parent's)."""
        return self._priced(graph)

    def _priced(self, graph: Graph) -> tuple[float, dict[int, float]]:
        entry = graph.memo.get(self)
        if entry is None:
            delta = graph.delta
            if delta is not None:
                entry = self._priced_from_parent(graph, delta, self._priced(delta.parent))
            else:
                costs = {nid: self._priced_node(graph, nid) for nid in graph.nodes}
                entry = (sum(costs.values()), costs)
            graph.memo[self] = entry
        return entry

    def _priced_from_parent(self, graph: Graph, delta: GraphDelta[Graph],
                            parent_entry: tuple[float, dict[int, float]]) -> tuple[float, dict[int, float]]:
        parent = delta.parent
        total, parent_costs = parent_entry
        flipped = graph.weight_only() ^ parent.weight_only()
        seeds = (delta.changed | flipped) - delta.removed
        dirty = set(seeds)
        users = graph.users()
        if self.layouts is None:
            for nid in seeds:
                dirty.update(u for u, _ in users[nid])
        else:  # a changed view changes the strides every reader further down sees
            stack, seen = list(seeds), set(seeds)
            while stack:
                for u, _ in users[stack.pop()]:
                    dirty.add(u)
                    if graph[u].op in self.layout_ops and u not in seen:
                        seen.add(u)
                        stack.append(u)
        costs = dict(parent_costs)
        for nid in delta.removed:
            total -= costs.pop(nid)
        for nid in dirty:
            old = costs.get(nid, 0.0)
            new = self._priced_node(graph, nid)
            costs[nid] = new
            total += new - old
        return total, costs

    def _priced_node(self, graph: Graph, nid: int) -> float:
        node = graph[nid]
        weight_only = graph.weight_only()
        if costs_nothing(node.op, nid in weight_only):
            return 0.0
        # The memo key: which inputs are constants and, where layouts matter, their strides
        # (a node's producers may be re-pointed by an edit without the node itself changing).
        consts: tuple[object, ...] = tuple(v.node in weight_only for v in node.inputs)
        if self.layouts is not None:
            consts = (consts, self.layouts(graph, nid))
        entry = self._by_node.get(id(node))
        if entry is None or entry[0] is not node or entry[1] != consts:
            entry = (node, consts, self.signature_cost(node_signature(graph, nid, self.layouts)))
            self._by_node[id(node)] = entry
        return entry[2]
