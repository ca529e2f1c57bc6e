"""A test-only search, added as a user would add one in a package of their own: one module
that declares it and registers its function and options. It applies the first match of the
first rule that matches, `steps` times (a walk, not a search): enough to show that the
settings, the API and the command line take an algorithm they were never told about."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from graphsub.cost.base import CostModel
from graphsub.ir.graph import Graph
from graphsub.rules import Rule
from graphsub.rules.applier import apply_match
from graphsub.rules.matcher import find_matches
from graphsub.search.registry import Limits, declare, option, register
from graphsub.search.result import OptimizeResult, SearchStats, Step

NAME = "first-match"
declare(NAME, __name__, "the first match of the first rule, steps times (a test walk)")


@dataclass(frozen=True, kw_only=True)
class FirstMatchOptions:
    steps: int = option(1, "rewrites applied", least=0)


@register(NAME, FirstMatchOptions, "rewrites", None)
def first_match_search(graph: Graph, rules: Sequence[Rule], cost_model: CostModel,
                       limits: Limits = Limits(),
                       options: FirstMatchOptions = FirstMatchOptions()) -> OptimizeResult:
    initial = cost_model.graph_cost(graph)
    trace: list[Step] = []
    for _ in range(options.steps):
        rewritten = next((g for rule in rules for m in find_matches(graph, rule)
                          if isinstance(g := apply_match(graph, m), Graph)), None)
        if rewritten is None:
            break
        graph = rewritten
        trace.append(Step("first match", cost_model.graph_cost(graph)))
    final = cost_model.graph_cost(graph)
    return OptimizeResult(graph, tuple(trace), SearchStats(explored=len(trace)), initial, final)
