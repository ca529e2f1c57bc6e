"""The search's starting point: the graph with its normal-form rules applied until none
matches.

Some rewrites pay only as a chain: attention written out becomes one attention operator after
its views are unflattened, its softmax's float32 casts read as the softmax itself, its scale
moved, its causal mask read as a flag and grouped-query attention's copies dropped, six to ten
steps per layer, of which only the last few lower the cost much. A search that expands one
graph at a time within seconds finds such a chain in few layers of a model or none (a 4-layer
bfloat16 decoder: none in 10 s). These rules rewrite what a model writes in many ways into
one form, each step removing what its source matched, so applying them all to a fixed point
terminates and depends on no cost; the result is kept as the search's start only where the
cost model predicts it cheaper than the input graph, and every step is in the trace, as a
search's are.

Which rules: those that declare the normal-form role (graphsub.rules.roles: the library's
activations, attention and cleanup files do, in their headers), among the rules the run was
given; a rule file of the user's takes part where it declares the role too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from graphsub.cost.base import CostModel
from graphsub.ir.graph import Graph
from graphsub.rules.applier import Rejection
from graphsub.rules.ast import Rule
from graphsub.rules.fixed_point import rewrite_to_fixed_point
from graphsub.rules.roles import Role, with_role
from graphsub.search.pricing import price_rewrite
from graphsub.search.result import OptimizeResult, Step

def normal_form(graph: Graph, rules: Sequence[Rule], cost_model: CostModel
                ) -> tuple[Graph, tuple[Step, ...]]:
    """The graph with `rules` applied wherever they match until none does
    (rules.fixed_point), and the steps taken. The graph is returned unchanged, with no
    steps, unless the result is predicted cheaper."""
    start = graph
    graph, steps = rewrite_to_fixed_point(graph, rules)
    final = cost_model.graph_cost(graph) if steps else None
    if final is None or not final < cost_model.graph_cost(start):
        return start, ()
    # each step's cost priced from the graph before it (only the nodes it adds are priced);
    # a model that compiles what it prices would compile kernels of graphs nobody runs, so
    # under it the normal form is one move: every step carries the cost after the last
    costs = [] if cost_model.compiles else [price_rewrite(before, match, cost_model)
                                            for before, match in steps[:-1]]
    paid = [final if isinstance(c, Rejection) else c.cost for c in costs]
    return graph, tuple(Step.applying(match, paid[i] if i < len(paid) else final)
                        for i, (_, match) in enumerate(steps))


def first_normal_form(graph: Graph, rules: Sequence[Rule]) -> tuple[Graph, tuple[Step, ...]]:
    """The graph with `rules` applied to a fixed point, whatever a cost model would say, and
    the steps taken (their cost unknown: NaN): for a caller that applies the normal form
    before pricing anything and races the result against the input afterwards (the
    torch.compile backend). Pricing first once took a part's whole time limit on a GPU
    (timing operators, compiling fused groups), and the attention normal form, the largest
    gain there was, was never applied."""
    rewritten, steps = rewrite_to_fixed_point(graph, rules)
    return rewritten, tuple(Step.applying(match, math.nan) for _, match in steps)


def with_start(result: OptimizeResult, steps: tuple[Step, ...],
               initial_cost: float) -> OptimizeResult:
    """A search's result from a normal-form start as the result of the whole way from the
    input graph: the normal form's steps lead every trace, and costs count from the input."""
    if not steps:
        return result
    candidates = tuple(replace(c, trace=steps + c.trace) for c in result.candidates)
    return replace(result, trace=steps + result.trace, initial_cost=initial_cost,
                   candidates=candidates)


__all__ = ["first_normal_form", "normal_form", "with_start"]
