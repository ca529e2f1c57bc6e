"""E-graph extraction: one e-node per e-class reachable from the roots, at the least DAG cost.

A choice maps classes to nodes; the graph it extracts is what the roots reach through chosen
nodes, and it costs the sum of its *distinct* nodes' costs (its DAG cost: a tensor computed
once and read twice is paid once). Extraction under DAG cost is NP-hard, so three extractors
trade quality for time:

- `tree_greedy`: egg's default extractor. A class costs its cheapest node's cost plus its
  children's costs, so a shared subgraph is paid once per use. Fast and exact on trees, but on
  networks with skip connections its estimate explodes (the MCTS paper's Tables 1 and 3) and
  it prefers nodes that look cheap only because their sharing is overcounted elsewhere.
- `dag_greedy`: the same bottom-up pass with the MCTS paper's e-node cost function (Hartmann
  et al., PACT 2024, Algorithm 2), which remembers which classes a cost already contains so a
  shared subgraph is paid once. Meant to run after every MCTS rollout step.
- `ilp`: TENSAT's integer program (Yang et al., MLSys 2021) solved by HiGHS; exact, given
  the time.

Every extractor returns an acyclic choice (e-graphs of tensor programs grow cycles, and a
cyclic "program" cannot run) whose `cost` is recomputed with `dag_cost`, so extractors compare
on the same measure whatever their own estimate says. Costs must be finite and non-negative.
"""

from __future__ import annotations

import heapq
import math
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphsub.egraph.problem import ExtractionProblem
from graphsub.errors import GraphsubError

INF = math.inf


@dataclass
class Extraction:
    """What an extractor returns.

    `choice` maps each class the roots reach through chosen nodes to its chosen node (and
    nothing else). `cost` is the DAG cost of that choice, whatever the extractor believed;
    `estimate` is what the extractor's own cost function said the roots cost (the tree cost
    for `tree_greedy`, Algorithm 2's figure for `dag_greedy`, the objective for `ilp`), which
    is what the MCTS paper's Tables 1 and 3 report. `optimal` is None for heuristics, and for
    `ilp` whether HiGHS proved the choice optimal; `bound` is the lower bound on the optimum
    HiGHS proved (None for heuristics).
    """

    choice: dict[int, int]
    cost: float
    method: str
    seconds: float
    optimal: bool | None = None
    status: str = ""
    estimate: float | None = None
    bound: float | None = None


def reachable_choice(problem: ExtractionProblem, choice: Mapping[int, int]) -> dict[int, int]:
    """`choice` restricted to the classes the roots reach through chosen nodes.

    Raises ValueError if a reached class has no chosen node or its node is in another class,
    since such a choice extracts no graph.
    """
    reached: dict[int, int] = {}
    stack = list(problem.roots)
    while stack:
        cls = stack.pop()
        if cls in reached:
            continue
        node = _chosen(problem, choice, cls)
        reached[cls] = node
        stack.extend(c for c in problem.node_children[node] if c not in reached)
    return reached


def dag_cost(problem: ExtractionProblem, choice: Mapping[int, int]) -> float:
    """The DAG cost of the graph `choice` extracts: its distinct nodes' costs, summed exactly
    (math.fsum) so that equal choices cost the same whatever order they were built in."""
    return math.fsum(problem.node_cost[n] for n in reachable_choice(problem, choice).values())


def is_acyclic(problem: ExtractionProblem, choice: Mapping[int, int]) -> bool:
    """Whether the graph `choice` extracts has no cycle (a class reaching itself)."""
    return _find_cycle(problem, choice) is None


def tree_greedy(problem: ExtractionProblem) -> Extraction:
    """egg's default extractor: a class costs min over its nodes of node cost + children's costs.

    Computed bottom-up to a fixpoint (see `_BottomUp`). A node is only considered once every
    child class has a finite cost, and a class only takes a *strictly* cheaper node, which
    keeps the choice acyclic even with zero-cost nodes and cyclic e-graphs: if a class X took
    a node closing a cycle X -> Y -> ... -> X, the cycle's costs, each computed from a child
    cost no lower than the child's cost now, would give cost(Y) >= old cost(X) and so a new
    cost(X) >= cost(Y) >= old cost(X), not an improvement (and on a first assignment X had no
    finite cost for the cycle's last node to read). The result is still verified; were a cycle
    to appear anyway, `_BottomUp.choice` breaks it.
    """
    start = time.perf_counter()
    solver = _TreeCosts(problem)
    solver.run()
    choice = solver.choice()
    estimate = sum((solver.cost[r] for r in problem.roots), 0.0)
    return Extraction(choice, dag_cost(problem, choice), "tree-greedy",
                      time.perf_counter() - start, None, "greedy", estimate)


def dag_greedy(problem: ExtractionProblem) -> Extraction:
    """Greedy extraction with the MCTS paper's e-node cost function (Algorithm 2).

    Each class keeps a *history*: the classes its cost already contains, each with the cost
    attributed to it. A node's cost is its operator cost plus, per child class c, in order:
    (1) nothing if c is already in the node's history (another child contains it); (2)
    otherwise cost(c) minus the largest attributed cost among c's history entries the node's
    history already holds (the shared subgraph, assumed to be the largest overlap), clipped at
    0, while c's other entries join the node's history; a child without history entries is
    case (3), its full cost. c then enters the history with the cost it added. A class takes
    its cheapest node's cost and history. A node whose own class would enter its history is
    skipped: choosing it would close a cycle.

    It is a heuristic, not an exact DAG cost: an overlap is discounted by its single largest
    entry, which is the whole shared subgraph only when that entry contains the rest. Where
    the shared part was itself assembled from two children, no entry holds all of it and the
    node is overcharged (the paper's appendix B, Figure 9: NasNet-A cell, true cost 7, this
    function 8, tree cost 15). And greedy per class, it cannot trade a costlier node in one
    class for sharing elsewhere.

    The pass runs children first over the class graph's strongly connected components, so
    on an acyclic e-graph every node is evaluated once from its children's final costs and
    histories. Inside a cycle classes are re-evaluated, only for nodes whose children
    changed, until no class improves; there a history can go stale, so the choice is
    verified and any cycle broken (`_BottomUp.choice`). Unlike the paper's egg loop, which
    rewrites a class's history on every pass even when egg keeps the old cost, a class's
    history always belongs to the node that set its cost.
    """
    start = time.perf_counter()
    solver = _DagCosts(problem)
    solver.run()
    choice = solver.choice()
    estimate, _ = solver.node_value(0.0, problem.roots)
    return Extraction(choice, dag_cost(problem, choice), "dag-greedy",
                      time.perf_counter() - start, None, "greedy", estimate)


def ilp(problem: ExtractionProblem, time_limit: float = 60.0,
        acyclic: bool | None = None) -> Extraction:
    """Optimal extraction by integer linear programming (TENSAT's formulation), with HiGHS.

    Variables: a binary x_i per node and a binary y_c per class (class c is computed), with
    y_c = sum of its nodes' x (so at most one node per class) and y_root = 1. A node needs
    its child classes: TENSAT writes x_i <= y_h per node i and child class h; here the nodes
    of a class that read h share one row, sum_{i in c reading h} x_i <= y_h, which is the
    same on integer points (one node per class) and a tighter LP relaxation, with fewer rows.
    Minimise sum c_i x_i. (On Tensat's bert_acyclic e-graph, with the cycle inequalities and
    cutoff below, the per-node form took 40 s to over 85 s; this one proves it in 7-17 s.)

    Cycles are excluded TENSAT's way, by an order t_c per class: if c's chosen node reads
    h, then t_c >= t_h + 1, relaxed by M (1 - sum_{i in c reading h} x_i) otherwise. The
    order is continuous in [0, M - 1] with M the number of classes it ranges over (any
    acyclic choice has an integral order) instead of TENSAT's t in [0, 1] with epsilon =
    1/num_classes, which sinks towards the solver's tolerances on 20k-class e-graphs. Big-M
    rows barely bind a fractional x, so every class cycle of length <= 3 (the
    Split0(Split(Concat(a, ...))) = a cycles Tensat's rules create) also gets the exact
    inequality "not all its edges": sum over its edges of the readers' x <= length - 1.

    `acyclic`: None orders only the edges inside a strongly connected component of the
    class graph (no other edge can close a cycle), each component with its own M = its
    size; True promises the e-graph has no cycles and adds no order (a cyclic solution is
    then an error); False orders every edge, as TENSAT does, with M = number of classes.

    Before building, nodes that can never be chosen are dropped (a child class with no
    acyclic term, or its own class as child) and only classes the roots reach through the
    rest are kept. `dag_greedy` runs first: its DAG cost is HiGHS's objective cutoff
    (option objective_bound, passed verbatim; the solver prunes every branch that cannot
    beat it) and its choice the fallback. `time_limit` covers the whole call: HiGHS gets
    what remains after the greedy pass and the build (HiGHS may overrun it by some seconds
    in phases that do not check the clock). Unless HiGHS proves optimality, the better of
    its incumbent ("time limit (incumbent)") and the greedy choice ("time limit
    (dag-greedy)") is returned with optimal=False; `bound` is HiGHS's proven lower bound.
    """
    start = time.perf_counter()
    greedy = dag_greedy(problem)
    if not problem.roots:  # nothing to compute: the empty graph, trivially optimal
        return Extraction({}, 0.0, "ilp", time.perf_counter() - start, True, "optimal", 0.0, 0.0)
    model = _IlpModel(problem, acyclic)
    remaining = time_limit - (time.perf_counter() - start)
    if remaining <= 0:
        return _fallback(greedy, start, "time limit (dag-greedy)", None)
    from scipy.optimize import milp  # scipy's import takes a third of a second: when solved

    with warnings.catch_warnings():  # milp warns that it passes HiGHS options verbatim
        warnings.filterwarnings("ignore", "Unrecognized options", RuntimeWarning)
        res = milp(model.objective, integrality=model.integrality, bounds=model.bounds,
                   constraints=model.constraints,
                   options={"time_limit": remaining, "mip_rel_gap": 0.0, "disp": False,
                            # a cutoff the greedy choice itself meets despite rounding
                            "objective_bound": greedy.cost * (1 + 1e-9) + 1e-9,
                            # costs tens of seconds on bert and does not check the clock
                            "mip_detect_symmetry": False})
    bound = None if res.get("mip_dual_bound") is None else float(res.mip_dual_bound)
    reason = "time limit" if res.status == 1 else f"solver: {res.message}"
    if res.x is None:
        return _fallback(greedy, start, f"{reason} (dag-greedy)", bound)
    choice = model.choice(res.x)
    if not is_acyclic(problem, choice):
        raise ValueError("ilp(acyclic=True) on an e-graph with cycles chose a cyclic graph; "
                         "pass acyclic=None to exclude cycles")
    optimal = res.status == 0
    cost = dag_cost(problem, choice)
    if greedy.cost < cost:  # optimal: HiGHS stopped within its tolerance of the greedy cost
        found = _fallback(greedy, start, "optimal" if optimal else f"{reason} (dag-greedy)",
                          bound)
        found.optimal = optimal
        return found
    return Extraction(choice, cost, "ilp", time.perf_counter() - start, optimal,
                      "optimal" if optimal else f"{reason} (incumbent)", float(res.fun), bound)


def _fallback(greedy: Extraction, start: float, status: str, bound: float | None
              ) -> Extraction:
    return Extraction(greedy.choice, greedy.cost, "ilp", time.perf_counter() - start, False,
                      status, greedy.estimate, bound)


def _chosen(problem: ExtractionProblem, choice: Mapping[int, int], cls: int) -> int:
    node = choice.get(cls)
    if node is None:
        raise ValueError(f"class {cls} is reached from the roots but has no chosen node")
    if problem.node_class[node] != cls:
        raise ValueError(f"node {node} chosen for class {cls} is in class "
                         f"{problem.node_class[node]}")
    return node


def _find_cycle(problem: ExtractionProblem, choice: Mapping[int, int]) -> list[int] | None:
    """The classes of one cycle of the graph `choice` extracts, or None (iterative DFS)."""
    on_path, done = set(), set()
    for root in problem.roots:
        if root in done:
            continue
        path = [root]
        on_path.add(root)
        pending = [iter(problem.node_children[_chosen(problem, choice, root)])]
        while pending:
            for child in pending[-1]:
                if child in on_path:
                    return path[path.index(child):]
                if child not in done:
                    path.append(child)
                    on_path.add(child)
                    pending.append(iter(problem.node_children[_chosen(problem, choice, child)]))
                    break
            else:
                pending.pop()
                finished = path.pop()
                on_path.discard(finished)
                done.add(finished)
    return None


def _components(successors: list[list[int]]) -> list[int]:
    """Strongly connected component of each vertex (iterative Tarjan), numbered in the order
    Tarjan completes them: a component's successors all have lower numbers (children first)."""
    n = len(successors)
    index, low, comp = [-1] * n, [0] * n, [-1] * n
    stack: list[int] = []
    counter = found = 0
    for start in range(n):
        if index[start] >= 0:
            continue
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        work = [(start, iter(successors[start]))]
        while work:
            v, it = work[-1]
            for w in it:
                if index[w] < 0:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    work.append((w, iter(successors[w])))
                    break
                if comp[w] < 0:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[v])
                if low[v] == index[v]:
                    while True:
                        w = stack.pop()
                        comp[w] = found
                        if w == v:
                            break
                    found += 1
    return comp


def _check(problem: ExtractionProblem) -> None:
    bad = next((i for i, c in enumerate(problem.node_cost) if not 0.0 <= c < INF), None)
    if bad is not None:
        raise GraphsubError(f"node {bad} costs {problem.node_cost[bad]}; extraction needs "
                            "finite, non-negative costs")
    for root in problem.roots:
        if not 0 <= root < problem.num_classes:
            raise GraphsubError(f"root class {root} does not exist "
                                f"({problem.num_classes} classes)")


class _BottomUp:
    """The fixpoint both greedy extractors share: each class takes its cheapest node.

    Classes are processed from a heap keyed by their strongly connected component, children
    first; a class re-enters the heap when one of its children improves, and only its nodes
    that read an improved child ("dirty" nodes) are re-evaluated. A node is evaluated once
    all its children have finite costs; a class changes only on a strict improvement, so the
    pass terminates. Subclasses define `evaluate`.
    """

    def __init__(self, problem: ExtractionProblem) -> None:
        _check(problem)
        self.problem = problem
        k = problem.num_classes
        self.cost = [INF] * k
        self.best = [-1] * k
        #: The order in which classes first got a finite cost; a class's first node has
        #: children of lower order, which is what `choice` falls back on to break a cycle.
        self.order = [INF] * k
        self.payload: list[Any] = [None] * k

    def evaluate(self, node: int) -> tuple[float, Any] | None:
        """The node's cost and the payload its class keeps if it wins, or None to skip it."""
        raise NotImplementedError

    def run(self) -> None:
        p = self.problem
        node_class, children, cost = p.node_class, p.node_children, self.cost
        successors: list[list[int]] = [[] for _ in range(p.num_classes)]
        parents: list[list[int]] = [[] for _ in range(p.num_classes)]
        for node, kids in enumerate(children):
            for child in set(kids):
                parents[child].append(node)
                successors[node_class[node]].append(child)
        comp = _components(successors)
        dirty = [True] * p.num_nodes
        queued = [True] * p.num_classes
        heap = [(comp[c], c) for c in range(p.num_classes)]
        heapq.heapify(heap)
        finite = 0
        while heap:
            _, cls = heapq.heappop(heap)
            queued[cls] = False
            changed = False
            for node in p.class_nodes[cls]:
                if not dirty[node] or any(cost[c] == INF for c in children[node]):
                    continue
                dirty[node] = False
                result = self.evaluate(node)
                if result is not None and result[0] < cost[cls]:
                    cost[cls], self.payload[cls] = result
                    self.best[cls] = node
                    changed = True
            if not changed:
                continue
            if self.order[cls] == INF:
                self.order[cls] = finite
                finite += 1
            for parent in parents[cls]:
                dirty[parent] = True
                pc = node_class[parent]
                if not queued[pc]:
                    queued[pc] = True
                    heapq.heappush(heap, (comp[pc], pc))

    def choice(self) -> dict[int, int]:
        """The best node of every class the roots reach, with any cycle broken.

        Breaking a cycle: each class on it whose node reads a class of equal or later
        `order` switches to its cheapest node (node cost + children's costs) reading only
        earlier classes; its first finite node is one, so such a node exists. Every cycle
        has a class that reads a later one, so each round fixes at least one class for good
        and the loop ends with an acyclic choice (at worst every class's first node, which
        strictly decrease in order).
        """
        p = self.problem
        unreachable = [r for r in p.roots if self.cost[r] == INF]
        if unreachable:
            raise GraphsubError(f"root class {unreachable[0]} has no acyclic term: every node "
                                "in it depends on a cycle or a class without nodes")
        choice = {c: n for c, n in enumerate(self.best) if n >= 0}
        while (cycle := _find_cycle(p, choice)) is not None:
            for cls in cycle:
                if not self._reads_earlier(choice[cls]):
                    choice[cls] = min(
                        (n for n in p.class_nodes[cls] if self._reads_earlier(n)),
                        key=lambda n: p.node_cost[n] + sum(self.cost[c]
                                                           for c in p.node_children[n]))
        return reachable_choice(p, choice)

    def _reads_earlier(self, node: int) -> bool:
        mine = self.order[self.problem.node_class[node]]
        return all(self.order[c] < mine for c in self.problem.node_children[node])


class _TreeCosts(_BottomUp):
    """egg's cost: the node's cost plus its children's, a child read twice counted twice."""

    def evaluate(self, node: int) -> tuple[float, None]:
        cost = self.cost
        return (self.problem.node_cost[node]
                + sum(cost[c] for c in self.problem.node_children[node]), None)


class _DagCosts(_BottomUp):
    """Algorithm 2; a class's payload is its history (class -> attributed cost)."""

    def __init__(self, problem: ExtractionProblem) -> None:
        super().__init__(problem)
        self.payload = [{} for _ in range(problem.num_classes)]

    def evaluate(self, node: int) -> tuple[float, dict[int, float]] | None:
        value, history = self.node_value(self.problem.node_cost[node],
                                         self.problem.node_children[node])
        if self.problem.node_class[node] in history:
            return None  # the node reads its own class: choosing it would close a cycle
        return value, history

    def node_value(self, op_cost: float, children: Iterable[int]) -> tuple[float, dict[int, float]]:
        """Algorithm 2's cost of a node with this operator cost and these child classes, and
        its history. Overlaps are found with C-level key-set operations rather than the
        paper's per-key loop: same result, much faster on histories of thousands of classes."""
        cost, histories = self.cost, self.payload
        history: dict[int, float] = {}
        total = op_cost
        for child in children:
            if child in history:  # case 1: another child's subgraph already contains it
                continue
            child_history = histories[child]
            shared = child_history.keys() & history.keys()
            largest = max(map(child_history.__getitem__, shared), default=0.0)
            if shared:  # case 2: only the part not already counted
                history.update((k, child_history[k]) for k in child_history.keys() - shared)
            else:  # case 3, or case 2 without overlap: the whole child
                history.update(child_history)
            added = max(cost[child] - max(largest, 0.0), 0.0)
            history[child] = added
            total += added
        return total, history


class _IlpModel:
    """The ILP of `ilp` over the reduced e-graph, as scipy.optimize.milp's arrays.

    Columns: x for the kept nodes, then y for the reached classes, then t for the classes
    an order row mentions.
    """

    def __init__(self, problem: ExtractionProblem, acyclic: bool | None) -> None:
        self.problem = p = problem
        ok = _extractable(p)
        usable = [all(ok[c] for c in kids) and p.node_class[n] not in kids
                  for n, kids in enumerate(p.node_children)]
        classes: dict[int, int] = {}  # reached class -> its y column, less len(self.nodes)
        stack = list(dict.fromkeys(p.roots))
        while stack:
            cls = stack.pop()
            if cls in classes:
                continue
            classes[cls] = len(classes)
            stack.extend(c for n in p.class_nodes[cls] if usable[n]
                         for c in p.node_children[n] if c not in classes)
        self.nodes = [n for cls in classes for n in p.class_nodes[cls] if usable[n]]
        n_x = len(self.nodes)
        y = {cls: n_x + i for cls, i in classes.items()}
        # (class, child class) -> the x columns of the class's nodes that read the child
        readers: dict[tuple[int, int], list[int]] = {}
        for j, n in enumerate(self.nodes):
            for child in dict.fromkeys(p.node_children[n]):
                readers.setdefault((p.node_class[n], child), []).append(j)

        rows: list[int] = []
        cols: list[int] = []
        vals: list[float] = []
        lower: list[float] = []
        upper: list[float] = []

        def row(entries: Iterable[tuple[int, float]], lo: float, hi: float) -> None:
            r = len(lower)
            for col, val in entries:
                rows.append(r)
                cols.append(col)
                vals.append(val)
            lower.append(lo)
            upper.append(hi)

        members: dict[int, list[int]] = {cls: [] for cls in classes}
        for j, n in enumerate(self.nodes):
            members[p.node_class[n]].append(j)
        for cls, js in members.items():
            row([(y[cls], -1.0), *((j, 1.0) for j in js)], 0.0, 0.0)
        for (cls, child), js in readers.items():
            row([*((j, 1.0) for j in js), (y[child], -1.0)], -INF, 0.0)

        order: dict[int, int] = {}  # class -> its t column
        big_m: list[float] = []
        if acyclic is not True:
            for cycle in _short_cycles(readers, classes):
                edges = zip(cycle, cycle[1:] + cycle[:1], strict=True)
                row([(j, 1.0) for edge in edges for j in readers[edge]], -INF, len(cycle) - 1)
            for (cls, child), m in _ordered_edges(readers, classes, acyclic):
                for c in (cls, child):
                    if c not in order:
                        order[c] = n_x + len(classes) + len(order)
                        big_m.append(m)
                # t_cls - t_child >= 1 - M (1 - sum of the readers' x)
                row([(order[cls], 1.0), (order[child], -1.0),
                     *((j, -m) for j in readers[cls, child])], 1.0 - m, INF)

        n_vars = n_x + len(classes) + len(order)
        self.objective = np.zeros(n_vars)
        self.objective[:n_x] = [p.node_cost[n] for n in self.nodes]
        self.integrality = np.zeros(n_vars)
        self.integrality[:n_x + len(classes)] = 1
        lo_bounds = np.zeros(n_vars)
        lo_bounds[[y[r] for r in p.roots]] = 1.0
        hi_bounds = np.ones(n_vars)
        hi_bounds[n_x + len(classes):] = np.array(big_m) - 1
        from scipy.optimize import Bounds, LinearConstraint
        from scipy.sparse import coo_array

        self.bounds = Bounds(lo_bounds, hi_bounds)
        matrix = coo_array((vals, (rows, cols)), shape=(len(lower), n_vars)).tocsr()
        self.constraints = LinearConstraint(matrix, np.array(lower), np.array(upper))

    def choice(self, x: np.ndarray) -> dict[int, int]:
        """The selected node of each class the roots reach (y = sum x keeps it unique)."""
        p = self.problem
        chosen = {p.node_class[self.nodes[i]]: self.nodes[i]
                  for i in np.flatnonzero(x[:len(self.nodes)] > 0.5)}
        return reachable_choice(p, chosen)


def _class_components(readers: Mapping[tuple[int, int], list[int]],
                      classes: Mapping[int, int]) -> list[int]:
    successors: list[list[int]] = [[] for _ in classes]
    for cls, child in readers:
        successors[classes[cls]].append(classes[child])
    return _components(successors)


def _ordered_edges(readers: Mapping[tuple[int, int], list[int]], classes: Mapping[int, int],
                   acyclic: bool | None) -> list[tuple[tuple[int, int], float]]:
    """The class edges that get an order row, each with its M (see `ilp`)."""
    if acyclic is False:
        return [(edge, float(len(classes))) for edge in readers]
    comp = _class_components(readers, classes)
    size = [0] * (max(comp, default=-1) + 1)
    for c in comp:
        size[c] += 1
    return [((cls, child), float(size[comp[classes[cls]]])) for cls, child in readers
            if comp[classes[cls]] == comp[classes[child]]]


def _short_cycles(readers: Mapping[tuple[int, int], list[int]],
                  classes: Mapping[int, int], longest: int = 3) -> list[list[int]]:
    """Every simple cycle of at most `longest` classes in the class graph, once each (from
    its smallest class)."""
    comp = _class_components(readers, classes)
    successors: dict[int, list[int]] = {}
    for cls, child in readers:
        if comp[classes[cls]] == comp[classes[child]]:
            successors.setdefault(cls, []).append(child)
    cycles = []
    for first in successors:
        paths = [[first]]
        while paths:
            path = paths.pop()
            for nxt in successors.get(path[-1], ()):
                if nxt == first:
                    cycles.append(path)
                elif nxt > first and nxt not in path and len(path) < longest:
                    paths.append(path + [nxt])
    return cycles


def _extractable(problem: ExtractionProblem) -> list[bool]:
    """Which classes have an acyclic term: the least fixpoint of "has a node whose children
    all have one", found by counting each node's unresolved distinct children (Kahn)."""
    waiting = [len(set(kids)) for kids in problem.node_children]
    parents: list[list[int]] = [[] for _ in range(problem.num_classes)]
    for n, kids in enumerate(problem.node_children):
        for c in set(kids):
            parents[c].append(n)
    ok = [False] * problem.num_classes
    ready = [n for n, w in enumerate(waiting) if w == 0]
    while ready:
        cls = problem.node_class[ready.pop()]
        if ok[cls]:
            continue
        ok[cls] = True
        for parent in parents[cls]:
            waiting[parent] -= 1
            if waiting[parent] == 0:
                ready.append(parent)
    return ok


#: The extractors by name, each a function of the problem and a time limit (which only the
#: ILP uses), in the order the e-graph searches run them by default.
EXTRACTORS: dict[str, Callable[[ExtractionProblem, float], Extraction]] = {
    "ilp": lambda problem, time_limit: ilp(problem, time_limit=time_limit),
    "dag-greedy": lambda problem, time_limit: dag_greedy(problem),
    "greedy": lambda problem, time_limit: tree_greedy(problem),
}
