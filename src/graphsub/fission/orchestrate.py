"""Kernel orchestration by a binary linear program (Korch, section 5), on HiGHS.

Given the candidate kernels of a primitive graph and each one's measured cost, choose the set
of kernels that computes the graph's outputs at the least total cost:

    minimize    sum_k c_k x_k                                  x_k in {0, 1}
    subject to  sum_{k writes o} x_k >= 1                      every graph output o
                x_k <= sum_{k' writes v} x_k'                  every value v kernel k reads

A primitive may run in two chosen kernels (redundant computation): nothing forbids it, and it
pays where recomputing a cheap primitive saves writing and reading its output. The program
does not see the order kernels run in, so a solution can be cyclic: kernel A reads what B
writes and B what A writes. Cycles are cut lazily: the solution is scheduled, and when some
kernels cannot be, the constraint that they are not all chosen unless a kernel outside them
writes one of the values they wait for is added, and the program solved again. Each cut only
removes choices that cannot be scheduled, so the optimum is kept.

On a time limit HiGHS returns its incumbent when it has one; without one (or on any failure)
the orchestration falls back to the primitives as they are, so the result is always a
schedulable choice.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_array

from graphsub.errors import GraphsubError
from graphsub.fission.candidates import Kernel
from graphsub.ir.graph import Graph, Value
from graphsub.rules.applier import BuildingHost, Rejection, build_targets
from graphsub.rules.expr import Env

#: Rounds of cycle cuts before the orchestration gives up on the program's answer.
MAX_CUT_ROUNDS = 50


@dataclass
class Orchestration:
    """The kernels chosen, in an order they can run in, and how the choice was made."""

    kernels: list[Kernel]
    cost: float
    #: "optimal", "time limit" (HiGHS's incumbent), or "fallback: <why>".
    status: str
    solve_seconds: float = 0.0
    cut_rounds: int = 0
    candidates: int = 0
    notes: list[str] = field(default_factory=list)


def schedule(chosen: Sequence[Kernel], available: set[Value]
             ) -> tuple[list[Kernel], list[Kernel]]:
    """The chosen kernels in an order they can run in, and those that cannot run (waiting on
    each other in a cycle, or on a value no chosen kernel writes). `available`: the values no
    kernel computes (inputs, weights, weight-only values)."""
    ready = set(available)
    pending = list(chosen)
    order: list[Kernel] = []
    progress = True
    while pending and progress:
        progress = False
        still = []
        for k in pending:
            if all(v in ready for v in k.inputs):
                order.append(k)
                ready.update(k.outputs)
                progress = True
            else:
                still.append(k)
        pending = still
    return order, pending


def _source_values(graph: Graph, kernels: Sequence[Kernel]) -> set[Value]:
    computed = {v for k in kernels for v in k.outputs}
    read = {v for k in kernels for v in k.inputs} | set(graph.outputs)
    return read - computed


def orchestrate(graph: Graph, kernels: Sequence[Kernel], time_limit: float = 10.0
                ) -> Orchestration:
    """The least-cost schedulable choice of `kernels` computing `graph`'s outputs. `kernels`
    must include one per primitive (candidates.primitive_kernels), so a choice always exists."""
    start = time.perf_counter()
    kernels = list(kernels)
    n = len(kernels)
    if n == 0:  # nothing computes (every node a source or weight-only): nothing to choose
        return Orchestration([], 0.0, "optimal")
    writers: dict[Value, list[int]] = {}
    for i, k in enumerate(kernels):
        for v in k.outputs:
            writers.setdefault(v, []).append(i)
    available = {v for v in _source_values(graph, kernels) if v not in writers}
    fallback = [k for k in kernels if k.kind == "primitive"]

    rows: list[dict[int, float]] = []
    lower: list[float] = []
    for o in dict.fromkeys(graph.outputs):
        if o in writers:
            rows.append({i: 1.0 for i in writers[o]})
            lower.append(1.0)
    for i, k in enumerate(kernels):
        for v in k.inputs:
            if v in available:
                continue
            row = {j: 1.0 for j in writers.get(v, ())}
            row[i] = row.get(i, 0.0) - 1.0
            rows.append(row)
            lower.append(0.0)
    costs = np.array([k.cost for k in kernels], dtype=float)
    # A kernel the target could not price (inf, NaN) is never worth choosing, unless nothing
    # else computes what it computes.
    finite = costs[np.isfinite(costs)]
    costs[~np.isfinite(costs)] = 1e3 * max(float(finite.max()) if finite.size else 1.0, 1.0)

    def result(chosen: list[Kernel], status: str, rounds: int) -> Orchestration:
        order, stuck = schedule(chosen, available)
        assert not stuck
        return Orchestration(order, float(sum(k.cost for k in order)), status,
                             time.perf_counter() - start, rounds, n)

    for rounds in range(MAX_CUT_ROUNDS):
        left = time_limit - (time.perf_counter() - start)
        if left <= 0:
            return result(fallback, "fallback: time limit before a solution", rounds)
        x = _solve(costs, rows, lower, n, left)
        if x is None:
            return result(fallback, "fallback: no solution within the time limit", rounds)
        solution, optimal = x
        chosen = [kernels[i] for i in range(n) if solution[i] > 0.5]
        chosen = _drop_unneeded(graph, chosen)
        _, stuck = schedule(chosen, available)
        if not stuck:
            return result(chosen, "optimal" if optimal else "time limit", rounds)
        # A cut: not all of the stuck kernels, unless a kernel outside them writes a value
        # one of them waits for.
        stuck_ids = {id(k) for k in stuck}
        index = {id(k): i for i, k in enumerate(kernels)}
        row = {index[id(k)]: 1.0 for k in stuck}
        for k in stuck:
            for v in k.inputs:
                for j in writers.get(v, ()):
                    if id(kernels[j]) not in stuck_ids:
                        row[j] = row.get(j, 0.0) - 1.0
        rows.append({j: -c for j, c in row.items()})
        lower.append(1.0 - len(stuck))
    return result(fallback, f"fallback: still cyclic after {MAX_CUT_ROUNDS} cuts",
                  MAX_CUT_ROUNDS)


def _drop_unneeded(graph: Graph, chosen: list[Kernel]) -> list[Kernel]:
    """Without kernels whose outputs nothing chosen reads (a zero-cost kernel the solver was
    free to pick): the kernels reached backwards from the graph's outputs."""
    needed = set(graph.outputs)
    keep: dict[int, Kernel] = {}
    grew = True
    while grew:
        grew = False
        for k in chosen:
            if id(k) not in keep and any(v in needed for v in k.outputs):
                keep[id(k)] = k
                needed.update(k.inputs)
                grew = True
    return [k for k in chosen if id(k) in keep]


def _solve(costs: np.ndarray, rows: list[dict[int, float]], lower: list[float], n: int,
           time_limit: float) -> tuple[np.ndarray, bool] | None:
    """HiGHS's answer (solution, proven optimal), or None without a feasible one."""
    r, c, v = [], [], []
    for i, row in enumerate(rows):
        for j, a in row.items():
            if a:
                r.append(i)
                c.append(j)
                v.append(a)
    constraints = []
    if rows:
        matrix = coo_array((v, (r, c)), shape=(len(rows), n)).tocsr()
        constraints.append(LinearConstraint(matrix, np.array(lower), np.inf))
    res = milp(costs, constraints=constraints, integrality=np.ones(n),
               bounds=Bounds(0, 1), options={"time_limit": max(time_limit, 0.01)})
    if res.x is None:
        return None
    return np.asarray(res.x), res.status == 0


def assemble(graph: Graph, orchestration: Orchestration) -> Graph:
    """The primitive graph with the chosen library and generated kernels in place: each one's
    fused operator is built from the values its match bound (a generated kernel's from the
    values it reads), in schedule order, and takes over its outputs' readers. Primitives no chosen kernel needs are then dead and removed; those a library
    kernel covers but another kernel still reads stay (the redundant computation chosen)."""
    editor = graph.edit()
    replaced: dict[Value, Value] = {}
    for k in orchestration.kernels:
        if k.kind == "generated":
            outs = editor.add("fused", [replaced.get(v, v) for v in k.reads], {"body": k.body})
            for old, new in zip(k.outputs, outs):
                editor.replace_uses(old, new)
                replaced[old] = new
            continue
        if k.kind != "library":
            continue
        assert k.match is not None
        m = k.match
        tensors = {name: replaced.get(v, v) for name, v in m.tensors.items()}
        targets = build_targets(editor, m.rule, Env(BuildingHost(editor), tensors, m.attrs,
                                                    m.roots))
        if isinstance(targets, Rejection):
            raise GraphsubError(f"kernel {k.label} could not be built: {targets.reason}")
        for old, new in zip(m.roots, targets):
            editor.replace_uses(old, new)
            replaced[old] = new
    return editor.finish().dce()

