"""The search algorithms side by side on one model under one cost model (OCGGS section 6's
tables: final cost, search time, graphs expanded), for `graphsub compare` and bench/."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from graphsub.targets import Target, get_target
from graphsub.cost import make_cost_model
from graphsub.errors import GraphsubError
from graphsub.ir.graph import Graph
from graphsub.optimizer import optimize
from graphsub.pipeline import ProgressRecorder, RuleSet, Settings, rule_set
from graphsub.rules import Rule
from graphsub.search import ALGORITHMS
from graphsub.search.result import StopReason

#: What `graphsub compare` runs unless told otherwise (enumeration is exponential in K).
DEFAULT_ALGORITHMS = ("backtracking", "greedy", "pruning", "dpp", "sampling")


@dataclass
class AlgorithmRun:
    algorithm: str
    split: int | None
    initial_cost: float
    final_cost: float
    seconds: float
    explored: int
    generated: int
    matches_computed: int
    matches_reused: int
    stopped_by: StopReason
    rules_used: dict[str, int]
    #: (seconds, best predicted cost) each time the best cost fell: OCGGS's cost-time curve.
    progress: list[tuple[float, float | None]] = field(default_factory=list)

    @property
    def improvement(self) -> float:
        """initial / final cost: how many times cheaper the result is predicted to be."""
        return self.initial_cost / self.final_cost if self.final_cost else float("inf")

    def as_dict(self) -> dict[str, Any]:
        """As a report holds it: costs in ms."""
        data = asdict(self)
        data["initial_ms"], data["final_ms"] = data.pop("initial_cost") * 1e3, \
            data.pop("final_cost") * 1e3
        data["progress"] = [(s, None if c is None else c * 1e3) for s, c in self.progress]
        return {**data, "improvement": self.improvement}


def check_algorithms(algorithms: Sequence[str]) -> None:
    """Raise a GraphsubError naming every unknown algorithm (or an empty list)."""
    unknown = [a for a in algorithms if a not in ALGORITHMS]
    if unknown or not algorithms:
        raise GraphsubError(f"unknown algorithm(s) {', '.join(unknown) or '(none given)'}; "
                            f"use {', '.join(ALGORITHMS)}")


def compare_algorithms(graph: Graph, algorithms: Sequence[str] = DEFAULT_ALGORITHMS,
                       rules: Sequence[Rule] | RuleSet | None = None,
                       settings: Settings | None = None, k: int = 10,
                       started: Callable[[str], None] | None = None, *,
                       rules_only: bool = False) -> list[AlgorithmRun]:
    """Run each algorithm on `graph` with the same rules, cost model and time limit (from
    `settings`; default: the analytic cost, 10 s). One cost model prices every run: under a
    measured model, an operator timed for an earlier algorithm is not timed again, so order
    the runs or use the analytic model to compare search times fairly. `rules` are added to
    the built-in library, or used alone with `rules_only` (graphsub.optimize's)."""
    check_algorithms(algorithms)
    settings = settings or Settings.make(cost="analytic", time_limit=10.0)
    if isinstance(settings.cost, str):  # one model for every run
        target = settings.target if isinstance(settings.target, Target) else \
            get_target(settings.target_name, threads=settings.threads,
                       **settings.target_options)
        settings = settings.replace(cost=make_cost_model(settings.cost, target=target),
                                    target=target)
    chosen = rules if isinstance(rules, RuleSet) else rule_set(rules, rules_only)
    runs = []
    for algorithm in algorithms:
        if started is not None:
            started(algorithm)
        # Time bounds every algorithm alike; e-graph searches keep their own budgets (MCTS's
        # is per decision).
        search = ALGORITHMS[algorithm]
        options = {"k": k} if "k" in search.option_names() else {}
        recorder = ProgressRecorder()
        result = optimize(graph, chosen, algorithm, progress=recorder, settings=settings,
                          budget=None if search.egraph else 10**9, options=options)
        s = result.stats
        runs.append(AlgorithmRun(algorithm, settings.split, result.initial_cost,
                                 result.final_cost, s.seconds, s.explored, s.generated,
                                 s.matches_computed, s.matches_reused, s.stopped_by,
                                 dict(result.rules_used()), recorder.points(result)))
    return runs
