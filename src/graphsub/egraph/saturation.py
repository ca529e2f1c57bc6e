"""Equality saturation with Tensat's schedule, as a search algorithm (`--algorithm eqsat`).

Tensat (Yang et al. 2021) grows one e-graph from the input graph: in each of the first
k_multi iterations the multi-pattern rules are applied once, and single-pattern rules run
every iteration, until the e-graph saturates (an iteration changes nothing) or reaches the node,
iteration or time limit. By default the single-pattern rules run under egg's back-off
scheduler (graphsub.egraph.schedule: a rule with too many matches sits out a few
iterations), so that the prolific ones do not fill the node limit; `scheduler=simple` runs
every rule every iteration, as Tensat does. Each iteration is recorded (the report's
search.egraph.log). The best graph is then extracted: an ILP (HiGHS) by default, as in
Tensat, with the greedy extractors' graphs as further candidates. Every extracted graph is
priced again by the cost model as a graph, so the result's cost is the graph's, not the
extractor's estimate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from graphsub.cost.base import CostModel
from graphsub.egraph.egraph import GraphEncoding, egraph_from_graph
from graphsub.egraph.problem import ExtractionProblem
from graphsub.egraph.readback import NodeCosts, extraction_problem, graph_from_choice
from graphsub.egraph.runner import GrowthStats, Runner
from graphsub.egraph.schedule import BackoffScheduler
from graphsub.errors import GraphsubError
from graphsub.ir.graph import Graph
from graphsub.rules.ast import Rule
from graphsub.egraph.extract import EXTRACTORS, Extraction
from graphsub.search.registry import Limits, option, register
from graphsub.search.result import OptimizeResult, Step, StopReason
from graphsub.search.run import SearchRun


#: Below this many seconds left, the ILP is skipped (the greedy extractors take
#: milliseconds): the search's time limit holds, within a second or 10%.
MIN_ILP_TIME = 0.5
#: The share of the time limit for growing the e-graph; the rest is for the rebuild after the
#: last applications and for extraction.
CONSTRUCTION_SHARE = 0.85

def run_extractor(name: str, problem: ExtractionProblem, time_limit: float) -> Extraction:
    """What the extractor `name` (graphsub.egraph.extract.EXTRACTORS) makes of the problem."""
    if name not in EXTRACTORS:
        raise GraphsubError(f"unknown extractor {name!r}; use one of {', '.join(EXTRACTORS)}")
    return EXTRACTORS[name](problem, time_limit)


@dataclass
class EGraphSearch:
    """What both e-graph algorithms share: the run (clock, statistics, stop reason, best
    graphs), the encoding, the runner, costs."""

    graph: Graph
    encoding: GraphEncoding
    runner: Runner
    costs: NodeCosts
    run: SearchRun

    @classmethod
    def begin(cls, graph: Graph, rules: Sequence[Rule], cost_model: CostModel,
              node_limit: int, limits: Limits, budget: int | None, unit: str) -> EGraphSearch:
        """Growing the e-graph may take CONSTRUCTION_SHARE of the time limit (the run's
        deadline); the last rebuild and the extraction need the rest."""
        run = SearchRun(limits, budget, unit, StopReason.ITERATIONS, CONSTRUCTION_SHARE)
        if node_limit < 1:
            raise GraphsubError(f"the e-graph node limit must be positive (got {node_limit})")
        encoding = egraph_from_graph(graph)
        return cls(graph, encoding, Runner(encoding.egraph, rules, node_limit),
                   NodeCosts(cost_model), run)

    def extraction_time(self, extract_time: float | None) -> float:
        return self.run.remaining() if extract_time is None else extract_time

    def extract_cost(self, runner: Runner) -> float:
        """The DAG-aware greedy estimate of a state's best graph (MCTS's reward signal)."""
        ep = extraction_problem(runner.egraph, self.encoding.outputs, self.costs)
        return run_extractor("dag-greedy", ep.problem, 0.0).cost

    def finish(self, runner: Runner, extractors: Sequence[str], time_limit: float,
               growth: GrowthStats, decisions: Sequence[str] = ()) -> OptimizeResult:
        """Extract with each extractor, price the graphs, return the best few."""
        cost_model = self.costs.cost_model
        initial_cost = cost_model.graph_cost(self.graph)
        eg = runner.egraph
        ep = extraction_problem(eg, self.encoding.outputs, self.costs)
        best = self.run.best
        best.offer(self.graph, initial_cost, ())
        seen = {self.graph.fingerprint()}
        details = {}
        for name in extractors:
            if name == "ilp" and time_limit < MIN_ILP_TIME:
                details[name] = {"cost": None, "seconds": 0.0,
                                 "status": f"skipped: {time_limit:.2f} s left"}
                continue
            extraction = run_extractor(name, ep.problem, time_limit)
            details[name] = {"cost": extraction.cost, "seconds": round(extraction.seconds, 3),
                             "status": extraction.status}
            g = graph_from_choice(eg, ep, extraction.choice, self.graph, self.encoding.inputs,
                                  self.encoding.outputs)
            if g.fingerprint() in seen:
                continue
            seen.add(g.fingerprint())
            cost = cost_model.graph_cost(g)
            used = sorted({eg.origin[ep.enodes[n]] for n in extraction.choice.values()} - {-1})
            # An extraction has no path through the input graph: its steps have no match.
            best.offer(g, cost, tuple(Step(runner.applied[i], cost) for i in used))
        result = self.run.result(initial_cost, StopReason.SATURATED)
        stats = result.stats
        stats.rejected = growth.rejected
        stats.matches = growth.matches
        stats.generated = growth.applications
        growth.stopped_by = stats.stopped_by
        stats.egraph = {"nodes": eg.num_nodes, "classes": eg.num_classes,
                        "blacklisted": len(eg.blacklist), **growth.as_dict(),
                        "extraction": details, "decisions": list(decisions)}
        return result


@dataclass(frozen=True, kw_only=True)
class ExtractionOptions:
    node_limit: int = option(20_000, "the e-graph's most e-nodes", least=1)
    extractors: tuple[str, ...] = option(tuple(EXTRACTORS), "the extractors whose graphs "
                                         f"compete: {', '.join(EXTRACTORS)}")
    extract_time: float | None = option(None, "seconds for the ILP extraction (none: what is "
                                        "left of the time limit)", least=0.0)

    def __post_init__(self) -> None:
        unknown = set(self.extractors) - set(EXTRACTORS)
        if unknown:
            raise GraphsubError(f"unknown extractor(s) {', '.join(sorted(unknown))}; use "
                                f"{', '.join(EXTRACTORS)}")
        if not self.extractors:
            raise GraphsubError(f"extractors must name at least one of {', '.join(EXTRACTORS)}")


#: The rule schedulers of equality saturation: egg's back-off (graphsub.egraph.schedule), or
#: every rule every iteration (Tensat's).
SCHEDULERS = ("backoff", "simple")


@dataclass(frozen=True, kw_only=True)
class EqsatOptions(ExtractionOptions):
    k_multi: int = option(1, "iterations that apply the multi-pattern rules (Tensat's "
                          "k_multi)", least=0)
    scheduler: str = option("backoff", "which rules each iteration runs: backoff (egg's) or "
                            "simple (every rule, Tensat's)")
    # egg's defaults
    match_limit: int = option(1000, "the back-off scheduler's matches per rule before a ban",
                              least=1)
    ban_length: int = option(5, "the back-off scheduler's first ban, in iterations", least=1)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.scheduler not in SCHEDULERS:
            raise GraphsubError(f"unknown e-graph scheduler {self.scheduler!r}; use one of "
                                f"{', '.join(SCHEDULERS)}")
        if self.match_limit < 1 or self.ban_length < 1:
            raise GraphsubError("the scheduler's match_limit and ban_length must be positive "
                                f"(got {self.match_limit} and {self.ban_length})")


def _scheduler(options: EqsatOptions, multi: frozenset[int]) -> BackoffScheduler | None:
    """The options' scheduler (None: every rule every iteration); the multi-pattern rules
    are never banned (they run in the first k_multi iterations only)."""
    if options.scheduler == "simple":
        return None
    return BackoffScheduler(options.match_limit, options.ban_length, multi)


@register("eqsat", EqsatOptions, "e-graph iterations", None, egraph=True)
def eqsat_search(graph: Graph, rules: Sequence[Rule], cost_model: CostModel,
                 limits: Limits = Limits(), options: EqsatOptions = EqsatOptions()
                 ) -> OptimizeResult:
    """Tensat: saturate (multi-pattern rules in the first k_multi iterations), then extract.
    The default node limit leaves room to saturate: at the MCTS paper's 2,000 the first
    iteration's multi-pattern rules fill NasRNN's e-graph before any single-pattern rule runs.
    The budget caps the iterations (none by default: saturation, the node limit or the time
    limit stops it)."""
    k_multi = options.k_multi
    search = EGraphSearch.begin(graph, rules, cost_model, options.node_limit, limits,
                                limits.budget, "iterations")
    runner, run = search.runner, search.run
    single = [i for i, r in enumerate(runner.rules) if len(r.sources) == 1]
    multi = [i for i, r in enumerate(runner.rules) if len(r.sources) > 1]
    growth = runner.stats
    scheduler = _scheduler(options, frozenset(multi))
    with run.stoppable():
        while not run.check_limits(budgeted=True):
            first_multi = growth.iterations < k_multi
            changed = runner.iterate((multi if first_multi else []) + single, run.deadline,
                                     scheduler)
            run.stats.explored = growth.iterations
            run.report(None)
            if runner.full:
                run.stop(StopReason.NODE_LIMIT)
                break
            if not changed and not (growth.iterations < k_multi) and (
                    scheduler is None or scheduler.can_stop(growth.iterations)):
                break
    return search.finish(runner, options.extractors,
                         search.extraction_time(options.extract_time), growth)
