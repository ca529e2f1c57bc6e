"""The search algorithms by name. Each algorithm's module registers its functions here when
it is imported, so the registry sits below every search, the e-graph ones included, and adding
an algorithm touches only its own module (and, for the e-graph searches, the import of
`graphsub.egraph` by whoever looks algorithms up by name: the optimizer, compare, the fuzzer).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

#: The settings of `graphsub.optimize` that only some searches take; every search takes
#: time_limit, progress and keep.
SETTINGS = frozenset({"alpha", "budget", "k", "node_limit", "k_multi"})


@dataclass(frozen=True)
class SearchAlgorithm:
    """A search: `function(graph, rules, cost_model, time_limit=..., progress=..., keep=...,
    **settings) -> OptimizeResult`, with the SETTINGS it takes (given only when set: a search
    keeps its own defaults), and whether it grows an e-graph (its report has e-graph
    statistics)."""

    name: str
    function: Callable
    settings: frozenset[str]
    egraph: bool = False


ALGORITHMS: dict[str, SearchAlgorithm] = {}

F = TypeVar("F", bound=Callable)


def register(name: str, settings: Iterable[str] = (), egraph: bool = False) -> Callable[[F], F]:
    """Decorator: the function is the search called `name`, taking `settings`."""
    taken = frozenset(settings)
    unknown = taken - SETTINGS
    if unknown:
        raise ValueError(f"search {name}: unknown settings {sorted(unknown)}")

    def add(function: F) -> F:
        ALGORITHMS[name] = SearchAlgorithm(name, function, taken, egraph)
        return function

    return add
