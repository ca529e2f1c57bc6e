"""The search contract, and the algorithms by name.

A search is a plain function `(graph, rules, cost_model, limits, options) -> OptimizeResult`
(the shape of networkx's `flow_func`): `limits` is the same `Limits` for every algorithm (time,
budget, how many graphs to keep, progress), `options` an instance of the algorithm's own frozen
dataclass, so a setting it does not have is an error, not a silent no-op. Each option is a
field made with `option(...)`: its default, what it does in words (the command line's
`graphsub info --algorithms` shows it) and its least value; a dataclass may check more in its
`__post_init__` (raising GraphsubError), since the settings make it where the user's values
arrive.

Every algorithm is declared here by name, with the module that defines it and what it is in
a few words (`declare`: what the command line's help lists without importing any search);
that module registers its function and options with `@register(name, ...)` when the
registry imports it, on the first lookup of an algorithm. So the e-graph searches (a layer
above) are found without anyone importing them for the side effect, and adding an algorithm
is its module, its line in DECLARED (or a `declare` call, for a package of one's own) and its
tests (docs/search.md).
"""

from __future__ import annotations

import dataclasses
import importlib
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from graphsub.errors import GraphsubError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from graphsub.cost.base import CostModel
    from graphsub.ir.graph import Graph
    from graphsub.rules.ast import Rule
    from graphsub.search.result import OptimizeResult, ProgressFn

@dataclass(frozen=True)
class Declared:
    """An algorithm as the registry knows it before its module is imported."""

    module: str
    summary: str


#: Every algorithm by name, in the order the command line lists them.
DECLARED: dict[str, Declared] = {
    "backtracking": Declared("graphsub.search.backtracking",
                             "TASO's cost-bounded backtracking (MetaFlow's relaxed search)"),
    "greedy": Declared("graphsub.search.backtracking", "the cheapest child, in turn"),
    "pruning": Declared("graphsub.search.ocggs", "OCGGS's exact sequence search, pruned"),
    "dpp": Declared("graphsub.search.ocggs", "OCGGS's dynamic programming over sequences"),
    "sampling": Declared("graphsub.search.ocggs", "OCGGS's sampling of sequences"),
    "enumeration": Declared("graphsub.search.ocggs", "every sequence up to k (brute force)"),
    "eqsat": Declared("graphsub.egraph.saturation",
                      "Tensat's equality saturation, then extraction"),
    "mcts": Declared("graphsub.egraph.mcts",
                     "e-graph construction by Monte Carlo tree search, then extraction"),
}


def declare(name: str, module: str, summary: str) -> None:
    """Add an algorithm defined (with `@register(name, ...)`) in `module`."""
    DECLARED[name] = Declared(module, summary)


#: A default budget: an int, or None for unbounded.
D = TypeVar("D", bound=int | None)


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

    def budget_or(self, default: D) -> int | D:
        return default if self.budget is None else self.budget


class SearchFn(Protocol):
    def __call__(self, graph: Graph, rules: Sequence[Rule], cost_model: CostModel,
                 limits: Limits = ..., options: Any = ...) -> OptimizeResult: ...


def option(default: Any, help: str, least: float | None = None) -> Any:
    """A field of an algorithm's options: its default, what it does (for the command line's
    listing) and, for a number, its least value (checked where settings are made)."""
    return dataclasses.field(default=default, metadata={"help": help, "least": least})


@dataclass(frozen=True)
class OptionSpec:
    """One option of an algorithm as its dataclass declares it."""

    name: str
    kind: Any
    default: Any
    help: str
    least: float | None

    @property
    def type_name(self) -> str:
        return type_name(self.kind)


@dataclass(frozen=True)
class SearchAlgorithm:
    """A registered search: its function, its options' dataclass, what its budget counts
    (and the default), whether it grows an e-graph (its report has e-graph statistics), and
    what it is in a few words (the command line's help)."""

    name: str
    function: SearchFn
    options: type
    budget_unit: str
    default_budget: int | None
    egraph: bool = False

    @property
    def summary(self) -> str:
        return DECLARED[self.name].summary

    def option_names(self) -> list[str]:
        return [f.name for f in dataclasses.fields(self.options)]

    def option_specs(self) -> list[OptionSpec]:
        hints = typing.get_type_hints(self.options)
        return [OptionSpec(f.name, hints[f.name], f.default, f.metadata.get("help", ""),
                           f.metadata.get("least")) for f in dataclasses.fields(self.options)]

    def make_options(self, flags: Mapping[str, str] | None = None, **given: Any) -> Any:
        """The algorithm's options with `given` set: a name it does not have, a value of
        another type, or one below the option's least, is an error naming the option as
        `flags` (the command line's) names it."""
        unknown = sorted(set(given) - set(self.option_names()))
        if unknown:
            known = ", ".join(self.option_names()) or "none"
            raise GraphsubError(f"the {self.name} search has no setting "
                                f"{', '.join(unknown)} (its settings: {known})")
        specs = {spec.name: spec for spec in self.option_specs()}
        for name, value in given.items():
            spec, shown = specs[name], (flags or {}).get(name, name)
            if not is_a(spec.kind, value):
                raise GraphsubError(f"{shown} takes {spec.type_name}, not {value!r}")
            if spec.least is not None and value is not None and not value >= spec.least:
                raise GraphsubError(f"{shown} must be at least {spec.least:g} (got {value})")
        return self.options(**given)

    def parse_option(self, text: str) -> tuple[str, Any]:
        """A "name=value" of the options, the value in the type the option declares (int,
        float, bool, str, a comma-separated tuple, or "none" for an optional one)."""
        name, eq, raw = text.partition("=")
        name = name.strip().replace("-", "_")
        if not eq or not name:
            raise GraphsubError(f"--option {text!r} is not NAME=VALUE (e.g. c=1.4); the "
                                f"{self.name} search's options: "
                                f"{', '.join(self.option_names())}")
        specs = {spec.name: spec for spec in self.option_specs()}
        if name not in specs:
            raise GraphsubError(f"the {self.name} search has no option {name!r}; its options: "
                                f"{', '.join(self.option_names()) or 'none'}")
        try:
            return name, convert(specs[name].kind, raw.strip())
        except ValueError:
            raise GraphsubError(f"--option {text!r}: {raw.strip()!r} is not a value of "
                                f"{specs[name].type_name}") from None


class AlgorithmRegistry(Mapping[str, SearchAlgorithm]):
    """The declared algorithms by name, in DECLARED's order; a declared algorithm's module is
    imported when it is first looked up (its `@register` call fills the entry)."""

    def __init__(self) -> None:
        self._found: dict[str, SearchAlgorithm] = {}

    def add(self, algorithm: SearchAlgorithm) -> None:
        if algorithm.name not in DECLARED:
            raise GraphsubError(f"search {algorithm.name} is registered but not declared: "
                                "add it to graphsub.search.registry.DECLARED (or call "
                                "declare) with its module and summary")
        self._found[algorithm.name] = algorithm

    def __getitem__(self, name: str) -> SearchAlgorithm:
        if name not in self._found and name in DECLARED:
            importlib.import_module(DECLARED[name].module)
            if name not in self._found:
                raise GraphsubError(f"{DECLARED[name].module} declares no search {name!r} "
                                    "(@register it there)")
        return self._found[name]

    def __iter__(self) -> Iterator[str]:
        return iter(list(DECLARED))

    def __len__(self) -> int:
        return len(DECLARED)

    def __contains__(self, name: object) -> bool:
        return name in DECLARED


ALGORITHMS = AlgorithmRegistry()

F = TypeVar("F", bound=Callable[..., Any])


def register(name: str, options: type, budget_unit: str, default_budget: int | None,
             egraph: bool = False) -> Callable[[F], F]:
    """Decorator: the function is the search called `name` (declared in DECLARED),
    configured by `options` (a dataclass whose every field has a default, made with
    `option`)."""
    if not dataclasses.is_dataclass(options):
        raise TypeError(f"search {name}: options must be a dataclass, not {options!r}")

    def add(function: F) -> F:
        ALGORITHMS.add(SearchAlgorithm(name, function, options, budget_unit, default_budget,
                                       egraph))
        return function

    return add


def convert(kind: Any, raw: str) -> Any:
    """`raw` as a value of the annotated type `kind` (ValueError if it is not one)."""
    args = typing.get_args(kind)
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        if raw.lower() == "none" and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return convert(inner, raw)
    if typing.get_origin(kind) is tuple:
        return tuple(convert(args[0], part.strip()) for part in raw.split(",") if part.strip())
    if kind is bool:
        if raw.lower() in ("true", "yes", "on", "1"):
            return True
        if raw.lower() in ("false", "no", "off", "0"):
            return False
        raise ValueError(raw)
    if kind in (int, float, str):
        return kind(raw)
    raise ValueError(raw)


def is_a(kind: Any, value: Any) -> bool:
    """Whether `value` is of the annotated type `kind` (an int is a float; a bool is not a
    number)."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        return any(is_a(k, value) for k in typing.get_args(kind))
    if kind is type(None):
        return value is None
    if typing.get_origin(kind) is tuple:
        (inner, *_) = typing.get_args(kind)
        return isinstance(value, tuple) and all(is_a(inner, v) for v in value)
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind) if isinstance(kind, type) else True


def type_name(kind: Any) -> str:
    return getattr(kind, "__name__", None) or str(kind).replace("typing.", "")
