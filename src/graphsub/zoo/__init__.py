"""The model zoo: the benchmark models of the papers, built with the graph builder.

Models are named, optionally with parameters: `resnet_blocks` or `resnet_blocks:n=8`.
Weights are random from a seed (default 0), scaled so activations stay near unit variance.

    from graphsub import zoo
    graph = zoo.build("bert")
    graph = zoo.build("inception_e_blocks:n=4")
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from graphsub.errors import UnknownModelError
from graphsub.ir.graph import Graph

Builder = Callable[..., Graph]


@dataclass(frozen=True)
class ZooModel:
    name: str
    build: Builder
    description: str
    source: str  # which paper or package the model comes from
    params: dict[str, Any] = field(default_factory=dict)


_MODELS: dict[str, ZooModel] = {}
_MODULES = ("graphsub.zoo.cnn", "graphsub.zoo.inception", "graphsub.zoo.nasnet",
            "graphsub.zoo.sequence", "graphsub.zoo.decoder", "graphsub.zoo.light",
            "graphsub.zoo.fission")
_loaded = False


def register(name: str, description: str, source: str, **params: Any) -> Callable[[Builder], Builder]:
    """Register a model builder. `params` are its tunable keyword arguments and defaults;
    every builder also takes `seed`."""

    def deco(fn: Builder) -> Builder:
        if name in _MODELS:
            raise ValueError(f"zoo model {name!r} registered twice")
        _MODELS[name] = ZooModel(name, fn, description, source, params)
        return fn

    return deco


def _load_all() -> None:
    global _loaded
    if not _loaded:
        for mod in _MODULES:
            importlib.import_module(mod)
        _loaded = True


def models() -> list[ZooModel]:
    _load_all()
    return sorted(_MODELS.values(), key=lambda m: m.name)


def names() -> list[str]:
    return [m.name for m in models()]


def parse_spec(spec: str) -> tuple[ZooModel, dict[str, Any]]:
    """`name` or `name:key=value,key=value` -> (model, keyword arguments)."""
    _load_all()
    name, _, rest = spec.partition(":")
    model = _MODELS.get(name)
    if model is None:
        raise UnknownModelError(f"{spec!r} is not a file or a zoo model; zoo models: "
                                f"{', '.join(names())}")
    kwargs: dict[str, Any] = {}
    for item in filter(None, rest.split(",")):
        key, eq, raw = item.partition("=")
        if not eq or (key not in model.params and key != "seed"):
            known = ", ".join(list(model.params) + ["seed"])
            raise UnknownModelError(f"{name}: bad parameter {item!r}; parameters: {known}")
        default = model.params.get(key, 0)
        kwargs[key] = type(default)(raw) if not isinstance(default, bool) else raw.lower() in ("1", "true", "yes")
    return model, kwargs


def build(spec: str, seed: int = 0) -> Graph:
    """Build a zoo model from its spec."""
    model, kwargs = parse_spec(spec)
    kwargs.setdefault("seed", seed)
    return model.build(**kwargs)
