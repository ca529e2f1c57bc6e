"""The search algorithms by name. Each algorithm's module registers its functions here when
it is imported, so the registry sits below every search, the e-graph ones included, and adding
an algorithm touches only its own module (and, for the e-graph searches, the import of
`graphsub.egraph` by whoever looks algorithms up by name: the optimizer, compare, the fuzzer).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

#: name -> search function: `(graph, rules, cost_model, limits...) -> OptimizeResult`.
ALGORITHMS: dict[str, Callable] = {}
#: The algorithms bounded by a sequence length K (OCGGS).
LENGTH_BOUNDED: set[str] = set()
#: The algorithms that grow an e-graph (Tensat, MCTS) and take a node limit.
EGRAPH_BASED: set[str] = set()

_FAMILIES = {"rewrite": None, "length-bounded": LENGTH_BOUNDED, "egraph": EGRAPH_BASED}

F = TypeVar("F", bound=Callable)


def register(name: str, family: str = "rewrite") -> Callable[[F], F]:
    """Decorator: the function is the search called `name`; `family` is `rewrite` (graph
    rewriting under a time limit), `length-bounded` (takes k) or `egraph` (takes a node
    limit)."""
    members = _FAMILIES[family]

    def add(function: F) -> F:
        ALGORITHMS[name] = function
        if members is not None:
            members.add(name)
        return function

    return add
