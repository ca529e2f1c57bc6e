"""The cost of a rewrite without making the rewritten graph.

A backtracking search prices every child of every graph it expands and keeps only a few: on
BERT 66 children an expansion, of which one is ever expanded. Making a child (copying the
node table, re-pointing readers, finding the dead nodes, proving acyclicity, updating the
users index, weight-only set and per-node costs) cost more than everything else the search
did. For a cost that is a sum over nodes, the child's cost is the parent's, less the nodes
the rewrite leaves dead, plus the target's nodes: readers re-pointed to a value of the same
type and constness keep their price. That is what `price_rewrite` computes, from the match,
the target's output types (inferred, and cached by `make_node`) and the liveness of the
match's nodes.

Where that shortcut would not give the cost `CostModel.graph_cost` gives the built graph (a
cost that is not a plain sum, input strides that travel through views, a rewrite that changes
whether a replaced value is computed from weights alone, targets that read the values they
replace), the child is built and priced the usual way. The one thing the shortcut does not
check is acyclicity: a priced child may turn out cyclic when it is built, which the search
does only for the few children it keeps.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from graphsub.cost.base import (CostModel, SizesValue, costs_nothing, input_value,
                                make_signature)
from graphsub.ir.graph import Graph, Node, Value, make_node
from graphsub.tensors.types import Constant, TensorType
from graphsub.ops import is_deterministic
from graphsub.rules.applier import Rejection, apply_match, build_in_graph
from graphsub.rules.matcher import Match


class PricedRewrite(NamedTuple):
    cost: float
    nodes: int  # how many nodes the rewritten graph has


class _DryEditor:
    """A target sink (graphsub.rules.applier.TargetSink) over a graph that is not copied:
    new nodes live here under fresh ids."""

    def __init__(self, base: Graph) -> None:
        self.base = base
        self.added: dict[int, Node] = {}  # in creation order, which is topological
        self._next_id = base.next_id

    def type_of(self, value: Value) -> TensorType:
        node = self.added.get(value.node)
        return (node if node is not None else self.base[value.node]).outputs[value.index]

    def producer(self, value: Value) -> Node:
        return self.added.get(value.node) or self.base[value.node]

    def constants(self, node: Node) -> Callable[[], tuple[Constant | SizesValue | None, ...]]:
        """The values a node of the rewrite reads, as its signature knows them."""
        return lambda: tuple(input_value(self.producer(v)) for v in node.inputs)

    def add(self, op: str, inputs: Sequence[Value] = (), attrs: Mapping[str, Any] | None = None,
            name: str = "") -> tuple[Value, ...]:
        node = make_node(op, inputs, [self.type_of(v) for v in inputs], attrs, name)
        nid = self._next_id
        self._next_id += 1
        self.added[nid] = node
        return tuple(Value(nid, i) for i in range(len(node.outputs)))


def price_rewrite(graph: Graph, match: Match[Value], cost_model: CostModel
                  ) -> PricedRewrite | Rejection:
    """The cost and size `apply_match(graph, match)` would have, or its rejection. Cyclic
    results are the exception: they are priced, and rejected only when built."""
    if not cost_model.sum_of_nodes:
        return _built_and_priced(graph, match, cost_model)
    editor = _DryEditor(graph)
    targets = build_in_graph(editor, graph, match)
    if isinstance(targets, Rejection):
        return targets
    replaced = {old: new for old, new in zip(match.roots, targets) if old != new}
    for old, new in replaced.items():
        if graph.type_of(old) != editor.type_of(new):
            return Rejection("shape or type mismatch")
    priced = _price_dry(graph, editor, replaced, cost_model)
    return priced if priced is not None else _built_and_priced(graph, match, cost_model)


def _built_and_priced(graph: Graph, match: Match[Value], cost_model: CostModel
                      ) -> PricedRewrite | Rejection:
    new = apply_match(graph, match)
    return new if isinstance(new, Rejection) else PricedRewrite(cost_model.graph_cost(new),
                                                                 len(new))


def _price_dry(graph: Graph, editor: _DryEditor, replaced: dict[Value, Value],
               cost_model: CostModel) -> PricedRewrite | None:
    """The priced rewrite from the dry edit, or None where the shortcut does not apply."""
    added = editor.added
    if any(v in replaced for v in replaced.values()):
        return None  # chained replacements: left to the editor's sequential semantics
    users = graph.users()

    def has_reader(value: Value) -> bool:
        return value in graph.outputs or any(graph[u].inputs[pos] == value
                                             for u, pos in users.get(value.node, ()))

    # The target nodes that survive: those a replaced value with readers reaches.
    live: set[int] = set()
    stack = [new.node for old, new in replaced.items() if new.node in added and has_reader(old)]
    while stack:
        nid = stack.pop()
        if nid not in live:
            live.add(nid)
            stack.extend(v.node for v in added[nid].inputs if v.node in added)
    read_by_new: set[int] = set()
    for nid in live:
        for v in added[nid].inputs:
            if v in replaced:
                return None  # a target reads what it replaces
            if v.node not in added:
                read_by_new.add(v.node)
    # The base nodes the rewrite leaves without readers, transitively.
    keep = set(graph.inputs) | {replaced.get(v, v).node for v in graph.outputs} | read_by_new
    removed: set[int] = set()

    def still_read(nid: int) -> bool:
        return nid in keep or any(
            u not in removed and graph[u].inputs[pos] not in replaced
            for u, pos in users.get(nid, ()))

    work = [old.node for old in replaced]
    while work:
        nid = work.pop()
        if nid not in removed and not still_read(nid):
            removed.add(nid)
            work.extend(v.node for v in graph[nid].inputs)
    # Weight-only-ness of the new nodes; a replaced value that changes it changes its
    # readers' prices (and maybe theirs), which only the full update follows.
    weight_only = graph.weight_only()
    new_weight_only: set[int] = set()
    for nid in added:  # creation order: inputs before readers
        node = added[nid]
        if nid in live and (node.op == "weight" or (node.inputs and is_deterministic(node) and all(
                v.node in weight_only or v.node in new_weight_only for v in node.inputs))):
            new_weight_only.add(nid)
    for old, new in replaced.items():
        if (old.node in weight_only) != (new.node in weight_only or new.node in new_weight_only):
            return None
    total, costs = cost_model.priced(graph)
    for nid in removed:
        total -= costs[nid]
    for nid in live:
        node = added[nid]
        if costs_nothing(node.op, nid in new_weight_only):
            continue
        sig = make_signature(node.op, node.attrs, tuple(editor.type_of(v) for v in node.inputs),
                             tuple(v.node in weight_only or v.node in new_weight_only
                                   or editor.producer(v).op == "sizes" for v in node.inputs),
                             node.outputs, editor.constants(node))
        total += cost_model.signature_cost(sig)
    return PricedRewrite(total, len(graph) - len(removed) + len(live))
