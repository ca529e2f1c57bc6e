"""Execution targets: where the optimized model will run, and so what graphsub measures.

| target | runs the model with | default when |
|---|---|---|
| `ort-cpu` | onnxruntime's CPU provider, all graph optimizations | there is no GPU |
| `ort-cuda` | onnxruntime's CUDA provider (onnxruntime-gpu) | never (name it) |
| `torch-cpu` | graphsub's torch backend on the CPU | never (name it) |
| `torch-cuda` | graphsub's torch backend on the GPU, CUDA-graph replays | torch sees a GPU |

    from graphsub.backends import get_target
    target = get_target("torch-cpu")
    runnable = target.prepare(graph)
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from typing import Any

from graphsub.backends.base import DeviceInfo, Target, TargetUnavailableError
from graphsub.errors import GraphsubError

#: Target name -> "module:class", imported only when the target is used (torch is optional).
_TARGETS = {
    "ort-cpu": "graphsub.backends.ort:OrtCpuTarget",
    "ort-cuda": "graphsub.backends.ort:OrtCudaTarget",
    "torch-cpu": "graphsub.backends.torch.target:TorchCpuTarget",
    "torch-cuda": "graphsub.backends.torch.target:TorchCudaTarget",
}


#: What each target is, known without importing it.
_DESCRIPTIONS = {
    "ort-cpu": "onnxruntime, CPU provider, all graph optimizations (the ONNX file as written)",
    "ort-cuda": "onnxruntime, CUDA provider (needs onnxruntime-gpu and an NVIDIA GPU)",
    "torch-cpu": "graphsub's torch backend on the CPU (PyTorch's CPU kernels, op by op)",
    "torch-cuda": "graphsub's torch backend on an NVIDIA GPU (cuDNN/cuBLAS kernels, "
                  "CUDA-graph replays)",
}


def target_names() -> list[str]:
    return list(_TARGETS)


def describe(name: str) -> str:
    return _DESCRIPTIONS[name]


def _target_class(name: str) -> type[Target]:
    if name not in _TARGETS:
        raise GraphsubError(f"unknown target {name!r}; known targets: {', '.join(_TARGETS)} "
                            "(graphsub info --targets lists the ones this machine has)")
    if name.startswith("torch-") and importlib.util.find_spec("torch") is None:
        raise TargetUnavailableError(
            f"target {name} needs PyTorch, which is not installed: pip install 'graphsub[torch]'")
    module, _, cls = _TARGETS[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def unavailable_reason(name: str) -> str | None:
    """None when the target can run on this machine, else why not (and what to do)."""
    try:
        return _target_class(name).unavailable_reason()
    except TargetUnavailableError as exc:
        return str(exc).split(": ", 1)[-1]


def torch_sees_gpu() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


def default_target_name() -> str:
    """torch-cuda when torch sees a GPU (where graph substitutions pay most), else ort-cpu."""
    return "torch-cuda" if torch_sees_gpu() else "ort-cpu"


def get_target(name: str | None = None, **options: Any) -> Target:
    """A target by name (None: the default for this machine). Options go to the target:
    `threads` for every target, `cuda_graphs` and `allow_tf32` for torch-cuda."""
    name = name or default_target_name()
    cls = _target_class(name)
    reason = cls.unavailable_reason()
    if reason is not None:
        raise TargetUnavailableError(f"target {name} is not available here: {reason}")
    return cls(**{k: v for k, v in options.items() if v is not None})


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
        out.append(TargetStatus(name, _DESCRIPTIONS[name], reason is None, reason or "",
                                name == default))
    return out


__all__ = ["DeviceInfo", "Target", "TargetStatus", "TargetUnavailableError",
           "default_target_name", "get_target", "target_names", "target_statuses",
           "torch_sees_gpu", "unavailable_reason"]
