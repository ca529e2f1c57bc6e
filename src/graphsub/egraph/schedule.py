"""Which rules an iteration of equality saturation runs: egg's back-off scheduler, and the
record of each iteration.

Applying every rule every iteration lets a few prolific rules (associativity, commutativity,
the distributive laws) fill the e-graph's node limit with their own consequences before the
rules that pay have matched. egg's BackoffScheduler bans such a rule for a while instead: a
rule whose search finds more than its match limit has those matches dropped and is banned for
`ban_length` iterations; each ban doubles both its limit and its next ban's length, so a rule
that keeps exploding runs rarely, but is never shut out for good. When an iteration changes nothing while some
rule is banned, the e-graph is not saturated: the bans are lifted and the search goes on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class BackoffScheduler:
    """egg's back-off scheduler over rules by index (egg's defaults: 1,000 matches, 5
    iterations)."""

    match_limit: int = 1000
    ban_length: int = 5
    #: Rules never banned (Tensat's multi-pattern rules, which run in the first iterations
    #: only: a ban there would be for good).
    exempt: frozenset[int] = frozenset()
    _banned_until: dict[int, int] = field(default_factory=dict)
    _times_banned: dict[int, int] = field(default_factory=dict)

    def can_search(self, rule: int, iteration: int) -> bool:
        """Whether a rule is searched in this iteration (not banned)."""
        return self._banned_until.get(rule, 0) <= iteration

    def admit(self, rule: int, iteration: int, matches: int) -> bool:
        """Whether a rule's `matches` may be applied; if not, the rule is banned from now
        (its limit and ban doubled for next time)."""
        times = self._times_banned.get(rule, 0)
        if rule in self.exempt or matches <= self.match_limit << times:
            return True
        self._times_banned[rule] = times + 1
        self._banned_until[rule] = iteration + (self.ban_length << times)
        return False

    def banned(self, iteration: int) -> list[int]:
        """The rules banned at this iteration."""
        return sorted(r for r, until in self._banned_until.items() if until > iteration)

    def can_stop(self, iteration: int) -> bool:
        """Whether an iteration that changed nothing means saturation: only when no rule is
        banned; otherwise the bans are lifted (egg's fast-forward) and the search goes on."""
        banned = self.banned(iteration)
        for rule in banned:
            self._banned_until[rule] = iteration
        return not banned


@dataclass
class IterationRecord:
    """One iteration of the e-graph runner, as egg records it: matches applied per rule, the
    rules banned, the seconds of search, apply and rebuild, and the e-graph's size after."""

    iteration: int
    applied: dict[str, int]
    matches: int
    banned: list[str]
    search_s: float
    apply_s: float
    rebuild_s: float
    nodes: int
    classes: int

    def as_dict(self) -> dict[str, Any]:
        return {"iteration": self.iteration, "applied": self.applied, "matches": self.matches,
                "banned": self.banned, "search_s": round(self.search_s, 4),
                "apply_s": round(self.apply_s, 4), "rebuild_s": round(self.rebuild_s, 4),
                "nodes": self.nodes, "classes": self.classes}


__all__ = ["BackoffScheduler", "IterationRecord"]
