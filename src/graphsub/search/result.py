"""What every search algorithm returns: the best graph, how it got there, and statistics."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from graphsub.ir.graph import Graph


class StopReason(StrEnum):
    """Why a search stopped. A str, so reports and JSON carry the word."""

    EXHAUSTED = "exhausted"    # nothing left to explore
    SATURATED = "saturated"    # the e-graph stopped growing
    BUDGET = "budget"          # the expansion budget was spent
    NODE_LIMIT = "node limit"  # the e-graph reached its node limit
    ITERATIONS = "iterations"  # the e-graph search ran its iterations
    TIME = "time"              # the time limit
    INTERRUPT = "interrupt"    # Ctrl-C


@dataclass(frozen=True)
class Step:
    """One substitution on the way to a graph: the rule and the predicted cost after it."""

    rule: str
    cost: float


@dataclass(frozen=True)
class Candidate:
    graph: Graph
    cost: float
    trace: tuple[Step, ...]


@dataclass
class SearchStats:
    explored: int = 0          # graphs dequeued and expanded
    generated: int = 0         # new graphs produced by applying a rule
    duplicates: int = 0        # produced graphs already seen (same structural hash)
    pruned: int = 0            # produced graphs worse than alpha x best, or over the node cap
    matches: int = 0           # matches tried (rewrites attempted)
    matches_computed: int = 0  # matches found by a matching run
    matches_reused: int = 0    # matches carried over from the parent graph (incremental)
    rejected: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0
    stopped_by: StopReason = StopReason.EXHAUSTED
    #: E-graph searches (eqsat, mcts): the e-graph's size, growth and extraction details.
    egraph: dict[str, Any] = field(default_factory=dict)
    #: MetaFlow's split (--split): parts, their sizes, matches the cuts disabled, regions
    #: searched around the cuts.
    split: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"explored": self.explored, "generated": self.generated,
                "duplicates": self.duplicates, "pruned": self.pruned, "matches": self.matches,
                "matches_computed": self.matches_computed,
                "matches_reused": self.matches_reused,
                "rejected": dict(self.rejected), "seconds": round(self.seconds, 3),
                "stopped_by": self.stopped_by, **({"egraph": self.egraph} if self.egraph else {}),
                **({"split": self.split} if self.split else {})}


@dataclass(frozen=True)
class SearchProgress:
    """How far a search has got, for progress displays."""

    seconds: float
    steps: int                # what the search counts, in `unit`
    unit: str                 # "expanded" (graphs), "iterations" (eqsat), "decisions" (MCTS)
    generated: int            # graphs produced so far
    best_cost: float | None   # None until the search has a graph (eqsat extracts at the end)

    @classmethod
    def of(cls, stats: SearchStats, best_cost: float | None,
           unit: str = "expanded") -> SearchProgress:
        return cls(stats.seconds, stats.explored, unit, stats.generated, best_cost)


#: Called as a search goes.
ProgressFn = Callable[[SearchProgress], None]


@dataclass
class OptimizeResult:
    graph: Graph
    trace: tuple[Step, ...]
    stats: SearchStats
    initial_cost: float
    final_cost: float
    candidates: list[Candidate] = field(default_factory=list)  # the best few, best first

    def rules_used(self) -> Counter[str]:
        return Counter(s.rule for s in self.trace)
