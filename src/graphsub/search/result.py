"""What every search algorithm returns: the best graph, how it got there, and statistics."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np

from graphsub.ir.graph import Graph, Value
from graphsub.rules.chains import Reciprocal
from graphsub.rules.matcher import Match


class StopReason(StrEnum):
    """Why a search stopped. A str, so reports and JSON carry the word."""

    EXHAUSTED = "exhausted"    # nothing left to explore
    SATURATED = "saturated"    # the e-graph stopped growing
    BUDGET = "budget"          # the expansion budget was spent
    NODE_LIMIT = "node limit"  # the e-graph reached its node limit
    ITERATIONS = "iterations"  # the e-graph search ran its iterations
    TIME = "time"              # the time limit
    INTERRUPT = "interrupt"    # Ctrl-C


class StepKind(StrEnum):
    """What made a step of a trace. A str, so reports and JSON carry the word."""

    RULE = "rule"                # a rewrite rule applied by a search
    FISSION = "fission"          # fission and kernel orchestration (graphsub.fission)
    ORT_FUSIONS = "ort-fusions"  # onnxruntime's fused operators (graphsub.targets.ort_fusions)
    PEER = "peer"                # another tool's optimizer (graphsub.targets.peers), by name

    @property
    def label(self) -> str:
        """How a report names a step of this kind that applies no rule."""
        return _LABELS[self]


_LABELS = {StepKind.RULE: "rule", StepKind.FISSION: "fission and kernel orchestration",
           StepKind.ORT_FUSIONS: "onnxruntime fusions (onnxscript)",
           StepKind.PEER: "another tool's optimizer"}


@dataclass(frozen=True)
class StepMatch:
    """Where a rule step applied its rule, as plain data (JSON once `asdict`-ed): the ids of
    the matched nodes in the graph the rule was applied to, its source roots and the pattern
    variables' bindings, tensors as (node id, output index). Node ids mean the same on a
    replay from the search's input graph: the applier numbers the nodes it adds from the
    rewritten graph's next free id, in a fixed order."""

    nodes: tuple[int, ...]
    roots: tuple[tuple[int, int], ...]
    tensors: dict[str, tuple[int, int]] = field(hash=False)
    attrs: dict[str, Any] = field(hash=False)

    @classmethod
    def of(cls, match: Match[Value]) -> StepMatch:
        return cls(tuple(sorted(match.nodes)), tuple((v.node, v.index) for v in match.roots),
                   {name: _position(v) for name, v in sorted(match.tensors.items())},
                   {name: _plain(value) for name, value in sorted(match.attrs.items())})


def _position(handle: Value | Reciprocal) -> tuple[int, int]:
    """Where a bound tensor is: a reciprocal read in a product's chain, at its divisor."""
    value = handle.divisor if isinstance(handle, Reciprocal) else handle
    return value.node, value.index


def _plain(value: Any) -> Any:
    """An attribute value as JSON has it: numbers, strings, lists; anything else by repr."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return repr(value)


@dataclass(frozen=True)
class Step:
    """One step on the way to a graph and the predicted cost after it. A rule step names
    its rule and, when it can be replayed, where it applied it (`match`: None for the
    e-graph searches' extractions and a split search's parts, which have no path through
    the input graph's node ids); a step of another kind is named by the kind's label."""

    rule: str
    cost: float
    kind: StepKind = StepKind.RULE
    match: StepMatch | None = None

    @classmethod
    def applying(cls, match: Match[Value], cost: float) -> Step:
        """The step that applies `match` (in the graph it was found in)."""
        return cls(match.rule.name, cost, StepKind.RULE, StepMatch.of(match))

    @classmethod
    def of_kind(cls, kind: StepKind, cost: float) -> Step:
        """A step that applies no rule (fission, onnxruntime's fusions)."""
        return cls(kind.label, cost, kind)


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
    #: shape conditions that held for some values of the size symbols and not for others
    #: (the rule did not apply there)
    undecided: int = 0
    seconds: float = 0.0
    stopped_by: StopReason = StopReason.EXHAUSTED
    #: E-graph searches (eqsat, mcts): the e-graph's size, growth and extraction details.
    egraph: dict[str, Any] = field(default_factory=dict)
    #: MetaFlow's split (--split): parts, their sizes, matches the cuts disabled, regions
    #: searched around the cuts.
    split: dict[str, Any] = field(default_factory=dict)
    #: Rewrites applied after the search where the rules it used paid again
    #: (graphsub.search.propagate: one layer's rewrites in every layer).
    propagated: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"explored": self.explored, "generated": self.generated,
                "duplicates": self.duplicates, "pruned": self.pruned, "matches": self.matches,
                "matches_computed": self.matches_computed,
                "matches_reused": self.matches_reused,
                "rejected": dict(self.rejected), "seconds": round(self.seconds, 3),
                **({"undecided": self.undecided} if self.undecided else {}),
                "stopped_by": self.stopped_by, **({"egraph": self.egraph} if self.egraph else {}),
                **({"split": self.split} if self.split else {}),
                **({"propagated": self.propagated} if self.propagated else {})}


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


@dataclass(frozen=True)
class OptimizeResult:
    """What a search returns: frozen, so that a stage that learns more of it (an interrupt
    after the search, a peer's start) makes a new one (`dataclasses.replace`) rather than
    change the one others hold."""

    graph: Graph
    trace: tuple[Step, ...]
    stats: SearchStats
    initial_cost: float
    final_cost: float
    candidates: tuple[Candidate, ...] = ()  # the best few, best first

    def rules_used(self) -> Counter[str]:
        return Counter(s.rule for s in self.trace)
