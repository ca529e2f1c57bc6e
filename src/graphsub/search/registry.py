"""The search contract, and the algorithms by name.

A search is a plain function `(graph, rules, cost_model, limits, options) -> OptimizeResult`
(the shape of networkx's `flow_func`): `limits` is the same `Limits` for every algorithm (time,
budget, how many graphs to keep, progress), `options` an instance of the algorithm's own frozen
dataclass, so a setting it does not have is an error, not a silent no-op. Each algorithm's
module registers its function here when it is imported, so the registry sits below every
search, the e-graph ones included, and adding an algorithm is one file (plus, for the e-graph
searches, the import of `graphsub.egraph` by whoever looks algorithms up by name: the
optimizer, compare, the fuzzer).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from graphsub.errors import GraphsubError
from graphsub.search.result import ProgressFn

if TYPE_CHECKING:
    from collections.abc import Sequence

    from graphsub.cost.base import CostModel
    from graphsub.ir.graph import Graph
    from graphsub.rules.ast import Rule
    from graphsub.search.result import OptimizeResult


@dataclass(frozen=True)
class Limits:
    """When a search stops and whom it tells how it goes: the same for every algorithm.

    `budget` counts the algorithm's own unit of work, which its registration names
    (`SearchAlgorithm.budget_unit`: graphs expanded, e-graph iterations, MCTS iterations per
    decision); None is the algorithm's default (`SearchAlgorithm.default_budget`, None for
    unbounded). `keep` is how many of the best graphs come back."""

    time: float = 60.0
    budget: int | None = None
    keep: int = 5
    progress: ProgressFn | None = None

    def budget_or(self, default: int | None) -> int | None:
        return default if self.budget is None else self.budget


class SearchFn(Protocol):
    def __call__(self, graph: Graph, rules: Sequence[Rule], cost_model: CostModel,
                 limits: Limits = ..., options: Any = ...) -> OptimizeResult: ...


@dataclass(frozen=True)
class SearchAlgorithm:
    """A registered search: its function, its options' dataclass, what its budget counts
    (and the default), and whether it grows an e-graph (its report has e-graph statistics)."""

    name: str
    function: SearchFn
    options: type
    budget_unit: str
    default_budget: int | None
    egraph: bool = False

    def option_names(self) -> list[str]:
        return [f.name for f in dataclasses.fields(self.options)]

    def make_options(self, **given: Any) -> Any:
        """The algorithm's options with `given` set; a name it does not have is an error."""
        unknown = sorted(set(given) - set(self.option_names()))
        if unknown:
            known = ", ".join(self.option_names()) or "none"
            raise GraphsubError(f"the {self.name} search has no setting "
                                f"{', '.join(unknown)} (its settings: {known})")
        return self.options(**given)


ALGORITHMS: dict[str, SearchAlgorithm] = {}

F = TypeVar("F", bound=Callable[..., Any])


def register(name: str, options: type, budget_unit: str, default_budget: int | None,
             egraph: bool = False) -> Callable[[F], F]:
    """Decorator: the function is the search called `name`, configured by `options` (a
    dataclass whose every field has a default)."""
    if not dataclasses.is_dataclass(options):
        raise TypeError(f"search {name}: options must be a dataclass, not {options!r}")

    def add(function: F) -> F:
        ALGORITHMS[name] = SearchAlgorithm(name, function, options, budget_unit, default_budget,
                                           egraph)
        return function

    return add
