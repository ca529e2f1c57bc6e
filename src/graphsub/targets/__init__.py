"""Execution targets: where the optimized model will run, and so what graphsub measures.

| target | runs the model with | default when |
|---|---|---|
| `ort-cpu` | onnxruntime's CPU provider, all graph optimizations | there is no GPU |
| `ort-cuda` | onnxruntime's CUDA provider (onnxruntime-gpu) | never (name it) |
| `torch-cpu` | graphsub's torch backend on the CPU | never (name it) |
| `torch-cuda` | graphsub's torch backend on the GPU, CUDA-graph replays | torch sees a GPU |

    from graphsub.targets import get_target
    target = get_target("torch-cpu")
    runnable = target.prepare(graph)
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from typing import TYPE_CHECKING

from graphsub.targets.capabilities import Capabilities, TargetOption, TargetUnavailableError
from graphsub.errors import GraphsubError
from graphsub.lazy import lazy_exports

if TYPE_CHECKING:
    from graphsub.targets.base import DeviceInfo, Target
    from graphsub.ir.graph import Graph

# The registry below needs only the declarations: what a Target is (its base class, which
# imports the cost models) is imported when first read, so that the command line's help
# lists the targets and their options at no cost.
__getattr__, __dir__ = lazy_exports(__name__, globals(), {
    "DeviceInfo": "graphsub.targets.base", "Target": "graphsub.targets.base"})


@dataclass(frozen=True)
class TargetEntry:
    """A registered target: where its class lives (imported only when the target is used,
    since torch is optional), what it is, and the packages it needs before that import can
    work."""

    factory: str                 #: "module:Class"
    #: What the target is, declared here so that settings naming its options are checked,
    #: and the command line's help lists them, without importing its module (onnxruntime's
    #: import takes most of a second, torch's seconds, and either may be missing); its class
    #: reads them back with `declared_capabilities`.
    capabilities: Capabilities
    requires: tuple[str, ...] = ()
    #: How to install what `requires` names.
    install: str = ""
    #: A check that needs no import (None: it can run here), so that deciding the default
    #: target on a machine without a GPU does not import torch (seconds at every start).
    precheck: Callable[[], str | None] | None = None

    def load(self, name: str) -> type[Target]:
        missing = [m for m in self.requires if importlib.util.find_spec(m) is None]
        if missing:
            raise TargetUnavailableError(f"target {name} needs {', '.join(missing)}, which is "
                                         f"not installed: {self.install}")
        module, _, cls = self.factory.partition(":")
        target: type[Target] = getattr(importlib.import_module(module), cls)
        return target


_TORCH_INSTALL = "pip install 'graphsub[torch]' (PyTorch)"
#: Every target by name: the one registry (register_target adds to it).
_TARGETS: dict[str, TargetEntry] = {
    "ort-cpu": TargetEntry("graphsub.targets.ort:OrtCpuTarget", Capabilities(
        runs="onnx", vendor_operators=True, is_reference=True)),
    "ort-cuda": TargetEntry("graphsub.targets.ort:OrtCudaTarget", Capabilities(
        runs="onnx", vendor_operators=True)),
    "torch-cpu": TargetEntry("graphsub.targets.torch.target:TorchCpuTarget",
                             Capabilities(runs="torch"), ("torch",), _TORCH_INSTALL),
    "torch-cuda": TargetEntry(
        "graphsub.targets.torch.target:TorchCudaTarget", Capabilities(runs="torch", options=(
            TargetOption("cuda_graphs", bool, True, "run CUDA-graph replays (false: eager "
                         "launches)"),
            TargetOption("allow_tf32", bool, False, "allow TF32 matmuls and convolutions "
                         "(false: fp32 results)"))),
        ("torch",), _TORCH_INSTALL, lambda: None if nvidia_driver_present() else
        "no NVIDIA GPU driver on this machine; run on one with an NVIDIA GPU, or use "
        "--target torch-cpu"),
}
#: The default target is the first of these this machine has: a GPU through torch, where
#: graph substitutions pay most, else onnxruntime on the CPU.
DEFAULT_ORDER = ("torch-cuda", "ort-cpu")


def nvidia_driver_present() -> bool:
    """Whether an NVIDIA driver is loaded (its device files, or WSL's GPU device)."""
    return any(os.path.exists(p) for p in ("/dev/nvidiactl", "/proc/driver/nvidia/version",
                                           "/dev/dxg"))


def register_target(name: str, factory: str, capabilities: Capabilities,
                    requires: tuple[str, ...] = (), install: str = "") -> None:
    """Add a target (a `Target` subclass at "module:Class", whose `name` is `name`, whose
    class reads its `capabilities` back with `declared_capabilities(name)`) that needs the
    packages `requires` (installed as `install` says)."""
    _TARGETS[name] = TargetEntry(factory, capabilities, requires, install)


def target_names() -> list[str]:
    return list(_TARGETS)


def target_class(name: str) -> type[Target]:
    """The class of a target by name (its module imported); TargetUnavailableError when a
    package it needs is missing."""
    if name not in _TARGETS:
        raise GraphsubError(f"unknown target {name!r}; known targets: {', '.join(_TARGETS)} "
                            "(graphsub info --targets lists the ones this machine has)")
    return _TARGETS[name].load(name)


def declared_capabilities(name: str) -> Capabilities:
    """The capabilities the registry declares for a target (its class's)."""
    return _TARGETS[name].capabilities


def capabilities(name: str) -> Capabilities:
    """What a target is, by name, without starting it or importing its module."""
    if name not in _TARGETS:
        raise GraphsubError(f"unknown target {name!r}; known targets: {', '.join(_TARGETS)} "
                            "(graphsub info --targets lists the ones this machine has)")
    return _TARGETS[name].capabilities


def unavailable_reason(name: str) -> str | None:
    """None when the target can run on this machine, else why not (and what to do)."""
    entry = _TARGETS.get(name)
    reason = entry.precheck() if entry is not None and entry.precheck is not None else None
    if reason is not None:
        return reason
    try:
        return target_class(name).unavailable_reason()
    except TargetUnavailableError as exc:
        return str(exc).split(": ", 1)[-1]


def default_target_name(fits: Callable[[Capabilities], bool] = lambda caps: True) -> str:
    """The first target of DEFAULT_ORDER this machine has and whose capabilities `fits`
    (what a run's settings ask of its target); the last of DEFAULT_ORDER where none is."""
    return next(_defaults(fits), DEFAULT_ORDER[-1])


def automatic_target(graph: Graph, fits: Callable[[Capabilities], bool] = lambda caps: True,
                     **options: Any) -> tuple[Target, str]:
    """The target of a run whose user named none: the first of DEFAULT_ORDER this machine
    has, that `fits` and that can run `graph` (Target.cannot_run), made with `options`;
    and why the targets before it were passed over ("" where none was). Where none can
    run the graph, the default, whose error then names the operator."""
    passed: list[str] = []
    first: Target | None = None
    for name in _defaults(fits):
        target = get_target(name, **options)
        reason = target.cannot_run(graph)
        if reason is None:
            return target, "; ".join(passed)
        passed.append(f"{name}: {reason}")
        first = first or target
    return first or get_target(default_target_name(fits), **options), ""


def _defaults(fits: Callable[[Capabilities], bool]) -> Iterator[str]:
    """The targets of DEFAULT_ORDER this machine has and that `fits`, in order."""
    return (name for name in DEFAULT_ORDER
            if fits(capabilities(name)) and unavailable_reason(name) is None)


def get_target(name: str | None = None, **options: Any) -> Target:
    """A target by name (None: the default for this machine). Options go to the target:
    `threads` for every target, and those its capabilities name (torch-cuda: `cuda_graphs`,
    `allow_tf32`); an option the target does not take is an error, None means its default."""
    name = name or default_target_name()
    cls = target_class(name)
    reason = cls.unavailable_reason()
    if reason is not None:
        raise TargetUnavailableError(f"target {name} is not available here: {reason}")
    given = {k: v for k, v in options.items() if v is not None}
    names = ("threads", *cls.capabilities.option_names)
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise GraphsubError(f"target {name} has no option {', '.join(unknown)} (its options: "
                            f"{', '.join(names)})")
    return cls(**given)


@dataclass(frozen=True)
class TargetStatus:
    name: str
    description: str
    available: bool
    reason: str
    default: bool


def target_statuses() -> list[TargetStatus]:
    """Every target, whether this machine has it, and why not."""
    default = default_target_name()
    out = []
    for name in _TARGETS:
        reason = unavailable_reason(name)
        try:
            description = target_class(name).description
        except TargetUnavailableError:
            description = f"needs {', '.join(_TARGETS[name].requires)}"
        out.append(TargetStatus(name, description, reason is None, reason or "",
                                name == default))
    return out


__all__ = ["Capabilities", "DeviceInfo", "Target", "TargetOption", "TargetStatus",
           "TargetUnavailableError",
           "automatic_target", "capabilities", "declared_capabilities", "default_target_name",
           "get_target",
           "register_target", "target_class", "target_names", "target_statuses",
           "unavailable_reason"]
