"""OCGGS (ocggs-pvldb20.txt): the best substitution sequence of length at most K.

Three algorithms over the same notions:

- node labels (Definition 6): a node of the initial graph is labelled (N, its id); a node a
  substitution creates is labelled (that substitution, the index of the target node that made
  it). graphsub's applier creates target nodes in a fixed order with consecutive fresh ids, so
  that index is `id - parent.next_id`;
- dependence (Definition 7): a substitution depends on the substitutions that created the
  nodes it replaces (its match's nodes);
- the order (Definition 8): compare the latest substitutions two substitutions depend on,
  and when those are the same, the largest label index among the nodes replaced that the
  latest one created.

**Pruning** (Algorithm 1) is a depth-first search over sequences that only extends an ordered
sequence with a substitution that keeps it ordered (Corollary 1: every other sequence has an
ordered one with the same result, Theorem 4). **DPP** (Algorithm 2) is the same search with
a sequence's child substitutions taken from its father's (Theorem 6): those that did not touch
what the last substitution changed are reused, only the neighbourhood of the change is matched
again. **Sampling** (Algorithm 3) grows sequences one substitution a round, keeping Q/2 of the
cheapest and Q/2 of those reached through cost-increasing "further exploration" steps, chosen
by their potential (Definition 12), with at most eta such steps in a row.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from graphsub.cost.base import CostModel
from graphsub.ir.graph import Graph, Value
from graphsub.rules.applier import Rejection, apply_match
from graphsub.rules.ast import Rule
from graphsub.rules.rematching import IncrementalMatcher
from graphsub.rules.matcher import Match, find_matches
from graphsub.search.registry import Limits, option, register
from graphsub.search.result import OptimizeResult, Step
from graphsub.search.run import SearchRun


#: The dummy substitution N of the paper: every initial node is "generated" by it.
N = 0


@dataclass(frozen=True)
class Substitution:
    """One substitution of a sequence: its match, where it sits (1-based) in the sequence, and
    what the order needs: the latest substitution it depends on and the alpha of Def. 8."""

    match: Match[Value]
    position: int
    depends_on: frozenset[int]  # positions of the substitutions it depends on (N = 0)
    latest: int
    alpha: int


@dataclass
class SubstitutionSequence:
    """A substitution sequence and the graph it produces, with the labels of that graph's
    nodes: node id -> (position of the generating substitution, label index)."""

    graph: Graph
    cost: float
    subs: tuple[Substitution, ...] = ()
    labels: dict[int, tuple[int, int]] = field(default_factory=dict)
    costs: tuple[float, ...] = ()  # the cost after each substitution
    #: Every child sequence, once Sampling has made them (its potential and its growth step
    #: both need them).
    children: list[SubstitutionSequence] | None = field(default=None, repr=False)

    def steps(self) -> tuple[Step, ...]:
        return tuple(Step.applying(s.match, c) for s, c in zip(self.subs, self.costs))


def initial_sequence(graph: Graph, cost: float) -> SubstitutionSequence:
    return SubstitutionSequence(graph, cost, (), {nid: (N, nid) for nid in graph.nodes}, ())


def substitution(seq: SubstitutionSequence, match: Match[Value]) -> Substitution:
    """The substitution `match` would be as the next element of `seq`."""
    labels = [seq.labels[n] for n in match.nodes]
    depends = frozenset(p for p, _ in labels)
    latest = max(depends) if depends else N
    alpha = max((j for p, j in labels if p == latest), default=-1)
    return Substitution(match, len(seq.subs) + 1, depends, latest, alpha)


def in_order(first: Substitution, second: Substitution) -> bool:
    """first <= second (Definition 8) for two substitutions of one ordered sequence, where
    the earlier of any two is the smaller, so the latest dependencies compare by position."""
    return first.latest < second.latest or (
        first.latest == second.latest and first.alpha <= second.alpha)


def extend(seq: SubstitutionSequence, sub: Substitution, cost_model: CostModel
           ) -> SubstitutionSequence | Rejection:
    """`seq` followed by `sub`, or why the rewrite is not allowed."""
    parent = seq.graph
    child = apply_match(parent, sub.match)
    if isinstance(child, Rejection):
        return child
    labels = {nid: lab for nid, lab in seq.labels.items() if nid in child.nodes}
    for nid in child.nodes:
        if nid >= parent.next_id:
            labels[nid] = (sub.position, nid - parent.next_id)
    cost = cost_model.graph_cost(child)
    return SubstitutionSequence(child, cost, seq.subs + (sub,), labels, seq.costs + (cost,))


class _Search:
    """What the three algorithms share: the run (limits, statistics, the best few results),
    the rules and the matcher."""

    def __init__(self, graph: Graph, rules: Sequence[Rule], cost_model: CostModel,
                 limits: Limits, reuse: bool) -> None:
        self.rules, self.cost_model = list(rules), cost_model
        self.run = SearchRun(limits, limits.budget)
        self.stats = self.run.stats
        self.root = initial_sequence(graph, cost_model.graph_cost(graph))
        self.run.best.offer(graph, self.root.cost, ())
        self.matcher = IncrementalMatcher(self.rules) if reuse else None

    def out_of_time(self) -> bool:
        """Whether a limit stops the search (between expansions: the budget counts)."""
        return self.run.check_limits(budgeted=True) is not None

    def matches(self, graph: Graph) -> Iterator[Match[Value]]:
        if self.matcher is not None:
            for ms in self.matcher.matches(graph):
                yield from ms
        else:
            for rule in self.rules:
                found = find_matches(graph, rule)
                self.stats.matches_computed += len(found)
                yield from found

    def children(self, seq: SubstitutionSequence, ordered: bool) -> Iterator[SubstitutionSequence]:
        """Every child sequence of `seq` (only those that stay ordered, if `ordered`); fewer
        when the time limit strikes on the way (each child is a rewritten graph, built and
        priced: a large graph's children take a while)."""
        self.stats.explored += 1
        last = seq.subs[-1] if seq.subs else None
        for match in self.matches(seq.graph):
            if self.run.check_limits():
                return
            self.stats.matches += 1
            sub = substitution(seq, match)
            if ordered and last is not None and not in_order(last, sub):
                self.stats.pruned += 1
                continue
            child = extend(seq, sub, self.cost_model)
            if isinstance(child, Rejection):
                self.stats.rejected[child.reason] += 1
                continue
            self.stats.generated += 1
            self.consider(child)
            yield child

    def consider(self, seq: SubstitutionSequence) -> None:
        if self.run.best.admits(seq.cost):
            self.run.best.offer(seq.graph, seq.cost, seq.steps())

    def report(self) -> None:
        self.run.report(self.run.best.top.cost)

    def result(self) -> OptimizeResult:
        if self.matcher is not None:
            self.stats.matches_computed = self.matcher.counts.computed
            self.stats.matches_reused = self.matcher.counts.reused
        return self.run.result(self.root.cost)


@dataclass(frozen=True, kw_only=True)
class SequenceOptions:
    k: int = option(10, "the longest substitution sequence (OCGGS's K)", least=1)


@dataclass(frozen=True, kw_only=True)
class EnumerationOptions(SequenceOptions):
    # the brute force grows as (matches)^k
    k: int = option(3, "the longest substitution sequence (OCGGS's K)", least=1)


@dataclass(frozen=True, kw_only=True)
class SamplingOptions(SequenceOptions):
    # the paper's settings: q = 20, eta = 1, k = 10
    q: int = option(20, "sequences sampled at each step", least=1)
    eta: int = option(1, "the most cost-increasing substitutions in a row", least=0)


#: What the OCGGS searches' budget counts; they have none by default (k bounds them).
UNIT = "graphs expanded"


def _exact_search(graph: Graph, rules: Sequence[Rule], cost_model: CostModel, k: int,
                  reuse: bool, ordered: bool, limits: Limits) -> OptimizeResult:
    search = _Search(graph, rules, cost_model, limits, reuse)

    def descend(seq: SubstitutionSequence) -> None:
        if len(seq.subs) == k or search.out_of_time():
            return
        for child in list(search.children(seq, ordered)):
            descend(child)
            if search.run.stopped:
                return
        search.report()

    with search.run.stoppable():
        descend(search.root)
    return search.result()


@register("pruning", SequenceOptions, UNIT, None)
def pruning_search(graph: Graph, rules: Sequence[Rule], cost_model: CostModel,
                   limits: Limits = Limits(), options: SequenceOptions = SequenceOptions()
                   ) -> OptimizeResult:
    """OCGGS Algorithm 1: every ordered sequence of length <= k, each graph matched anew.
    Exact for k when it finishes (stats.stopped_by == StopReason.EXHAUSTED)."""
    return _exact_search(graph, rules, cost_model, options.k, False, True, limits)


@register("dpp", SequenceOptions, UNIT, None)
def dpp_search(graph: Graph, rules: Sequence[Rule], cost_model: CostModel,
               limits: Limits = Limits(), options: SequenceOptions = SequenceOptions()
               ) -> OptimizeResult:
    """OCGGS Algorithm 2: Pruning with each sequence's child substitutions reused from its
    father's (Theorem 6); the statistics count matches reused and computed."""
    return _exact_search(graph, rules, cost_model, options.k, True, True, limits)


@register("enumeration", EnumerationOptions, UNIT, None)
def enumeration_search(graph: Graph, rules: Sequence[Rule], cost_model: CostModel,
                       limits: Limits = Limits(),
                       options: EnumerationOptions = EnumerationOptions()) -> OptimizeResult:
    """The brute force the paper compares against (ENU): every sequence of length <= k."""
    return _exact_search(graph, rules, cost_model, options.k, True, False, limits)


@register("sampling", SamplingOptions, UNIT, None)
def sampling_search(graph: Graph, rules: Sequence[Rule], cost_model: CostModel,
                    limits: Limits = Limits(), options: SamplingOptions = SamplingOptions()
                    ) -> OptimizeResult:
    """OCGGS Algorithm 3 with sample size `q` and at most `eta` cost-increasing substitutions
    in a row."""
    k, q, eta = options.k, options.q, options.eta
    search = _Search(graph, rules, cost_model, limits, reuse=True)
    root_cost = search.root.cost
    half = max(1, q // 2)

    def trailing_increases(seq: SubstitutionSequence) -> int:
        costs = (root_cost, *seq.costs)
        count = 0
        for before, after in zip(reversed(costs[:-1]), reversed(costs[1:])):
            if after <= before:
                break
            count += 1
        return count

    def further(seq: SubstitutionSequence) -> bool:
        """A further exploration sequence: it ends with a cost increase, and has at most eta
        of them in a row."""
        n = trailing_increases(seq)
        return 0 < n <= eta

    def potential(seq: SubstitutionSequence) -> float:
        """Definition 12: the lowest cost reachable by descendants that each depend on the
        substitution before them, through further exploration sequences, ending with a
        decrease (infinite when there is none within the length bound)."""
        best = float("inf")
        if len(seq.subs) >= k or search.out_of_time():
            return best
        last = len(seq.subs)
        for child in all_children(seq):
            if last not in child.subs[-1].depends_on:
                continue
            if child.cost < seq.cost:
                best = min(best, child.cost)
            elif further(child):
                best = min(best, potential(child))
        return best

    def distinct(seqs: list[SubstitutionSequence]) -> list[SubstitutionSequence]:
        """One sequence per resulting graph: sequences that reach the same graph have the
        same descendants, so sampling more than one of them wastes the sample."""
        out, seen = [], set()
        for s in seqs:
            fp = s.graph.fingerprint()
            if fp not in seen:
                seen.add(fp)
                out.append(s)
        return out

    def all_children(seq: SubstitutionSequence) -> list[SubstitutionSequence]:
        if seq.children is None:
            seq.children = list(search.children(seq, ordered=False))
        return seq.children

    def grow(seqs: list[SubstitutionSequence]) -> list[SubstitutionSequence]:
        out: list[SubstitutionSequence] = []
        for s in seqs:
            if len(s.subs) < k and not search.out_of_time():
                out.extend(all_children(s))
        return distinct(out)

    current = [search.root]
    with search.run.stoppable():
        while current and not search.out_of_time():
            tmp = grow(current)                                    # line 4
            inc = [s for s in tmp if further(s)]                   # line 6
            des = [s for s in tmp if not further(s)]               # line 7
            frontier = list(inc)
            while frontier and not search.out_of_time():           # lines 8-12
                frontier.sort(key=potential)
                frontier = grow(frontier[:half])
                inc.extend(frontier)
                frontier = [s for s in frontier if further(s)]
            inc = [s for s in inc if trailing_increases(s) == 0]   # line 13
            des.sort(key=lambda s: s.cost)                         # line 14
            inc.sort(key=lambda s: s.cost)
            current = distinct(des[:half] + inc[:half])
            search.report()
    return search.result()
