"""Every setting of one optimization run, in one frozen object validated where it is made.

The command line, the Python API, the torch.compile backend and the fuzzer all make a
`Settings` and hand it to the stages; no stage checks a setting again, and a setting that is
out of range, or that the chosen algorithm or target does not have, is refused before any
work with a one-line message naming what is accepted.

    settings = Settings.make(algorithm="mcts", time_limit=30, c=1.4, seed=3)
    settings = Settings.make(algorithm="backtracking", options={"alpha": 1.1})

`make` sorts keywords into the settings below and the chosen algorithm's own options (its
frozen dataclass: `BacktrackingOptions`, `MctsOptions`, ...); `Settings.option` parses
"name=value" text (the command line's `--option`) into the type the algorithm declares.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import graphsub.egraph  # noqa: F401  (registers the e-graph searches by name)
from graphsub.backends import Target, capabilities, default_target_name, target_names
from graphsub.backends import ort_fusions as ort_fusions_module
from graphsub.cost import CostModel
from graphsub.errors import GraphsubError
from graphsub.pipeline.objective import Objective
from graphsub.runtime.bindings import ProfileShape, parse_profile
from graphsub.egraph.saturation import EXTRACTORS
from graphsub.search import ALGORITHMS

#: Cost models by name, and where --split runs parts.
COST_MODELS = ("measured", "analytic", "compiled")
EXECUTORS = ("process", "dask", "serial")

#: The least value of each algorithm option that has one (the options' dataclasses hold
#: defaults; what makes sense is checked here, where the user's values arrive).
OPTION_LEAST: dict[str, float] = {"alpha": 1.0, "k": 1, "node_limit": 1, "k_multi": 0, "q": 1,
                                  "eta": 0, "max_depth": 1, "c": 0.0, "max_node_factor": 1.0,
                                  "extract_time": 0.0}
#: Options with a command-line flag of their own (the rest go through --option NAME=VALUE).
OPTION_FLAGS = {"k": "--k", "node_limit": "--node-limit", "k_multi": "--k-multi"}


@dataclass(frozen=True, kw_only=True)
class Settings:
    """One run's settings (see `graphsub optimize --help` for each in words)."""

    algorithm: str = "backtracking"
    #: The algorithm's own options, as given (name -> value); `search_options` is the
    #: algorithm's dataclass made from them.
    options: Mapping[str, Any] = field(default_factory=dict)
    #: The algorithm's own unit of work (None: its default).
    budget: int | None = None
    #: Seconds for the whole run, loading included (graphsub.budget shares them out).
    time_limit: float = 60.0
    #: Seconds for timing and confirming after the search (None: within the time limit).
    measure_limit: float | None = None
    #: "measured" (timed on the target), "analytic", or a CostModel to price with.
    cost: str | CostModel = "measured"
    #: What the search minimizes besides latency (MetaFlow's multi-objective cost).
    objective: Objective = field(default_factory=Objective)
    #: Where the model will run: a target name, a Target, or None for this machine's default.
    target: str | Target | None = None
    threads: int | None = None
    #: torch-cuda's options (None: the target's default; refused on targets without them).
    cuda_graphs: bool | None = None
    allow_tf32: bool | None = None
    #: MetaFlow's graph split: parts of at most this many operators (None: no split).
    split: int | None = None
    executor: str = "process"
    #: Candidates timed end to end, and the seconds the screening of them takes at least.
    candidates: int = 3
    measure_seconds: float = 3.0
    #: Graphs a search hands back (the best first).
    keep: int = 5
    fission: bool = True
    ort_fusions: bool = False
    #: Whether the optimizers a user would otherwise run (onnxruntime's, onnxscript's,
    #: onnxslim: graphsub.backends.peers) make candidates too, on targets that run ONNX.
    peers: bool = True
    #: Whether the written model keeps its weights in a data file beside it (None: where the
    #: input did, or where they are too large for one protobuf: onnx_io.external).
    external_data: bool | None = None
    #: Whether the report gets what its HTML page draws (rewrites replayed, operator times).
    evidence: bool = True
    #: The bindings of a model's size symbols that costs are measured at, with weights
    #: (runtime.bindings.ProfileShape, or "batch=1,seq=128[:weight]" text); empty: the
    #: default profile (runtime.bindings.default_profile) for a model with symbolic sizes.
    shape_profile: tuple[Any, ...] = ()
    search_options: Any = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise GraphsubError(f"unknown algorithm {self.algorithm!r}; use one of "
                                f"{', '.join(ALGORITHMS)}")
        search = ALGORITHMS[self.algorithm]
        hints = typing.get_type_hints(search.options)
        for name, value in self.options.items():
            if name in hints and not _is_a(hints[name], value):
                raise GraphsubError(f"{OPTION_FLAGS.get(name, name)} takes "
                                    f"{_type_name(hints[name])}, not {value!r}")
            least = OPTION_LEAST.get(name)
            if least is not None and value is not None and not value >= least:
                raise GraphsubError(f"{OPTION_FLAGS.get(name, name)} must be at least "
                                    f"{least:g} (got {value})")
        unknown = set(self.options.get("extractors") or ()) - set(EXTRACTORS)
        if unknown:
            raise GraphsubError(f"unknown extractor(s) {', '.join(sorted(unknown))}; use "
                                f"{', '.join(EXTRACTORS)}")
        if self.options.get("extractors") == ():
            raise GraphsubError(f"extractors must name at least one of {', '.join(EXTRACTORS)}")
        object.__setattr__(self, "options", types.MappingProxyType(dict(self.options)))
        object.__setattr__(self, "search_options", search.make_options(**self.options))
        if isinstance(self.cost, str) and self.cost not in COST_MODELS:
            raise GraphsubError(f"unknown cost model {self.cost!r}; use "
                                f"{' or '.join(COST_MODELS)}")
        if self.executor not in EXECUTORS:
            raise GraphsubError(f"unknown executor {self.executor!r}; use one of "
                                f"{', '.join(EXECUTORS)}")
        for name, seconds in (("--time-limit", self.time_limit),
                              ("--measure-limit", self.measure_limit)):
            if seconds is not None and not (math.isfinite(seconds) and seconds > 0):
                raise GraphsubError(f"{name} must be a positive number of seconds "
                                    f"(got {seconds:g})")
        for name, value, least, kind in (("--budget", self.budget, 1, int),
                                         ("--candidates", self.candidates, 0, int),
                                         ("--threads", self.threads, 1, int),
                                         ("keep", self.keep, 1, int),
                                         ("measure_seconds", self.measure_seconds, 0, float)):
            if value is None:
                continue
            if not _is_a(kind, value):
                raise GraphsubError(f"{name} takes {kind.__name__}, not {value!r}")
            if not value >= least:  # NaN included
                raise GraphsubError(f"{name} must be at least {least} (got {value})")
        object.__setattr__(self, "shape_profile", tuple(
            parse_profile(p) if isinstance(p, str) else p for p in self.shape_profile))
        if not all(isinstance(p, ProfileShape) for p in self.shape_profile):
            raise GraphsubError("shape_profile takes ProfileShape values or text such as "
                                "'batch=1,seq=128'")
        if self.split is not None and self.split < 2:
            raise GraphsubError(f"--split needs a part size of at least 2 operators (got "
                                f"{self.split})")
        self._check_target()

    def _check_target(self) -> None:
        """What the target must have for these settings: its options, vendor operators."""
        caps = self.target.capabilities if isinstance(self.target, Target) else \
            capabilities(self.target_name)
        for name, flag in (("cuda_graphs", "--cuda-graphs"), ("allow_tf32", "--tf32")):
            if getattr(self, name) is not None and name not in caps.options:
                having = _targets_where(lambda c: name in c.options)
                raise GraphsubError(f"{name} ({flag}) is an option of {having or 'no target'}, "
                                    f"not of {self.target_name}")
        if self.ort_fusions:
            if not caps.vendor_operators:
                having = _targets_where(lambda c: c.vendor_operators)
                raise GraphsubError(f"onnxruntime's fused operators (--ort-fusions) run only "
                                    f"on the onnxruntime targets that take them ({having}), "
                                    f"not on {self.target_name}")
            ort_fusions_module.check_available()

    @property
    def target_name(self) -> str:
        if isinstance(self.target, Target):
            return self.target.name
        return self.target or default_target_name()

    @property
    def target_options(self) -> dict[str, Any]:
        """What get_target takes besides the name (None: the target's default)."""
        return {"threads": self.threads, "cuda_graphs": self.cuda_graphs,
                "allow_tf32": self.allow_tf32}

    @classmethod
    def make(cls, **given: Any) -> Settings:
        """Settings from keywords: the fields above, and the chosen algorithm's options by
        name (alpha=1.1, k=3, c=1.4), merged with `options=`. A name that is neither is an
        error naming both lists."""
        names = {f.name for f in dataclasses.fields(cls) if f.init}
        options = dict(given.pop("options", None) or {})
        algorithm = given.get("algorithm", "backtracking")
        if algorithm not in ALGORITHMS:
            raise GraphsubError(f"unknown algorithm {algorithm!r}; use one of "
                                f"{', '.join(ALGORITHMS)}")
        known = ALGORITHMS[algorithm].option_names()
        for name in [n for n in given if n not in names]:
            value = given.pop(name)
            if value is None:  # not given
                continue
            if name in {o for a in ALGORITHMS.values() for o in a.option_names()} - set(known):
                raise GraphsubError(f"the {algorithm} search has no setting {name} (its "
                                    f"settings: {', '.join(known) or 'none'})")
            if name not in known:
                raise GraphsubError(
                    f"unknown setting {name!r}: not an option of the {algorithm} search "
                    f"({', '.join(known) or 'it has none'}), nor a setting of every run "
                    f"({', '.join(sorted(names))})")
            options[name] = value
        return cls(**given, options=options)

    def replace(self, **changes: Any) -> Settings:
        """A copy with `changes` (keywords of `make`, validated again). Another algorithm
        keeps the options it has too and drops the others."""
        algorithm = changes.get("algorithm", self.algorithm)
        known = set(ALGORITHMS[algorithm].option_names()) if algorithm in ALGORITHMS else set()
        options = {k: v for k, v in self.options.items() if k in known}
        options.update(changes.pop("options", None) or {})
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                  if f.init and f.name != "options"}
        return type(self).make(**{**fields, **changes, "options": options})

    def as_dict(self) -> dict[str, Any]:
        """What a report shows: every setting as plain data, the algorithm's options in full."""
        cost = self.cost if isinstance(self.cost, str) else type(self.cost).__name__
        return {"algorithm": self.algorithm, **dataclasses.asdict(self.search_options),
                "budget": self.budget, "budget_unit": ALGORITHMS[self.algorithm].budget_unit,
                "time_limit": self.time_limit, "measure_limit": self.measure_limit,
                "cost": cost, "objective": self.objective.describe(), "target": self.target_name,
                "threads": self.threads, "split": self.split, "executor": self.executor,
                "candidates": self.candidates, "fission": self.fission,
                "ort_fusions": self.ort_fusions, "peers": self.peers,
                "external_data": self.external_data,
                **({"shape_profile": [str(p) for p in self.shape_profile]}
                   if self.shape_profile else {})}


def parse_option(algorithm: str, text: str) -> tuple[str, Any]:
    """A "name=value" of the algorithm's options, the value in the type the option declares
    (int, float, bool, str, a comma-separated tuple, or "none" for an optional one)."""
    name, eq, raw = text.partition("=")
    name = name.strip().replace("-", "_")
    if algorithm not in ALGORITHMS:
        raise GraphsubError(f"unknown algorithm {algorithm!r}; use one of {', '.join(ALGORITHMS)}")
    search = ALGORITHMS[algorithm]
    if not eq or not name:
        raise GraphsubError(f"--option {text!r} is not NAME=VALUE (e.g. c=1.4); the "
                            f"{algorithm} search's options: {', '.join(search.option_names())}")
    hints = typing.get_type_hints(search.options)
    if name not in search.option_names():
        raise GraphsubError(f"the {algorithm} search has no option {name!r}; its options: "
                            f"{', '.join(search.option_names()) or 'none'}")
    try:
        return name, _convert(hints[name], raw.strip())
    except ValueError:
        raise GraphsubError(f"--option {text!r}: {raw.strip()!r} is not a value of "
                            f"{_type_name(hints[name])}") from None


def _convert(kind: Any, raw: str) -> Any:
    """`raw` as a value of the annotated type `kind` (ValueError if it is not one)."""
    args = typing.get_args(kind)
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        if raw.lower() == "none" and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _convert(inner, raw)
    if typing.get_origin(kind) is tuple:
        return tuple(_convert(args[0], part.strip()) for part in raw.split(",") if part.strip())
    if kind is bool:
        if raw.lower() in ("true", "yes", "on", "1"):
            return True
        if raw.lower() in ("false", "no", "off", "0"):
            return False
        raise ValueError(raw)
    if kind in (int, float, str):
        return kind(raw)
    raise ValueError(raw)


def _is_a(kind: Any, value: Any) -> bool:
    """Whether `value` is of the annotated type `kind` (an int is a float; a bool is not a
    number)."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        return any(_is_a(k, value) for k in typing.get_args(kind))
    if kind is type(None):
        return value is None
    if typing.get_origin(kind) is tuple:
        (inner, *_) = typing.get_args(kind)
        return isinstance(value, tuple) and all(_is_a(inner, v) for v in value)
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind) if isinstance(kind, type) else True


def _targets_where(has: Any) -> str:
    """The registered targets whose capabilities satisfy `has`, by name (a target whose
    packages are missing here and that declares no capabilities in the registry is left
    out)."""
    names = []
    for name in target_names():
        try:
            if has(capabilities(name)):
                names.append(name)
        except GraphsubError:
            continue
    return ", ".join(names)


def _type_name(kind: Any) -> str:
    return getattr(kind, "__name__", None) or str(kind).replace("typing.", "")


__all__ = ["COST_MODELS", "EXECUTORS", "Settings", "parse_option"]
