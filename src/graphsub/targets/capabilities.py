"""What a target is, as its registration declares it (graphsub.targets): read by the
settings, the stages and the command line's help without importing the target's module (or
anything heavy: this module needs dataclasses alone)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from graphsub.errors import GraphsubError


class TargetUnavailableError(GraphsubError):
    """The target the user named cannot run on this machine (the message says why)."""


@dataclass(frozen=True)
class TargetOption:
    """An option a target takes beyond `threads`: its type, its default and what it does
    (the command line's `--target-option NAME=VALUE` and its help read these)."""

    name: str
    kind: type
    default: Any
    help: str


@dataclass(frozen=True)
class Capabilities:
    """What a target is, declared once by the target: the stages read these, never its name.

    A new onnxruntime provider (TensorRT, OpenVINO) declares its own: whether onnxruntime's
    com.microsoft operators may be written for it, and that its outputs are verified on it
    (graphsub's reference runs onnxruntime's CPU provider, which is not the provider the
    model will run on)."""

    #: What the target runs: "onnx" (the ONNX file graphsub writes, as a user's runtime loads
    #: it) or "torch" (a program graphsub builds from the graph).
    runs: str
    #: Whether candidates may use the runtime's own fused operators (onnxruntime's
    #: com.microsoft domain, `--ort-fusions`): the output then runs only there.
    vendor_operators: bool = False
    #: Whether the target is the runtime graphsub verifies with (onnxruntime's CPU provider,
    #: all graph optimizations): otherwise the chosen model is also checked on the target.
    is_reference: bool = False
    #: Options the target takes beyond `threads` (torch-cuda: cuda_graphs, allow_tf32).
    options: tuple[TargetOption, ...] = ()

    @property
    def option_names(self) -> tuple[str, ...]:
        return tuple(option.name for option in self.options)

    def __post_init__(self) -> None:
        if self.runs not in ("onnx", "torch"):
            raise ValueError(f"a target runs onnx or torch, not {self.runs!r}")


__all__ = ["Capabilities", "TargetOption", "TargetUnavailableError"]
