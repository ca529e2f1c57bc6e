"""Package attributes imported on first use (PEP 562), so that importing one submodule does
not import everything its package re-exports: importing graphsub.tensors.types once loaded sixty
modules and networkx."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, namespace: dict[str, Any], exports: Mapping[str, str]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The `__getattr__` and `__dir__` of a package whose public names (`exports`: name ->
    the module defining it) are imported when first read, then kept in `namespace`."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            # A subpackage reads like any other attribute (`graphsub.zoo.build(...)` after
            # `import graphsub`), imported on first use as the exports are.
            if not name.startswith("_") and importlib.util.find_spec(f"{package}.{name}"):
                return importlib.import_module(f"{package}.{name}")
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name]), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__
