"""Entailment: whether premises (the axioms, and lemmas once proven) imply a goal, asked of Z3
first with E-matching triggers and model-based instantiation off (proofs arrive in
milliseconds, or instances run out), then with Z3's default configuration for the rest of the
time. Below both the prover (rules) and the lemmas (which are proven from the axioms alone).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

import z3

from graphsub.proofs.axioms import axioms


def open_forall(q: z3.QuantifierRef) -> tuple[list[z3.ExprRef], z3.ExprRef]:
    """Fresh constants for a universal formula's bound variables, and its body over them."""
    consts = [z3.FreshConst(q.var_sort(i), q.var_name(i)) for i in range(q.num_vars())]
    return consts, z3.substitute_vars(q.body(), *reversed(consts))


# E-matching only: no model-based instantiation, no automatic configuration (which otherwise
# keeps searching long after the instances have saturated).
_EMATCH = {"auto_config": False, "smt.mbqi": False}


def _consts_in(e: z3.ExprRef, ids: set[int]) -> set[int]:
    found, seen, todo = set(), set(), [e]
    while todo:
        t = todo.pop()
        if t.get_id() in seen:
            continue
        seen.add(t.get_id())
        if t.get_id() in ids:
            found.add(t.get_id())
        todo.extend(t.children())
    return found


def with_patterns(q: z3.BoolRef) -> z3.BoolRef:
    """The same universal equation, triggered by each of its sides that mentions every bound
    variable (both sides of most axioms, so they rewrite either way; only the left of
    transpose-involution or conv-enlarge, whose right side lacks a variable)."""
    if not (z3.is_quantifier(q) and q.is_forall()):
        return q
    consts, body = open_forall(q)
    if not z3.is_eq(body):
        return q
    ids = {c.get_id() for c in consts}
    patterns = [side for side in body.children()
                if z3.is_app(side) and side.num_args() > 0 and _consts_in(side, ids) == ids]
    return z3.ForAll(consts, body, patterns=patterns) if patterns else q


@lru_cache(maxsize=1)
def _patterned_axioms() -> tuple[z3.BoolRef, ...]:
    return tuple(with_patterns(ax.formula) for ax in axioms())


def _check(goal: z3.BoolRef, premises: Iterable[z3.BoolRef], hints: Iterable[z3.ExprRef],
           params: dict[str, Any], timeout_ms: float) -> z3.CheckSatResult:
    solver = z3.Solver()
    for key, value in params.items():
        solver.set(key, value)
    solver.set("timeout", max(1, int(timeout_ms)))
    for f in premises:
        solver.add(f)
    for h in hints:  # a fresh constant's definition: it puts the term in the E-graph
        solver.add(z3.FreshConst(h.sort(), "hint") == h)
    solver.add(z3.Not(goal))
    return solver.check()


def _entails_one(goal: z3.BoolRef, timeout_ms: float, lemma_formulas: tuple[z3.BoolRef, ...],
                 hints: Iterable[z3.ExprRef]) -> tuple[bool, str]:
    start = time.monotonic()
    first = min(timeout_ms, max(250.0, timeout_ms / 4))
    premises = _patterned_axioms() + tuple(with_patterns(f) for f in lemma_formulas)
    if _check(goal, premises, hints, _EMATCH, first) == z3.unsat:
        return True, ""
    left = timeout_ms - 1000 * (time.monotonic() - start)
    if left < 1:
        return False, "timeout"
    premises = tuple(ax.formula for ax in axioms()) + tuple(lemma_formulas)
    result = _check(goal, premises, hints, {}, left)
    if result == z3.unsat:
        return True, ""
    return False, "timeout" if result == z3.unknown else "the axioms do not entail it"


def entails_all(goals: list[z3.BoolRef], timeout_ms: float,
                lemma_formulas: tuple[z3.BoolRef, ...] = (),
                hints: list[z3.ExprRef] | tuple[z3.ExprRef, ...] = ()) -> tuple[bool, str]:
    """Whether the axioms and `lemma_formulas` entail every goal, each proven on its own, all
    within `timeout_ms` together."""
    deadline = time.monotonic() + timeout_ms / 1000
    for k, goal in enumerate(goals):
        share = 1000 * (deadline - time.monotonic()) / (len(goals) - k)
        ok, why = _entails_one(goal, share, lemma_formulas, hints)
        if not ok:
            return False, why if len(goals) == 1 else f"{why} (output {k + 1} of {len(goals)})"
    return True, ""
