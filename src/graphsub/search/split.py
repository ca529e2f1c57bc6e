"""MetaFlow's flow-based recursive graph split (metaflow-sysml19 section 4.3, Algorithm 2).

A graph too large to search whole is cut in two where the cut disables the fewest rule
matches, recursively, until every part has at most `threshold` operators; each part is
searched on its own (in parallel where the cost model allows), the optimized parts are
stitched back together, and a last search runs on the regions around the cuts, where matches
that span two parts were out of every part's reach.

The capacity of an operator is the number of matches that map to one of its in-edges and one
of its out-edges (an edge maps when the match holds both of its ends). A cut is a set C of
operators; the downstream part is C and everything reachable from it, the upstream part the
rest, and every edge from upstream to downstream must enter an operator of C whose inputs all
come from upstream: MetaFlow's "reachable from C" made exact, so that the parts are convex
(no path leaves a part and comes back) and the only matches lost are those through C's
operators, the ones C's capacity counts. That is a minimum s-t cut in a network of two
vertices per operator (in and out, joined by the capacity) whose data edges are uncuttable
both ways; the source holds the first third of the operators in topological order and the
sink the last third, which keeps the two sides balanced. networkx computes the max-flow.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import networkx as nx

from graphsub.cost.base import CostModel
from graphsub.errors import GraphsubError
from graphsub.ir.graph import Graph, Node, Value
from graphsub.ir.region import cut_out, read_outside
from graphsub.tensors.types import Attrs, ConstantStub
from graphsub.rules.ast import Rule
from graphsub.rules.rematching import IncrementalMatcher
from graphsub.rules.matcher import Match
from graphsub.search.registry import Limits, SearchAlgorithm, SearchFn
from graphsub.search.result import OptimizeResult, SearchStats, Step, StopReason
from graphsub.search.run import SearchRun

#: MetaFlow splits subgraphs with more than 30 operators (section 5).
DEFAULT_THRESHOLD = 30
#: Share of the time limit kept for the search around the cuts.
BOUNDARY_SHARE = 0.2

def partitioned(graph: Graph) -> list[int]:
    """The nodes the parts divide among them, in topological order: the operators on data.
    Inputs become part inputs, and weights with what is computed from weights alone are
    copied into every part that reads them, so that a part prices and rewrites them as the
    whole graph would (folded into the weights)."""
    weight_only = graph.weight_only()
    return [nid for nid in graph.topo_order()
            if graph[nid].inputs and nid not in weight_only]


def operator_capacities(graph: Graph, matches: Iterable[Match[Value]]) -> Counter[int]:
    """Cap(o): how many matches hold one of o's producers, o, and one of o's readers."""
    users = graph.users()
    cap: Counter[int] = Counter()
    for match in matches:
        for nid in match.nodes:
            node = graph[nid]
            if any(v.node in match.nodes for v in node.inputs) and any(
                    u in match.nodes for u, _ in users.get(nid, ())):
                cap[nid] += 1
    return cap


def min_cut_split(graph: Graph, ops: Sequence[int], capacity: Counter[int]
                  ) -> tuple[list[int], list[int]]:
    """Split `ops` (a convex set of operators, in topological order) into an upstream and a
    downstream part by a minimum cut; see the module docstring."""
    n = len(ops)
    inside = set(ops)
    head, tail = set(ops[: n // 3]), set(ops[n - n // 3:])
    net = nx.DiGraph()
    # Capacities are integers (exact max-flow); the 1 per cut operator prefers, among cuts
    # that lose equally many matches, the one with the fewest operators on the boundary.
    scale = n + 1
    for nid in ops:
        i, o = ("in", nid), ("out", nid)
        if nid in head:
            net.add_edge("s", i)
            net.add_edge(i, o)
        else:
            net.add_edge(i, o, capacity=scale * capacity[nid] + 1)
        net.add_edge(o, i)
        if nid in tail:
            net.add_edge(o, "t")
        for v in graph[nid].inputs:
            if v.node in inside:
                net.add_edge(("out", v.node), i)
                net.add_edge(i, ("out", v.node))
    try:
        _, (source_side, _) = nx.minimum_cut(net, "s", "t")
    except nx.NetworkXUnbounded:
        # Every cut between the two thirds crosses an operator with inputs from both sides:
        # cut the topological order in the middle (still convex, matches lost uncounted).
        return list(ops[: n // 2]), list(ops[n // 2:])
    upstream = [nid for nid in ops if ("out", nid) in source_side]
    downstream = [nid for nid in ops if ("out", nid) not in source_side]
    return upstream, downstream


def split_graph(graph: Graph, threshold: int, matches: Sequence[Match[Value]]
                ) -> list[list[int]]:
    """Algorithm 2: the graph's operators in parts of at most `threshold`, each part in
    topological order and the parts in an order in which they can run."""
    if threshold < 2:
        raise ValueError(f"the split threshold must be at least 2 operators (got {threshold})")
    order = partitioned(graph)

    def split(ops: list[int]) -> list[list[int]]:
        if len(ops) <= threshold:
            return [ops]
        members = set(ops)
        within = [m for m in matches if m.nodes <= members]
        upstream, downstream = min_cut_split(graph, ops, operator_capacities(graph, within))
        if not upstream or not downstream:
            upstream, downstream = ops[: len(ops) // 2], ops[len(ops) // 2:]
        return split(upstream) + split(downstream)

    return split(order) if order else []


@dataclass(frozen=True)
class Region:
    """A convex set of operators cut out as a graph of its own: `graph`'s inputs stand for
    the outer values in `inputs`, its outputs for the outer values in `outputs`."""

    graph: Graph
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]


def extract_region(graph: Graph, ops: Iterable[int]) -> Region:
    """The region of `graph` made of the operators `ops` (which must be convex and hold no
    weight-only node); the weights it reads come along."""
    outputs = read_outside(graph, ops)
    sub, inputs = cut_out(graph, ops, outputs)
    return Region(sub, inputs, outputs)


#: Weights of at least this many bytes are sent to a split's workers as stubs; smaller ones
#: (masks, scales, shapes: what rule conditions read) travel whole.
STUB_BYTES = 1 << 20


def without_weight_data(graph: Graph) -> Graph:
    """The graph with its large weights' data left behind (ConstantStub, from STUB_BYTES):
    what is sent to a worker process, which matches, rewrites and prices but never reads
    those weights' values beyond 'all elements equal x' (a rule condition on the values of a
    stub does not hold there). Stubs compare equal to their originals, so `stitch` puts the
    original weight nodes back."""
    nodes = dict(graph.nodes)
    for nid, node in graph.nodes.items():
        if node.op == "weight" and not isinstance(node.attrs["value"], ConstantStub) \
                and node.attrs["value"].array.nbytes >= STUB_BYTES:
            attrs = Attrs({**node.attrs, "value": ConstantStub(node.attrs["value"])})
            nodes[nid] = Node(node.op, attrs, node.inputs, node.outputs, node.name)
    return Graph(nodes, graph.inputs, graph.outputs, graph.output_names, graph.facts,
                 graph.next_id, check=False)


def stitch(graph: Graph, replacements: Sequence[tuple[Region, Graph]]
           ) -> tuple[Graph, dict[int, int]]:
    """`graph` with each region replaced by its new graph (same interface), and, for every
    operator of the result that came from a replacement, the index of that replacement.
    Regions must not overlap; they are replaced in the order given, which must be one in
    which they can run (a region's inputs come from the graph or from earlier regions)."""
    editor = graph.edit()
    renamed: dict[Value, Value] = {}  # outer value -> the value that replaced it
    origin: dict[int, int] = {}

    def outer(v: Value) -> Value:
        while v in renamed:
            v = renamed[v]
        return v

    for index, (region, new) in enumerate(replacements):
        values: dict[Value, Value] = {}
        for k, nid in enumerate(new.inputs):
            values[Value(nid, 0)] = outer(region.inputs[k])
        for nid in new.topo_order():
            node = new[nid]
            if node.op == "input":
                continue
            ins = tuple(values[v] for v in node.inputs)
            copy = Node(node.op, node.attrs, ins, node.outputs, node.name)
            if nid in graph.nodes and graph[nid] == copy:
                outs = tuple(Value(nid, i) for i in range(len(node.outputs)))  # unchanged
            else:
                outs = editor.add_node(copy)
            origin.update({o.node: index for o in outs})
            values.update({Value(nid, i): o for i, o in enumerate(outs)})
        for old, produced in zip(region.outputs, new.outputs):
            replacement = values[produced]
            if outer(old) != replacement:
                editor.replace_uses(outer(old), replacement)
                renamed[outer(old)] = replacement
    result = editor.finish()
    for nid in origin:
        made = result.nodes.get(nid)
        if made is not None and made.op == "weight" and isinstance(made.attrs["value"], ConstantStub):
            raise GraphsubError(f"a part's search made a new weight node (#{nid}) from a weight "
                                "whose data stayed behind; run the split with executor='serial'")
    return result, {nid: i for nid, i in origin.items() if nid in result.nodes}


def convex_closure(graph: Graph, ops: set[int]) -> set[int]:
    """`ops` and every operator on a path between two of them."""
    users = graph.users()
    below = _reach(ops, lambda n: (u for u, _ in users.get(n, ())))
    above = _reach(ops, lambda n: (v.node for v in graph[n].inputs))
    return ops | (below & above)


def _reach(start: Iterable[int], step: Callable[[int], Iterable[int]]) -> set[int]:
    seen: set[int] = set()
    stack = list(start)
    while stack:
        for m in step(stack.pop()):
            if m not in seen:
                seen.add(m)
                stack.append(m)
    return seen


def boundary_regions(graph: Graph, part_of: dict[int, int], radius: int) -> list[set[int]]:
    """The convex regions around the cuts: the operators within `radius` edges of an edge
    whose ends lie in different parts, in connected pieces, each closed under paths, pieces
    that then overlap merged."""
    users = graph.users()
    ops = set(partitioned(graph))

    def around(n: int) -> list[int]:
        return [m for m in [v.node for v in graph[n].inputs] + [u for u, _ in users.get(n, ())]
                if m in ops]

    seeds = {end for n in part_of for v in graph[n].inputs
             if v.node in part_of and part_of[v.node] != part_of[n] for end in (v.node, n)}
    near: dict[int, int] = {n: 0 for n in seeds}
    queue = deque(seeds)
    while queue:
        n = queue.popleft()
        if near[n] < radius:
            for m in around(n):
                if m not in near:
                    near[m] = near[n] + 1
                    queue.append(m)
    adjacency = nx.Graph()
    adjacency.add_nodes_from(near)
    adjacency.add_edges_from((n, m) for n in near for m in around(n) if m in near)
    regions = [convex_closure(graph, set(piece)) for piece in nx.connected_components(adjacency)]
    merged = True
    while merged:
        merged = False
        for i, j in ((i, j) for i in range(len(regions)) for j in range(i + 1, len(regions))):
            if regions[i] & regions[j]:
                regions[i] = convex_closure(graph, regions[i] | regions.pop(j))
                merged = True
                break
    return regions


def _runnable_order(graph: Graph, regions: list[set[int]]) -> list[set[int]]:
    """Regions in an order in which they can run (by their first operator's position;
    disjoint convex regions cannot depend on each other both ways)."""
    pos = graph.positions()
    return sorted(regions, key=lambda r: min(pos[n] for n in r))


def _search_region(index: int, search: SearchFn, graph: Graph, rules: Sequence[Rule],
                   cost_model: CostModel, limits: Limits, options: Any
                   ) -> tuple[int, tuple[Graph, tuple[Step, ...], SearchStats, float, float]]:
    """One region's search (in a worker process when parallel). What comes back is a fresh
    graph, without the chain of parent graphs a search leaves behind."""
    result = search(graph, rules, cost_model, limits, options)
    g = result.graph
    plain = Graph(g.nodes, g.inputs, g.outputs, g.output_names, g.facts, g.next_id, check=False)
    return index, (plain, result.trace, result.stats, result.initial_cost, result.final_cost)


def _add_stats(run: SearchRun, part: SearchStats) -> None:
    """A part's statistics into the whole search's; a part's stop reason (the latest one:
    the parts run in parallel) is the whole's."""
    total = run.stats
    for name in ("explored", "generated", "duplicates", "pruned", "matches",
                 "matches_computed", "matches_reused"):
        setattr(total, name, getattr(total, name) + getattr(part, name))
    total.rejected.update(part.rejected)
    if part.stopped_by != StopReason.EXHAUSTED:
        run.stopped = part.stopped_by


def splitting(algorithm: SearchAlgorithm, threshold: int = DEFAULT_THRESHOLD,
          executor: str = "process", workers: int | None = None) -> SearchFn:
    """A registered search wrapped by MetaFlow's graph split: a search of the same contract
    that cuts graphs of more than `threshold` operators into parts, searches them (on
    `executor`: process, dask or serial), stitches them and searches around the cuts. The
    limits' budget then applies per part."""
    return functools.partial(split_search, algorithm=algorithm, threshold=threshold,
                             executor=executor, workers=workers)


def split_search(graph: Graph, rules: Sequence[Rule], cost_model: CostModel,
                 limits: Limits = Limits(), options: Any = None, *,
                 algorithm: SearchAlgorithm, threshold: int = DEFAULT_THRESHOLD,
                 executor: str = "process", workers: int | None = None) -> OptimizeResult:
    """Split, search every part with the algorithm and `options` (None: its defaults),
    stitch, search around the cuts. The time limit covers it all: the parts share
    1 - BOUNDARY_SHARE of it in proportion to their size (spread over the workers)."""
    from graphsub.executors import SerialExecutor, make_executor

    search = algorithm.function
    options = algorithm.options() if options is None else options
    run = SearchRun(limits, None)
    stats = run.stats
    initial_cost = cost_model.graph_cost(graph)
    matcher = IncrementalMatcher(rules)
    matches = [m for found in matcher.matches(graph) for m in found]
    parts = split_graph(graph, threshold, matches)
    if len(parts) <= 1:
        return search(graph, rules, cost_model, limits, options)
    workers = workers or os.cpu_count() or 1
    if not cost_model.parallel_safe or workers == 1:
        executor = "serial"  # timing operators in two processes at once would skew both
    running = make_executor(executor, workers)
    trace: list[Step] = []
    try:
        def search_regions(base: Graph, regions: list[set[int]], seconds: float
                           ) -> tuple[Graph, dict[int, int]]:
            """Search every region of `base` (time shared by size over the workers) and
            stitch the results in."""
            cut = [extract_region(base, r) for r in regions]
            total = sum(len(r) for r in regions)
            lanes = min(len(regions), running.workers)
            shipped = [region.graph if isinstance(running, SerialExecutor)
                       else without_weight_data(region.graph) for region in cut]
            tasks = [(i, search, shipped[i], rules, cost_model, dataclasses.replace(
                limits, time=min(seconds, seconds * lanes * len(r) / total), progress=None),
                options) for i, (region, r) in enumerate(zip(cut, regions))]
            done: dict[int, tuple[Graph, tuple[Step, ...], SearchStats, float, float]] = {}
            for index, outcome in running.run(_search_region, tasks):
                done[index] = outcome
                _add_stats(run, outcome[2])
                run.report(initial_cost)
            current = cost_model.graph_cost(base)
            for i in range(len(cut)):
                _, part_trace, _, before, after = done[i]
                # A part's node ids are not the whole graph's: its steps cannot be replayed.
                trace.extend(dataclasses.replace(step, cost=current + step.cost - before,
                                                 match=None) for step in part_trace)
                current += after - before
            return stitch(base, [(region, done[i][0]) for i, region in enumerate(cut)])

        stitched, origin = search_regions(graph, [set(p) for p in parts],
                                          limits.time * (1 - BOUNDARY_SHARE))
        part_of = {nid: i for i, ops in enumerate(parts) for nid in ops if nid in stitched.nodes}
        part_of.update(origin)
        regions = _runnable_order(stitched, boundary_regions(stitched, part_of,
                                                             max(matcher.max_radius, 1)))
        home = {nid: i for i, ops in enumerate(parts) for nid in ops}
        stats.split = {"parts": len(parts), "part_sizes": [len(p) for p in parts],
                       "matches_cut": sum(1 for m in matches
                                          if len({home.get(n) for n in m.nodes} - {None}) > 1),
                       "boundary_regions": len(regions)}
        remaining = max(run.remaining(), 0.05)
        final = search_regions(stitched, regions, remaining)[0] if regions else stitched
    finally:
        running.close()
    final_cost = cost_model.graph_cost(final)
    if final_cost > initial_cost:  # the parts' costs need not add up exactly: never worse
        final, final_cost, trace = graph, initial_cost, []
    run.best.offer(final, final_cost, tuple(trace))
    return run.result(initial_cost)


