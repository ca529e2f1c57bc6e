"""Search algorithms. Each is a plain function
`(graph, rules, cost_model, limits, options) -> OptimizeResult` (graphsub.search.registry has
the contract), found by name in ALGORITHMS; the e-graph searches (eqsat, mcts) join it when
`graphsub.egraph` is imported. `splitting` wraps any of them in MetaFlow's graph split."""

from graphsub.search.backtracking import (BacktrackingOptions, GreedyOptions, backtracking_search,
                                          greedy_search)
from graphsub.search.ocggs import (EnumerationOptions, SamplingOptions, SequenceOptions,
                                   dpp_search, enumeration_search, pruning_search,
                                   sampling_search)
from graphsub.search.registry import ALGORITHMS, Limits, SearchAlgorithm, SearchFn, register
from graphsub.search.result import (Candidate, OptimizeResult, SearchProgress, SearchStats, Step,
                                    StopReason)
from graphsub.search.split import splitting

__all__ = ["ALGORITHMS", "BacktrackingOptions", "Candidate", "EnumerationOptions",
           "GreedyOptions", "Limits", "OptimizeResult", "SamplingOptions", "SearchAlgorithm",
           "SearchFn", "SearchProgress", "SearchStats", "SequenceOptions", "Step", "StopReason",
           "backtracking_search", "dpp_search", "enumeration_search", "greedy_search",
           "pruning_search", "register", "sampling_search", "splitting"]
