"""The parts of a traced graph graphsub converts: its operators graphsub models, cut where the
ones it does not model come between them.

torch's capability-based partitioner grows each part along the graph's edges, as far as it
can without a cycle through the operators left in torch. A rewrite sees one part at a time,
though, and what it must see together is not always joined by an edge: siblings, operators
that read one input. A decoder layer's q, k and v projections read one normalized input, and
merging them (or folding the norm's scale into their weights) needs all three and the norm
in one part; in a decode step over a static cache, k and v go on to the cache's write
(`index_copy`, left in torch) and q to the attention after it, and the partitioner left the
three in two parts. So afterwards operators move into the part of a sibling, with what reads
them after, and parts whose operators read a common input are merged, wherever that leaves
the graph without a cycle (no path from a part to itself passes outside it).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

import torch
import torch.fx as fx

from graphsub.frontends.fx_import import unsupported_reason
from graphsub.frontends.fx_origins import ORIGIN, WITHIN

aten = torch.ops.aten


def partition(gm: fx.GraphModule, masks: Collection[fx.Node] = ()) -> fx.GraphModule:
    """`gm` with each part (see the module's docstring) made a submodule `fused_<k>`, called
    where its first operator was. `masks`: nodes graphsub reads as a `causal_mask` (proven
    causal: fx_position_masks), parts of the graph whatever operator computes them, so that
    the attention reading one joins the part of what it reads besides (the CPU's attention
    kernel reads a boolean mask turned into 0 and -inf by `where`, which graphsub does not
    model: cut there, a layer's projections and its attention fell into two parts, and the
    copies of its grouped key/value heads were out of the attention rules' sight)."""
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
    from torch.fx.passes.operator_support import OperatorSupportBase
    from torch.fx.passes.utils.fuser_utils import fuse_by_partitions

    # (torch absent, its classes are Any: the ignore is for mypy without the extras)
    class Modelled(OperatorSupportBase):  # type: ignore[misc, unused-ignore]
        def is_node_supported(self, submodules: object, node: fx.Node) -> bool:
            return node in masks or unsupported_reason(node) is None

    partitioner = CapabilityBasedPartitioner(gm, Modelled(), allows_single_node_partition=True)
    order = {n: k for k, n in enumerate(gm.graph.nodes)}
    parts = [set(p.nodes) for p in partitioner.propose_partitions()]
    parts = _views_sunk(_siblings_merged(_siblings_hoisted(parts, order)))
    parts.sort(key=lambda part: min(order[n] for n in part))
    return fuse_by_partitions(gm, [dict.fromkeys(sorted(p, key=order.__getitem__))
                                   for p in parts], prefix="fused_")


def _siblings_hoisted(parts: list[set[fx.Node]], order: dict[fx.Node, int]
                      ) -> list[set[fx.Node]]:
    """`parts` with operators moved into the part of a sibling (an operator that reads one
    of their inputs), and the operators after them that read what was moved, wherever the
    move leaves no cycle: q's projection joins k's and v's in the part before the cache's
    write, where the attention reading q cannot. An operator moves with those of its inputs
    that read nothing but the graph's inputs (a weight's transpose)."""
    owner = {n: k for k, part in enumerate(parts) for n in part}
    moved: set[fx.Node] = set()
    progress = True
    while progress:
        progress = False
        for node in sorted(owner, key=order.__getitem__):
            if node in moved:
                continue  # each operator moves once: no two parts trade one back and forth
            here = owner[node]
            targets = {owner[x] for x in node.all_input_nodes
                       if x in moved and owner.get(x, here) != here}
            targets |= {owner[r] for x in node.all_input_nodes for r in x.users
                        if r is not node and owner.get(r, here) != here}
            unit = _unit(node, parts[here])
            for there in sorted(targets):
                joined, left = parts[there] | unit, parts[here] - unit
                trial = [joined if k == there else left if k == here else p
                         for k, p in enumerate(parts)]
                if _cut_inside(unit, left) or _leaves_and_returns(joined, trial) or \
                        _leaves_and_returns(left, trial):
                    continue
                parts[there], parts[here] = joined, left
                for n in unit:
                    owner[n] = there
                moved |= unit
                progress = True
                break
    return [part for part in parts if part]


#: Operators that only lay out what they read: moved to the part that reads them.
LAYOUT = frozenset(getattr(aten, name).default for name in (
    "view", "_unsafe_view", "reshape", "expand", "unsqueeze", "squeeze", "clone", "permute",
    "alias")) | {aten.transpose.int, aten.squeeze.dim}


def _views_sunk(parts: list[set[fx.Node]]) -> list[set[fx.Node]]:
    """`parts` with each layout operator (LAYOUT) that only one other part reads moved into
    that part, and on up its chain, wherever that leaves no cycle: grouped-query attention's
    copies of a value head (an expand and a reshape after its projection) join the
    attention, whose rules read them as the operator's shared heads, not the projection's
    part, which hands the copies over."""
    owner = {n: k for k, part in enumerate(parts) for n in part}
    progress = True
    while progress:
        progress = False
        for node in sorted(owner, key=lambda n: -len(n.users)):
            if node.target not in LAYOUT or not node.users:
                continue
            here = owner[node]
            readers = {owner.get(u) for u in node.users}
            if len(readers) != 1 or None in readers or here in readers:
                continue
            (there,) = readers
            assert there is not None
            joined, left = parts[there] | {node}, parts[here] - {node}
            trial = [joined if k == there else left if k == here else p
                     for k, p in enumerate(parts)]
            if _cut_inside({node}, left) or _leaves_and_returns(joined, trial) or \
                    _leaves_and_returns(left, trial):
                continue
            parts[there], parts[here] = joined, left
            owner[node] = there
            progress = True
    return [part for part in parts if part]


def _unit(node: fx.Node, part: set[fx.Node]) -> set[fx.Node]:
    """What moves with an operator: every operator of its part that one operation of dynamo's
    graph traced to with it (fx_origins.WITHIN: a `linear`'s views and product), and those
    of their inputs in the part that read nothing but the graph's inputs (a weight's
    transpose)."""
    within = node.meta.get(WITHIN)
    unit = {n for n in part if n is node or (within is not None and n.meta.get(WITHIN) == within)}
    return unit | {x for n in unit for x in n.all_input_nodes if x in part
                   and all(i.op in ("placeholder", "get_attr") for i in x.all_input_nodes)}


def _cut_inside(unit: set[fx.Node], rest: set[fx.Node]) -> bool:
    """Whether moving `unit` away from `rest` would cut between two operators at a value
    that is no node of dynamo's graph (fx_origins.ORIGIN), where a splice could neither read
    nor replace it."""
    return any(ORIGIN not in a.meta for a, b in _edges(unit, rest)) or \
        any(ORIGIN not in a.meta for a, b in _edges(rest, unit))


def _edges(sources: set[fx.Node], readers: set[fx.Node]) -> Iterable[tuple[fx.Node, fx.Node]]:
    return ((n, u) for n in sources for u in n.users if u in readers)


def _siblings_merged(parts: list[set[fx.Node]]) -> list[set[fx.Node]]:
    """`parts` with every two that read a common input merged where that makes no cycle,
    until no more can be."""
    merged = True
    while merged:
        merged = False
        for i, j in _sibling_pairs(parts):
            joined = parts[i] | parts[j]
            trial = [p for k, p in enumerate(parts) if k not in (i, j)] + [joined]
            if not _leaves_and_returns(joined, trial):
                parts = trial
                merged = True
                break
    return parts


def _sibling_pairs(parts: list[set[fx.Node]]) -> Iterable[tuple[int, int]]:
    """The pairs of parts (by position) whose operators read a common node from outside."""
    readers: dict[fx.Node, set[int]] = {}
    for k, part in enumerate(parts):
        for node in part:
            for source in node.all_input_nodes:
                if source not in part:
                    readers.setdefault(source, set()).add(k)
    seen: set[tuple[int, int]] = set()
    for ks in readers.values():
        for i in sorted(ks):
            for j in sorted(ks):
                if i < j and (i, j) not in seen:
                    seen.add((i, j))
                    yield i, j


def _leaves_and_returns(part: set[fx.Node], parts: list[set[fx.Node]]) -> bool:
    """Whether some path leaves the set and comes back to it, each of the other `parts`
    taken whole (it becomes one call: what any of its operators reads comes before all of
    them): the set as one part would read what it computes itself."""
    owner = {n: k for k, p in enumerate(parts) for n in p if p is not part}
    pending = [u for n in part for u in n.users if u not in part]
    seen: set[fx.Node] = set()
    entered: set[int] = set()
    while pending:
        node = pending.pop()
        if node in seen:
            continue
        seen.add(node)
        k = owner.get(node)
        if k is not None and k not in entered:  # a part: on from all of its operators
            entered.add(k)
            pending += [m for m in parts[k] if m not in seen]
        for user in node.users:
            if user in part:
                return True
            pending.append(user)
    return False


__all__ = ["partition"]
