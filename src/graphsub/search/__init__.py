"""Search algorithms. Each has the shape
`(graph, rules, cost_model, limits...) -> OptimizeResult(graph, trace, stats)` and is found
by name in ALGORITHMS; the e-graph searches (eqsat, mcts) join it when `graphsub.egraph` is
imported."""

from graphsub.search.backtracking import backtracking_search, greedy_search
from graphsub.search.ocggs import dpp_search, enumeration_search, pruning_search, sampling_search
from graphsub.search.registry import ALGORITHMS, SearchAlgorithm, register
from graphsub.search.result import Candidate, OptimizeResult, SearchStats, Step

__all__ = ["ALGORITHMS", "Candidate", "OptimizeResult", "SearchAlgorithm",
           "SearchStats", "Step", "backtracking_search", "dpp_search", "enumeration_search",
           "greedy_search", "pruning_search", "register", "sampling_search"]
