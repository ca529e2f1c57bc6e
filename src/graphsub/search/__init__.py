"""Search algorithms. Each is a plain function
`(graph, rules, cost_model, limits, options) -> OptimizeResult` (graphsub.search.registry has
the contract), found by name in ALGORITHMS, which imports an algorithm's module when it is
first looked up. `splitting` wraps any of them in MetaFlow's graph split.

The names are imported when first used (graphsub.lazy): the registry's list of algorithms,
which the command line's help shows, costs no search's import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from graphsub.lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(("BacktrackingOptions", "GreedyOptions", "backtracking_search",
                     "greedy_search"), "graphsub.search.backtracking"),
    **dict.fromkeys(("EnumerationOptions", "SamplingOptions", "SequenceOptions", "dpp_search",
                     "enumeration_search", "pruning_search", "sampling_search"),
                    "graphsub.search.ocggs"),
    **dict.fromkeys(("ALGORITHMS", "Limits", "SearchAlgorithm", "SearchFn", "register"),
                    "graphsub.search.registry"),
    **dict.fromkeys(("Candidate", "OptimizeResult", "SearchProgress", "SearchStats", "Step",
                     "StopReason"), "graphsub.search.result"),
    "splitting": "graphsub.search.split",
}
__all__ = ["ALGORITHMS", "BacktrackingOptions", "Candidate", "EnumerationOptions",
           "GreedyOptions", "Limits", "OptimizeResult", "SamplingOptions", "SearchAlgorithm",
           "SearchFn", "SearchProgress", "SearchStats", "SequenceOptions", "Step", "StopReason",
           "backtracking_search", "dpp_search", "enumeration_search", "greedy_search",
           "pruning_search", "register", "sampling_search", "splitting"]
__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)

if TYPE_CHECKING:
    from graphsub.search.backtracking import (BacktrackingOptions, GreedyOptions,
                                              backtracking_search, greedy_search)
    from graphsub.search.ocggs import (EnumerationOptions, SamplingOptions, SequenceOptions,
                                       dpp_search, enumeration_search, pruning_search,
                                       sampling_search)
    from graphsub.search.registry import ALGORITHMS, Limits, SearchAlgorithm, SearchFn, register
    from graphsub.search.result import (Candidate, OptimizeResult, SearchProgress, SearchStats,
                                        Step, StopReason)
    from graphsub.search.split import splitting
