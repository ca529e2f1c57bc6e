"""Growing an e-graph with rules: one rule at a time (MCTS's actions) or all rules at once
(an iteration of equality saturation), within a node limit, with cycle filtering.

Search and application are separate steps (egg): all matches of an iteration are found on the
same e-graph, then applied; a rebuild restores congruence; then the cycles the efficient
filter let through are broken (graphsub.egraph.cycles).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from graphsub.egraph.cycles import Descendants, break_cycles
from graphsub.egraph.egraph import EGraph
from graphsub.egraph.ematch import EMatch, SourceIndex, source_occurs, up_closure
from graphsub.egraph.rewrite import apply_ematch
from graphsub.egraph.schedule import BackoffScheduler, IterationRecord
from graphsub.rules.ast import Rule
from graphsub.search.result import StopReason


@dataclass
class GrowthStats:
    iterations: int = 0
    applications: int = 0      # matches applied that changed the e-graph
    matches: int = 0           # matches found
    cycles_broken: int = 0     # e-nodes blacklisted by the post-pass
    rejected: Counter[str] = field(default_factory=Counter)
    stopped_by: StopReason = StopReason.SATURATED
    #: Each iteration's record (Runner.iterate).
    log: list[IterationRecord] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"iterations": self.iterations, "applications": self.applications,
                "matches": self.matches, "cycles_broken": self.cycles_broken,
                "rejected": dict(self.rejected), "stopped_by": self.stopped_by,
                "log": [record.as_dict() for record in self.log]}


class Runner:
    """An e-graph with its rules and each rule's semi-naive search state."""

    def __init__(self, egraph: EGraph, rules: Sequence[Rule], node_limit: int = 2000) -> None:
        self.egraph = egraph
        self.rules = list(rules)
        self.node_limit = node_limit
        self.indexes = [SourceIndex(r) for r in self.rules]
        #: The positions in `indexes` this runner may change; the others it shares with
        #: clones (copy-on-write).
        self._owned = set(range(len(self.indexes)))
        #: The rule of each application, by the origin id its e-nodes carry.
        self.applied: list[str] = []
        self.stats = GrowthStats()

    def clone(self) -> Runner:
        """An independent copy: the e-graph's clone; the rules' search states are shared
        until either runner searches a rule again (MCTS clones a runner per tree node and
        rollout, and most rules are never searched on a clone: copying every state made
        objects a full garbage collection has to walk, hundreds per clone)."""
        r = Runner.__new__(Runner)
        r.egraph = self.egraph.clone()
        r.rules = self.rules
        r.node_limit = self.node_limit
        r.indexes = list(self.indexes)
        r._owned = set()
        self._owned = set()
        r.applied = list(self.applied)
        r.stats = GrowthStats(**{**vars(self.stats), "rejected": Counter(self.stats.rejected),
                                 "log": list(self.stats.log)})
        return r

    def _index(self, i: int) -> SourceIndex:
        """Rule i's search state, to be changed: copied first if it is shared."""
        if i not in self._owned:
            self.indexes[i] = self.indexes[i].copy()
            self._owned.add(i)
        return self.indexes[i]

    @property
    def full(self) -> bool:
        return self.egraph.num_nodes >= self.node_limit

    def _changed(self, versions: dict[int, set[int] | None], since: int) -> set[int] | None:
        if since < 0:
            return None
        if since not in versions:
            versions[since] = {c for c, rec in self.egraph.classes.items() if rec.stamp > since}
        return versions[since]

    def search(self, which: Sequence[int], deadline: float | None = None,
               admit: Callable[[int, int], bool] | None = None) -> list[EMatch]:
        """New matches of the rules at these indexes (semi-naive). `admit(rule, matches)`
        may refuse a rule's matches (a scheduler's ban): they are dropped and the rule's
        search starts over, so that they are found again once it runs. Raises
        DeadlineReached past the deadline, before anything is applied."""
        versions: dict[int, set[int] | None] = {}
        out: list[EMatch] = []
        for i in which:
            if self.indexes[i].version == self.egraph.version:
                continue  # nothing changed since this rule was last searched
            ix = self._index(i)
            found = ix.search(self.egraph, self._changed(versions, ix.version), deadline)
            self.stats.matches += len(found)
            if admit is not None and not admit(i, len(found)):
                self.indexes[i] = SourceIndex(self.rules[i])
                continue
            out += found
        return out

    def apply(self, matches: Sequence[EMatch], deadline: float | None = None) -> bool:
        """Apply matches (cycle-filtered), rebuild, break remaining cycles; whether the
        e-graph changed. Stops adding at the node limit or the deadline."""
        return self._apply_timed(matches, deadline)[0]

    def _apply_timed(self, matches: Sequence[EMatch], deadline: float | None
                     ) -> tuple[bool, float, float]:
        """apply, with the seconds of applying and of rebuilding (with the cycle pass)."""
        eg = self.egraph
        before = eg.version
        start = time.perf_counter()
        descendants = Descendants(eg) if matches else None
        for m in matches:
            if self.full or (deadline is not None and time.perf_counter() > deadline):
                break
            if apply_ematch(eg, m, len(self.applied), self.stats.rejected, descendants):
                self.applied.append(m.rule.name)
                self.stats.applications += 1
        applied = time.perf_counter()
        eg.rebuild()
        self.stats.cycles_broken += break_cycles(eg)
        return eg.version != before, applied - start, time.perf_counter() - applied

    def apply_rule(self, index: int, deadline: float | None = None) -> bool:
        """One action: every new match of one rule; whether the e-graph changed."""
        return self.apply(self.search([index], deadline), deadline)

    def iterate(self, which: Sequence[int], deadline: float | None = None,
                scheduler: BackoffScheduler | None = None) -> bool:
        """One iteration over several rules: search them all (those the scheduler lets
        run), then apply everything; recorded in stats.log. Whether the e-graph changed."""
        iteration = self.stats.iterations
        self.stats.iterations += 1
        start = time.perf_counter()
        if scheduler is not None:
            which = [i for i in which if scheduler.can_search(i, iteration)]
        matches = self.search(which, deadline, None if scheduler is None else
                              lambda rule, found: scheduler.admit(rule, iteration, found))
        searched = time.perf_counter()
        first = len(self.applied)
        changed, apply_s, rebuild_s = self._apply_timed(matches, deadline)
        banned = [] if scheduler is None else scheduler.banned(iteration)
        self.stats.log.append(IterationRecord(
            iteration, dict(Counter(self.applied[first:])), len(matches),
            [self.rules[i].name for i in banned], searched - start, apply_s, rebuild_s,
            self.egraph.num_nodes, self.egraph.num_classes))
        return changed

    def applicable(self, index: int, since: int | None = None,
                   near: dict[int, set[int]] | None = None,
                   deadline: float | None = None) -> bool:
        """Whether a rule's every source pattern occurs in the e-graph (MCTS's pruning: a
        rule with a source that does not occur cannot change the e-graph). With `since`, a
        version at which the rule was known not to occur: only roots near what changed since
        then can match now (`near` caches those regions by pattern depth across calls).
        Raises DeadlineReached past `deadline`."""
        ix = self.indexes[index]
        near = {} if near is None else near
        for seen, source, depth in zip(ix.seen, self.rules[index].sources, ix.depths):
            if seen:
                continue
            if since is not None and depth not in near:
                if -1 not in near:
                    near[-1] = self._changed({}, since) or set()
                near[depth] = up_closure(self.egraph, near[-1], depth)
            if not source_occurs(self.egraph, source, near.get(depth) if since is not None
                                 else None, deadline):
                return False
        return True
