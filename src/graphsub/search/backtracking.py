"""Cost-based backtracking search (MetaFlow Algorithm 1, TASO Algorithm 2).

Candidate graphs wait in a priority queue ordered by cost. Each dequeued graph is expanded by
pricing every rule at every match (graphsub.search.pricing: without building the child); a new
graph becomes the best if it is cheaper, and is queued if its cost is below alpha times the
best cost. alpha = 1 is greedy (only
improvements are explored); alpha > 1 allows relaxed substitutions that raise cost on the way
to a better graph. Graphs are deduplicated by fingerprint when dequeued, and graphs with more than
`max_node_factor` times the original number of nodes are dropped. The budget counts graphs
expanded.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from graphsub.cost.base import CostModel
from graphsub.ir.graph import Graph, Value
from graphsub.rules.applier import Rejection, apply_match
from graphsub.rules.ast import Rule
from graphsub.rules.rematching import IncrementalMatcher
from graphsub.rules.matcher import Match
from graphsub.search.pricing import price_rewrite
from graphsub.search.registry import Limits, option, register
from graphsub.search.result import OptimizeResult, Step
from graphsub.search.run import SearchRun

#: Graphs expanded when the limits give no budget.
BUDGET = 1000


@dataclass(frozen=True, kw_only=True)
class GreedyOptions:
    max_node_factor: float = option(2.0, "children with more than this many times the input "
                                    "graph's operators are dropped", least=1.0)


@dataclass(frozen=True, kw_only=True)
class BacktrackingOptions(GreedyOptions):
    alpha: float = option(1.05, "children costing less than alpha x the best cost so far are "
                          "queued (1: greedy)", least=1.0)


@register("backtracking", BacktrackingOptions, "graphs expanded", BUDGET)
def backtracking_search(graph: Graph, rules: Sequence[Rule], cost_model: CostModel,
                        limits: Limits = Limits(),
                        options: BacktrackingOptions = BacktrackingOptions()) -> OptimizeResult:
    """Search for a cheaper equivalent graph. Stops when the queue is empty, when the budget
    of expansions is spent, at the time limit, or on Ctrl-C, returning the best graph so far."""
    alpha = options.alpha
    run = SearchRun(limits, limits.budget_or(BUDGET))
    stats, best = run.stats, run.best
    initial_cost = cost_model.graph_cost(graph)
    node_cap = options.max_node_factor * len(graph)
    matcher = IncrementalMatcher(rules)
    seen: set[int] = set()
    counter = itertools.count()
    # A queued graph is kept as (parent, match) with the parent's trace, and rebuilt when
    # dequeued: holding thousands of child graphs (or their traces' steps) would cost memory
    # and time for each, rebuilding one costs one rewrite.
    queue: list[tuple[float, int, Graph | tuple[Graph, Match[Value]], tuple[Step, ...]]] = [
        (initial_cost, next(counter), graph, ())]
    best.offer(graph, initial_cost, ())

    def expand(g: Graph, trace: tuple[Step, ...]) -> None:
        """Price every match in `g`; keep the best children, queue the promising ones."""
        for matches in matcher.matches(g):
            for match in matches:
                if run.check_limits():
                    return
                stats.matches += 1
                priced = price_rewrite(g, match, cost_model)
                if isinstance(priced, Rejection):
                    stats.rejected[priced.reason] += 1
                    continue
                stats.generated += 1
                if priced.nodes > node_cap:
                    stats.pruned += 1
                    continue
                new_cost = priced.cost
                if new_cost < best.top.cost or len(best) < best.keep:
                    new = apply_match(g, match)  # only the few that are kept are built
                    if isinstance(new, Rejection):
                        stats.rejected[new.reason] += 1
                        stats.pruned += 1
                        continue
                    new_cost = cost_model.graph_cost(new)
                    best.offer(new, new_cost, trace + (Step.applying(match, new_cost),))
                if new_cost < alpha * best.top.cost:
                    heapq.heappush(queue, (new_cost, next(counter), (g, match), trace))
                else:
                    stats.pruned += 1
            if run.check_limits():
                return

    with run.stoppable():
        while queue and not run.check_limits(budgeted=True):
            cost, _, entry, trace = heapq.heappop(queue)
            g = entry if isinstance(entry, Graph) else apply_match(*entry)
            if isinstance(g, Rejection):  # priced, not built: the rewrite makes a cycle
                stats.rejected[g.reason] += 1
                stats.pruned += 1
                continue
            fp = g.fingerprint()
            if fp in seen:  # reached before along another sequence of rewrites
                stats.duplicates += 1
                continue
            seen.add(fp)
            stats.explored += 1
            if not isinstance(entry, Graph):
                trace = trace + (Step.applying(entry[1], cost),)
            expand(g, trace)
            run.report(best.top.cost)

    stats.matches_computed = matcher.counts.computed
    stats.matches_reused = matcher.counts.reused
    return run.result(initial_cost)


@register("greedy", GreedyOptions, "graphs expanded", BUDGET)
def greedy_search(graph: Graph, rules: Sequence[Rule], cost_model: CostModel,
                  limits: Limits = Limits(), options: GreedyOptions = GreedyOptions()
                  ) -> OptimizeResult:
    """Backtracking with alpha = 1: only substitutions that lower the cost are followed."""
    return backtracking_search(graph, rules, cost_model, limits,
                               BacktrackingOptions(alpha=1.0,
                                                   max_node_factor=options.max_node_factor))
