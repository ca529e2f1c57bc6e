"""Monte Carlo tree search over e-graph construction (`--algorithm mcts`): the MCTS paper's
Algorithm 1 (PACT'24, section 4.1).

Equality saturation under a node limit still has a phase-ordering problem: which rules fill
the e-graph first decides what it can hold. MCTS picks them. A search-tree node is an e-graph
state, an edge a rule (single- or multi-pattern) applied to it. Each of the `budget` iterations

- *selects*: from the root, stop with probability 1/2 at a node that still has untried rules,
  else go to the non-saturated child of highest UCB1 = v/n + c sqrt(ln N / n);
- *expands*: applies a random untried rule that is not on the node's blacklist to a copy of its
  e-graph. If nothing changed, the child is saturated (never visited again) and the rule goes
  on the node's blacklist; otherwise every rule with a source pattern that does not occur in
  the child's e-graph goes on the child's blacklist;
- *simulates*: applies random rules for up to `max_depth` steps (or until the node limit),
  extracting the best graph with the DAG-aware greedy extractor after each; the reward is the
  sum of the cost reductions, each clipped at 0 (equation 3). The sum starts at the search
  root's e-graph: the rule applications on the tree path down to the new node count as steps
  too. Counting only the rollout's would credit a node's own gain once, at its expansion, and
  its later visits would dilute it: on NasRNN the root's child with a 26% gain ended with a
  lower average value than children with none, and MCTS never applied it;
- *backpropagates*: v += r, n += 1 up to the root.

Then the root's child of highest average value becomes the new root (its subtree is reused)
and its e-graph the main e-graph; this repeats until the e-graph saturates or reaches the node
limit. The final graph is extracted from the main e-graph (ILP by default, as the paper's best
"OCF/ILP" setting). Rewards are fractions of the initial graph's cost, so they lie in [0, 1]
as UCB1 assumes.

Each tree node holds its own e-graph: a copy-on-write clone (graphsub.egraph.egraph explains
why clones rather than an undo log).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from graphsub.cost.base import CostModel
from graphsub.egraph.runner import Runner
from graphsub.egraph.saturation import EGraphSearch, ExtractionOptions
from graphsub.ir.graph import Graph
from graphsub.rules.ast import Rule
from graphsub.search.registry import Limits, option, register
from graphsub.search.result import OptimizeResult, StopReason



@dataclass(eq=False)
class TreeNode:
    state: Runner
    cost: float                      # DAG-greedy cost of the state's best graph
    action: int | None = None        # the rule that led here
    parent: TreeNode | None = None
    children: dict[int, TreeNode] = field(default_factory=dict)
    visits: int = 0
    value: float = 0.0
    saturated: bool = False
    blacklist: set[int] = field(default_factory=set)

    def untried(self, n_rules: int) -> list[int]:
        if self.state.full:
            return []
        return [a for a in range(n_rules) if a not in self.blacklist and a not in self.children]

    def open_children(self) -> list[TreeNode]:
        return [c for c in self.children.values() if not c.saturated]

    def ucb(self, c: float) -> float:
        if self.visits == 0:
            return math.inf
        n_parent = self.parent.visits if self.parent is not None else self.visits
        return self.value / self.visits + c * math.sqrt(math.log(max(n_parent, 1)) / self.visits)


@dataclass
class MctsTrace:
    iterations: int = 0
    expansions: int = 0
    saturated_children: int = 0
    rollout_steps: int = 0
    decision_seconds: list[float] = field(default_factory=list)


class _Mcts:
    def __init__(self, search: EGraphSearch, budget: int, max_depth: int, c: float,
                 rng: random.Random) -> None:
        self.search = search
        self.run = search.run
        self.budget = budget
        self.max_depth = max_depth
        self.c = c
        self.rng = rng
        self.n_rules = len(search.runner.rules)
        self.scale = 1.0
        self.trace = MctsTrace()

    def out_of_time(self) -> bool:
        return self.run.check_limits() is not None

    def blacklist_for(self, state: Runner, parent: TreeNode | None = None) -> set[int]:
        """Rules a source pattern of which does not occur: applying them changes nothing. A
        child's e-graph holds its parent's, so only the parent's blacklist is checked again.
        Hundreds of patterns looked for on a large e-graph take a second: the clock is read
        as they go."""
        deadline = self.run.deadline
        if parent is None:
            return {a for a in range(self.n_rules)
                    if not state.applicable(a, deadline=deadline)}
        since = parent.state.egraph.version
        near: dict[int, set[int]] = {}
        return {a for a in parent.blacklist
                if not state.applicable(a, since, near, deadline)}

    def select(self, root: TreeNode) -> TreeNode:
        node = root
        while True:
            has_untried = bool(node.untried(self.n_rules))
            open_children = node.open_children()
            if has_untried and (not open_children or self.rng.random() < 0.5):
                return node
            if not open_children:
                return node  # nothing left below: expansion will mark it saturated
            node = max(open_children, key=lambda ch: ch.ucb(self.c))

    def expand(self, node: TreeNode) -> TreeNode | None:
        actions = node.untried(self.n_rules)
        if not actions:
            node.saturated = True
            return None
        action = self.rng.choice(actions)
        state = node.state.clone()
        changed = state.apply_rule(action, self.run.deadline)
        self.trace.expansions += 1
        if not changed:
            node.blacklist.add(action)
            self.trace.saturated_children += 1
            # Never visited again: it keeps its parent's state, not a clone to collect.
            child = TreeNode(node.state, node.cost, action, node, saturated=True)
            node.children[action] = child
            return child
        child = TreeNode(state, self.search.extract_cost(state), action, node)
        child.blacklist = self.blacklist_for(state, node)
        node.children[action] = child
        return child

    def simulate(self, child: TreeNode) -> float:
        reward = 0.0
        node = child
        while node.parent is not None:  # the tree path's steps, from the search root
            reward += max(node.parent.cost - node.cost, 0.0)
            node = node.parent
        sim = child.state.clone()
        allowed = [a for a in range(self.n_rules) if a not in child.blacklist]
        previous = child.cost
        for _ in range(self.max_depth):
            if sim.full or not allowed or self.out_of_time():
                break
            self.trace.rollout_steps += 1
            if not sim.apply_rule(self.rng.choice(allowed), self.run.deadline):
                continue
            cost = self.search.extract_cost(sim)
            reward += max(previous - cost, 0.0)
            previous = cost
        return reward / self.scale

    @staticmethod
    def backpropagate(node: TreeNode | None, reward: float) -> None:
        while node is not None:
            node.value += reward
            node.visits += 1
            node = node.parent

    def decide(self, root: TreeNode) -> TreeNode | None:
        """Run the budget from `root`; the child to move to (None: nothing to apply)."""
        for _ in range(self.budget):
            if self.out_of_time() or root.saturated:
                break
            self.trace.iterations += 1
            node = self.select(root)
            child = self.expand(node)
            if child is None or child.saturated:
                continue
            self.backpropagate(child, self.simulate(child))
        # Every child that changed the e-graph was visited, those whose subtree the budget
        # explored to the end (saturated, so never selected again) too: they are moves as
        # good as any. A rule that changed nothing made a child never visited.
        visited = [c for c in root.children.values() if c.visits > 0]
        if not visited:
            return None
        return max(visited, key=lambda ch: ch.value / ch.visits)


#: MCTS iterations per decision when the limits give no budget (as in the paper).
BUDGET = 128


@dataclass(frozen=True, kw_only=True)
class MctsOptions(ExtractionOptions):
    node_limit: int = option(2000, "the e-graph's most e-nodes", least=1)  # the paper's
    max_depth: int = option(10, "rollout steps", least=1)
    c: float = option(0.5, "UCB1's exploration constant", least=0.0)
    seed: int = option(0, "the tree search's random seed")


@register("mcts", MctsOptions, "MCTS iterations per decision", BUDGET, egraph=True)
def mcts_search(graph: Graph, rules: Sequence[Rule], cost_model: CostModel,
                limits: Limits = Limits(), options: MctsOptions = MctsOptions()
                ) -> OptimizeResult:
    """MCTS-guided e-graph construction, then extraction. The time limit stops construction
    (the tree's best move so far is taken); extraction as for eqsat."""
    budget = limits.budget_or(BUDGET)
    max_depth, c, node_limit = options.max_depth, options.c, options.node_limit
    # The budget counts iterations per decision: it never stops the search itself.
    search = EGraphSearch.begin(graph, rules, cost_model, node_limit, limits, None,
                                "decisions")
    runner, run = search.runner, search.run
    mcts = _Mcts(search, budget, max_depth, c, random.Random(options.seed))
    root = TreeNode(runner, search.extract_cost(runner))
    mcts.scale = root.cost if root.cost > 0 else 1.0
    decisions: list[str] = []
    # A DeadlineReached comes from looking for patterns, on a clone or before any change.
    with run.stoppable():
        root.blacklist = mcts.blacklist_for(runner)
        while True:
            if root.state.full:
                run.stop(StopReason.NODE_LIMIT)
                break
            if run.check_limits():
                break
            began = run.elapsed()
            best = mcts.decide(root)
            mcts.trace.decision_seconds.append(run.elapsed() - began)
            if best is None:
                run.check_limits()  # out of time, or nothing left to apply (saturated)
                break
            assert best.action is not None  # a child, made by a rule
            decisions.append(runner.rules[best.action].name)
            best.parent = None
            root = best
            run.stats.explored = len(decisions)
            run.report(root.cost)
    final = root.state
    growth = final.stats
    growth.iterations = len(decisions)
    result = search.finish(final, options.extractors,
                           search.extraction_time(options.extract_time), growth, decisions)
    t = mcts.trace
    result.stats.egraph["mcts"] = {
        "iterations": t.iterations, "expansions": t.expansions,
        "saturated_children": t.saturated_children, "rollout_steps": t.rollout_steps,
        "seconds_per_iteration": (round(sum(t.decision_seconds) / t.iterations, 4)
                                  if t.iterations else None),
        "budget": budget, "max_depth": max_depth, "c": c, "node_limit": node_limit}
    return result
