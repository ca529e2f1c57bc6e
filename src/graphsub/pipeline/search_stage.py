"""The stages that find candidates: the search, and fission with kernel orchestration."""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Sequence
from dataclasses import replace

from graphsub.budget import MIN_SEARCH_SECONDS, StageClock
from graphsub.cost import CostModel
from graphsub.ir.graph import Graph
from graphsub.pipeline.bodies import BodyOutcome, body_node_count, optimize_bodies
from graphsub.pipeline.peer_start import PeerStart, peer_start
from graphsub.pipeline.run import RunContext, Stage
from graphsub.pipeline.values import Exported, Found
from graphsub.search import ALGORITHMS, Candidate, OptimizeResult, SearchStats
from graphsub.search.registry import Limits
from graphsub.search.result import ProgressFn, SearchProgress, StopReason
from graphsub.search.normal_form import normal_form, with_start
from graphsub.search.propagate import propagate
from graphsub.search.split import splitting


class ProgressRecorder:
    """A progress callback that also keeps (seconds, best cost) each time the best cost
    changes, for the report's figure of the search, and passes every call on."""

    def __init__(self, forward: ProgressFn | None = None) -> None:
        self.forward = forward
        self._points: list[tuple[float, float | None]] = []

    def __call__(self, progress: SearchProgress) -> None:
        if progress.best_cost is not None and (
                not self._points or progress.best_cost != self._points[-1][1]):
            self._points.append((round(progress.seconds, 4), progress.best_cost))
        if self.forward is not None:
            self.forward(progress)

    def points(self, result: OptimizeResult) -> list[tuple[float, float | None]]:
        """The points, from the input graph's cost to the search's final cost when it ended."""
        start = [(0.0, result.initial_cost)] if math.isfinite(result.initial_cost) else []
        end = ([(round(result.stats.seconds, 4), result.final_cost)]
               if math.isfinite(result.final_cost) else [])
        return start + self._points + end


#: The share of the search's time kept for applying what it found wherever else it pays
#: (graphsub.search.propagate); whatever the search leaves unused goes there too.
PROPAGATION_SHARE = 0.15
#: The share of the search's time given to continuing from the best peer's output, where
#: a peer's output is priced below the input graph (graphsub.pipeline.peer_start).
PEER_SEARCH_SHARE = 0.3


def search(context: RunContext, clock: StageClock, peers: Sequence[Exported] = ()) -> Found:
    """The search the settings name, in the time its clock gives, optionally within
    MetaFlow's graph split, continued from the best of the `peers`' outputs where one is
    priced below the input. Ctrl-C before the search loop took over (while pricing the input
    graph, or between a split search's parts) finds nothing: in a run that measures and
    verifies what was found, the original then stays; in a run of the search alone, the
    interrupt is the caller's."""
    settings = context.settings
    seconds = clock.remaining()
    context.say(f"searching with {settings.algorithm} for up to {seconds:.1f} s")
    recorder = ProgressRecorder(context.progress)
    start = time.perf_counter()
    from_peer, peer_seconds = None, 0.0
    cost_model = context.time_model
    bodies: Sequence[BodyOutcome] = ()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # untimed operators: in the notes
            cost_model = settings.objective.cost_model(context.time_model, context.graph)
            limits = Limits(time=max(clock.remaining(), 0.0), budget=settings.budget,
                            keep=settings.keep, progress=recorder)
            algorithm = ALGORITHMS[settings.algorithm]
            start_graph, bodies = search_bodies(context, clock, cost_model)
            # The normal form is not cut by the search's deadline: its steps take no search
            # (their matching is cheap, and past the deadline operators are priced
            # analytically), and a chain cut halfway pays nothing.
            initial_cost = cost_model.graph_cost(start_graph)
            start_graph, normal_steps = normal_form(
                start_graph, context.normal_form_rules, cost_model)
            if normal_steps:
                context.say(f"normal form: {len(normal_steps)} rewrites "
                            f"({', '.join(sorted({s.rule for s in normal_steps}))})")
            start_graph, merge_steps = normal_form(start_graph, context.merge_rules,
                                                   cost_model)
            if merge_steps:
                context.say(f"merge form: {len(merge_steps)} rewrites "
                            f"({', '.join(sorted({s.rule for s in merge_steps}))})")
                normal_steps += merge_steps
            from_peer = peer_start(context, peers, cost_model,
                                   below=cost_model.graph_cost(start_graph))
            if from_peer is not None:
                peer_seconds = PEER_SEARCH_SHARE * clock.remaining()
            limits = replace(limits, time=max((clock.remaining() - peer_seconds)
                                              * (1 - PROPAGATION_SHARE), 0.0))
            function = algorithm.function if settings.split is None else \
                splitting(algorithm, settings.split, settings.executor)
            result = function(start_graph, context.search_rules, cost_model, limits,
                              settings.search_options)
            result = with_start(result, normal_steps, initial_cost)
    except KeyboardInterrupt:
        if not context.budget.measuring:  # nothing comes after the search: the caller's Ctrl-C
            raise
        stats = SearchStats(stopped_by=StopReason.INTERRUPT, seconds=time.perf_counter() - start)
        result = OptimizeResult(context.graph, (), stats, math.nan, math.nan)
    if result.stats.stopped_by != StopReason.INTERRUPT:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                result = propagate(result, context.search_rules, cost_model,
                                   None if clock.deadline is None
                                   else clock.deadline - peer_seconds)
                if from_peer is not None:
                    result = search_from_peer(context, clock, cost_model, from_peer, result)
        except KeyboardInterrupt:  # what the search found stands
            result = replace(result, stats=replace(result.stats,
                                                   stopped_by=StopReason.INTERRUPT))
    found = Found(result, cost_model, tuple(recorder.points(result)), tuple(bodies))
    if found.interrupted:
        context.budget.interrupted()
        context.say("interrupted: the search stopped; measuring and verifying what it found "
                    "(Ctrl-C again to stop at once, writing nothing)")
    return found


def search_from_peer(context: RunContext, clock: StageClock, cost_model: CostModel,
                     start: PeerStart, result: OptimizeResult) -> OptimizeResult:
    """The search continued from a peer's output (graphsub.pipeline.peer_start) in the rest
    of the stage's time. Where it improved on the peer's graph, its best (a trace that
    starts with the peer's step) joins the search's candidates among the first
    `settings.candidates`, as fission's does: where the cost model and the measurement
    disagree, it is still timed. The peer's output itself is a candidate as it came."""
    settings = context.settings
    context.say(f"searching on from {start.step.rule}'s output for up to "
                f"{clock.remaining():.1f} s")
    limits = Limits(time=max(clock.remaining(), MIN_SEARCH_SECONDS), budget=settings.budget,
                    keep=1)
    found = ALGORITHMS[settings.algorithm].function(start.graph, context.search_rules,
                                                    cost_model, limits, settings.search_options)
    improved = math.isfinite(found.final_cost) and found.final_cost < start.cost
    context.log.note(f"the search went on from {start.step.rule}'s output (predicted "
                     f"{start.cost * 1e3:.3g} ms) for {found.stats.seconds:.1f} s: " + (
                         f"{len(found.trace)} rewrite(s), predicted "
                         f"{found.final_cost * 1e3:.3g} ms" if improved else
                         "nothing cheaper (the peer's output is a candidate as it came)"))
    best = Candidate(found.graph, found.final_cost, (start.step, *found.trace))
    candidates = list(result.candidates)
    if not improved or best.graph.structural_hash() in {
            c.graph.structural_hash() for c in candidates}:
        return result
    at = 0 if not candidates or best.cost < candidates[0].cost else 1
    candidates.insert(min(at, max(settings.candidates - 1, 0)), best)
    return replace(result, candidates=tuple(candidates))


def search_bodies(context: RunContext, clock: StageClock, cost_model: CostModel
                  ) -> tuple[Graph, list[BodyOutcome]]:
    """The graph to search: the input graph with its control-flow bodies searched first
    (graphsub.pipeline.bodies), in their share of the search's time by operator count; and
    what the search did in each body."""
    inner = body_node_count(context.graph)
    if not inner:
        return context.graph, []
    settings = context.settings
    algorithm = ALGORITHMS[settings.algorithm]

    def search_one(graph: Graph, seconds: float) -> tuple[Graph, float, float]:
        limits = Limits(time=max(min(seconds, clock.remaining()), 0.0), budget=settings.budget,
                        keep=1)
        result = algorithm.function(graph, context.search_rules, cost_model, limits,
                                    settings.search_options)
        return result.graph, result.initial_cost, result.final_cost

    seconds = clock.remaining() * inner / (inner + len(context.graph))
    context.say(f"searching inside {inner} operators of control-flow bodies for up to "
                f"{seconds:.1f} s")
    graph, outcomes = optimize_bodies(context.graph, search_one, seconds, context.threads)
    for outcome in outcomes:
        if outcome.kept or outcome.note.startswith("not kept"):
            context.log.note(outcome.text())
    return graph, outcomes


#: With the time limit spent (loading took it), the input graph is the only candidate.
SEARCH = Stage("search", search, prices=True,
               out_of_time=lambda context, peers=(): Found.unsearched(context))

__all__ = ["ProgressRecorder", "SEARCH"]
