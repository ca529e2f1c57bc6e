"""Every setting of one optimization run, in one frozen object validated where it is made.

The command line, the Python API, the torch.compile backend and the fuzzer all make a
`Settings` and hand it to the stages; no stage checks a setting again, and a setting that is
out of range, or that the chosen algorithm or target does not have, is refused before any
work with a one-line message naming what is accepted.

    settings = Settings.make(algorithm="mcts", time_limit=30, c=1.4, seed=3)
    settings = Settings.make(algorithm="backtracking", options={"alpha": 1.1})

`make` sorts keywords into the settings below, the chosen algorithm's own options (its
frozen dataclass: `BacktrackingOptions`, `MctsOptions`, ...; graphsub.search.registry) and
the target's (torch-cuda's `cuda_graphs`: graphsub.targets' registry); `parse_option` and
`parse_target_option` parse "name=value" text (the command line's `--option` and
`--target-option`) into the type the algorithm or the target declares. The checks of an
algorithm's or a target's own options live with their declarations, not here.
"""

from __future__ import annotations

import dataclasses
import math
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from graphsub.targets import (Capabilities, Target, capabilities, default_target_name,
                               target_names)
from graphsub.targets import ort_fusions as ort_fusions_module
from graphsub.cost import CostModel
from graphsub.errors import GraphsubError
from graphsub.pipeline.objective import Objective
from graphsub.runtime.check_sizes import ProfileShape, parse_profile
from graphsub.search import ALGORITHMS
from graphsub.search.registry import convert, is_a, type_name

#: Cost models by name, and where --split runs parts.
COST_MODELS = ("measured", "analytic", "compiled")
EXECUTORS = ("process", "dask", "serial")

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
    #: The target's own options, as given (name -> value; torch-cuda's cuda_graphs and
    #: allow_tf32): one the target does not declare is refused.
    target_options: Mapping[str, Any] = field(default_factory=dict)
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
    #: onnxslim: graphsub.targets.peers) make candidates too, on targets that run ONNX.
    peers: bool = True
    #: Whether the written model keeps its weights in a data file beside it (None: where the
    #: input did, or where they are too large for one protobuf: onnx_io.external).
    external_data: bool | None = None
    #: Whether the report gets what its HTML page draws (rewrites replayed, operator times).
    evidence: bool = True
    #: The bindings of a model's size symbols that costs are measured at, with weights
    #: (runtime.check_sizes.ProfileShape, or "batch=1,seq=128[:weight]" text); empty: the
    #: default profile (runtime.check_sizes.default_profile) for a model with symbolic sizes.
    shape_profile: tuple[Any, ...] = ()
    search_options: Any = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise GraphsubError(f"unknown algorithm {self.algorithm!r}; use one of "
                                f"{', '.join(ALGORITHMS)}")
        object.__setattr__(self, "options", types.MappingProxyType(dict(self.options)))
        object.__setattr__(self, "search_options", ALGORITHMS[self.algorithm].make_options(
            OPTION_FLAGS, **self.options))
        object.__setattr__(self, "target_options",
                           types.MappingProxyType(dict(self.target_options)))
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
            if not is_a(kind, value):
                raise GraphsubError(f"{name} takes {kind.__name__}, not {value!r}")
            if not value >= least:  # NaN included
                raise GraphsubError(f"{name} must be at least {least} (got {value})")
        object.__setattr__(self, "shape_profile", tuple(
            parse_profile(p) if isinstance(p, str) else p for p in self.shape_profile))
        if not all(isinstance(p, ProfileShape) for p in self.shape_profile):
            raise GraphsubError("shape_profile takes ProfileShape values or text such as "
                                "'batch=1,seq=128'")
        if isinstance(self.objective, str):  # the API takes the command line's text
            object.__setattr__(self, "objective", Objective.parse(self.objective))
        if not isinstance(self.objective, Objective):
            raise GraphsubError(f"objective takes an Objective or text such as "
                                f"'latency,memory=0.3', not {self.objective!r}")
        if self.split is not None and self.split < 2:
            raise GraphsubError(f"--split needs a part size of at least 2 operators (got "
                                f"{self.split})")
        self._check_target()

    def _check_target(self) -> None:
        """What the target must have for these settings: its options, vendor operators."""
        caps = self.target.capabilities if isinstance(self.target, Target) else \
            capabilities(self.target_name)
        declared = {option.name: option for option in caps.options}
        for name, value in self.target_options.items():
            if name not in declared:
                having = _targets_where(lambda c: name in c.option_names)
                raise GraphsubError(f"{name} is an option of {having or 'no target'}, not of "
                                    f"{self.target_name} (its options: "
                                    f"{', '.join(declared) or 'none but threads'})")
            if value is not None and not is_a(declared[name].kind, value):
                raise GraphsubError(f"the {self.target_name} target's {name} takes "
                                    f"{type_name(declared[name].kind)}, not {value!r}")
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
        return self.target or default_target_name(self.fits)

    def fits(self, caps: Capabilities) -> bool:
        """Whether a target with `caps` takes these settings (the target options given,
        vendor operators for --ort-fusions): where no target is named, the machine's
        default is the first that does."""
        return set(self.target_options) <= set(caps.option_names) and \
            (caps.vendor_operators or not self.ort_fusions)

    @classmethod
    def make(cls, **given: Any) -> Settings:
        """Settings from keywords: the fields above, the chosen algorithm's options by name
        (alpha=1.1, k=3, c=1.4), merged with `options=`, and the targets' (cuda_graphs=False),
        merged with `target_options=`. A name that is none of these is an error naming
        them."""
        names = {f.name for f in dataclasses.fields(cls) if f.init}
        options = dict(given.pop("options", None) or {})
        target_options = dict(given.pop("target_options", None) or {})
        of_targets = _target_option_names()
        algorithm = given.get("algorithm", "backtracking")
        if algorithm not in ALGORITHMS:
            raise GraphsubError(f"unknown algorithm {algorithm!r}; use one of "
                                f"{', '.join(ALGORITHMS)}")
        known = ALGORITHMS[algorithm].option_names()
        for name in [n for n in given if n not in names]:
            value = given.pop(name)
            if value is None:  # not given
                continue
            if name in of_targets and name not in known:
                target_options[name] = value
                continue
            if name in {o for a in ALGORITHMS.values() for o in a.option_names()} - set(known):
                raise GraphsubError(f"the {algorithm} search has no setting {name} (its "
                                    f"settings: {', '.join(known) or 'none'})")
            if name not in known:
                raise GraphsubError(
                    f"unknown setting {name!r}: not an option of the {algorithm} search "
                    f"({', '.join(known) or 'it has none'}), nor an option of a target "
                    f"({', '.join(sorted(of_targets)) or 'none'}), nor a setting of every run "
                    f"({', '.join(sorted(names))})")
            options[name] = value
        return cls(**given, options=options, target_options=target_options)

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
                "threads": self.threads, **dict(self.target_options),
                "split": self.split, "executor": self.executor,
                "candidates": self.candidates, "fission": self.fission,
                "ort_fusions": self.ort_fusions, "peers": self.peers,
                "external_data": self.external_data,
                **({"shape_profile": [str(p) for p in self.shape_profile]}
                   if self.shape_profile else {})}


def parse_option(algorithm: str, text: str) -> tuple[str, Any]:
    """A "name=value" of the algorithm's options, the value in the type the option declares
    (int, float, bool, str, a comma-separated tuple, or "none" for an optional one)."""
    if algorithm not in ALGORITHMS:
        raise GraphsubError(f"unknown algorithm {algorithm!r}; use one of {', '.join(ALGORITHMS)}")
    return ALGORITHMS[algorithm].parse_option(text)


def parse_target_option(target: str | None, text: str) -> tuple[str, Any]:
    """A "name=value" of the target's options (None: this machine's default target), the
    value in the type the target declares."""
    name = target or default_target_name()
    declared = {option.name: option for option in capabilities(name).options}
    key, eq, raw = text.partition("=")
    key = key.strip().replace("-", "_")
    if not eq or not key:
        raise GraphsubError(f"--target-option {text!r} is not NAME=VALUE (e.g. "
                            "cuda_graphs=false)")
    if key not in declared:
        having = _targets_where(lambda c: key in c.option_names)
        raise GraphsubError(f"the {name} target has no option {key!r} (its options: "
                            f"{', '.join(declared) or 'none but --threads'})"
                            + (f"; {key} is an option of {having}" if having else ""))
    try:
        return key, convert(declared[key].kind, raw.strip())
    except ValueError:
        raise GraphsubError(f"--target-option {text!r}: {raw.strip()!r} is not a value of "
                            f"{type_name(declared[key].kind)}") from None


def _targets_where(has: Any) -> str:
    """The registered targets whose capabilities satisfy `has`, by name."""
    return ", ".join(name for name in target_names() if has(capabilities(name)))


def _target_option_names() -> set[str]:
    """The options some registered target declares."""
    return {name for target in target_names() for name in capabilities(target).option_names}


__all__ = ["COST_MODELS", "EXECUTORS", "Settings", "parse_option", "parse_target_option"]
