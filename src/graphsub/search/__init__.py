"""Search algorithms. Each has the shape
`(graph, rules, cost_model, limits...) -> OptimizeResult(graph, trace, stats)`."""

from graphsub.search.backtracking import backtracking_search, greedy_search
from graphsub.search.result import Candidate, OptimizeResult, SearchStats, Step

ALGORITHMS = {"backtracking": backtracking_search, "greedy": greedy_search}

__all__ = ["ALGORITHMS", "Candidate", "OptimizeResult", "SearchStats", "Step",
           "backtracking_search", "greedy_search"]
