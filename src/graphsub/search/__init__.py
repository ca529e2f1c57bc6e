"""Search algorithms. Each has the shape
`(graph, rules, cost_model, limits...) -> OptimizeResult(graph, trace, stats)`."""

from graphsub.search.backtracking import backtracking_search, greedy_search
from graphsub.search.ocggs import dpp_search, enumeration_search, pruning_search, sampling_search
from graphsub.search.result import Candidate, OptimizeResult, SearchStats, Step
from graphsub.egraph.mcts import mcts_search  # noqa: E402  (e-graph searches use search.result)
from graphsub.egraph.saturation import eqsat_search  # noqa: E402

ALGORITHMS = {"backtracking": backtracking_search, "greedy": greedy_search,
              "pruning": pruning_search, "dpp": dpp_search, "sampling": sampling_search,
              "enumeration": enumeration_search, "eqsat": eqsat_search, "mcts": mcts_search}
#: The algorithms bounded by a sequence length K (OCGGS).
LENGTH_BOUNDED = frozenset({"pruning", "dpp", "sampling", "enumeration"})
#: The algorithms that grow an e-graph (Tensat, MCTS) and take a node limit.
EGRAPH_BASED = frozenset({"eqsat", "mcts"})

__all__ = ["ALGORITHMS", "EGRAPH_BASED", "LENGTH_BOUNDED", "Candidate", "OptimizeResult", "SearchStats", "Step",
           "backtracking_search", "dpp_search", "enumeration_search", "eqsat_search", "greedy_search", "mcts_search",
           "pruning_search", "sampling_search"]
