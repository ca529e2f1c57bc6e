"""What the search found, applied wherever else it pays: one layer's rewrites in every layer.

A decoder of 32 layers repeats one block 32 times, and a rewrite that pays in one copy pays
in all of them. A search that expands one graph at a time reaches the last copies late, or
not within its time: on a 16-layer Llama the backtracking search spends most of its time
applying, one expansion each, rewrites it has already found worthwhile in the first layers.
`propagate` takes the search's best graph and applies the rules its trace used wherever
they match and lower the predicted cost, until none does: first improvement, each match
priced without building the child (graphsub.search.pricing), matches that did not pay
remembered so that a far-away change does not make them be priced again. It finds the
repeated layers by matching the rules that paid, not by hashing layers: what it applies
is whatever those rules improve, inside the layers or not, and every step is priced.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import replace

from graphsub.cost.base import CostModel
from graphsub.rules.applier import Rejection, apply_match
from graphsub.rules.ast import Rule
from graphsub.rules.rematching import IncrementalMatcher
from graphsub.search.pricing import price_rewrite
from graphsub.search.result import Candidate, OptimizeResult, Step, StepKind, StepMatch

#: A rewrite must lower the predicted cost by more than this share to count as paying (cost
#: sums of many operators are not exact to the last bit).
MIN_SHARE = 1e-9


def propagate(result: OptimizeResult, rules: Sequence[Rule], cost_model: CostModel,
              deadline: float | None) -> OptimizeResult:
    """The result with its best graph rewritten further by the rules its trace applied,
    wherever they lower the predicted cost, until none does or the deadline passes (a
    `time.perf_counter()` value; None: none). The result is returned unchanged where nothing more pays;
    otherwise the new graph leads its candidates, and `stats.propagated` counts the steps."""
    used = {step.rule for step in result.trace if step.kind is StepKind.RULE}
    chosen = [rule for rule in rules if rule.name in used]
    if not chosen or not result.candidates:
        return result
    deadline = math.inf if deadline is None else deadline
    graph, cost = result.graph, result.final_cost
    trace = list(result.trace)
    matcher = IncrementalMatcher(chosen)
    unpaid: set[tuple[str, StepMatch]] = set()
    applied = 0
    improved = True
    while improved and time.perf_counter() < deadline:
        improved = False
        for match in (m for matches in matcher.matches(graph) for m in matches):
            if time.perf_counter() >= deadline:
                break
            key = (match.rule.name, StepMatch.of(match))
            if key in unpaid:
                continue
            priced = price_rewrite(graph, match, cost_model)
            if isinstance(priced, Rejection) or priced.cost >= cost * (1 - MIN_SHARE):
                unpaid.add(key)
                continue
            new = apply_match(graph, match)
            new_cost = cost_model.graph_cost(new) if not isinstance(new, Rejection) else cost
            if isinstance(new, Rejection) or new_cost >= cost * (1 - MIN_SHARE):
                unpaid.add(key)
                continue
            graph, cost = new, new_cost
            trace.append(Step.applying(match, cost))
            applied += 1
            improved = True
            break  # the matches of the new graph, from those of this one
    if not applied:
        return result
    stats = replace(result.stats, propagated=applied)
    best = Candidate(graph, cost, tuple(trace))
    return replace(result, graph=graph, trace=best.trace, final_cost=cost, stats=stats,
                   candidates=(best, *result.candidates))


__all__ = ["propagate"]
