"""Search algorithms. Each has the shape
`(graph, rules, cost_model, limits...) -> OptimizeResult(graph, trace, stats)`."""

from graphsub.search.backtracking import backtracking_search, greedy_search
from graphsub.search.ocggs import dpp_search, enumeration_search, pruning_search, sampling_search
from graphsub.search.result import Candidate, OptimizeResult, SearchStats, Step

ALGORITHMS = {"backtracking": backtracking_search, "greedy": greedy_search,
              "pruning": pruning_search, "dpp": dpp_search, "sampling": sampling_search,
              "enumeration": enumeration_search}
#: The algorithms bounded by a sequence length K (OCGGS).
LENGTH_BOUNDED = frozenset({"pruning", "dpp", "sampling", "enumeration"})

__all__ = ["ALGORITHMS", "LENGTH_BOUNDED", "Candidate", "OptimizeResult", "SearchStats", "Step",
           "backtracking_search", "dpp_search", "enumeration_search", "greedy_search",
           "pruning_search", "sampling_search"]
