"""Every third-party module graphsub imports is declared in pyproject.toml.

A dependency that some other package happens to pull in (networkx came with torch) passes every
test on the full install and crashes `make demo` on a plain one; this test reads the imports
themselves, so an undeclared one fails here whatever is installed.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "graphsub"


def _requirement_name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _declared() -> tuple[set[str], set[str]]:
    """Distribution names: the required ones, and those of any extra."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    required = {_requirement_name(r) for r in project["dependencies"]}
    optional = {_requirement_name(r) for reqs in project["optional-dependencies"].values()
                for r in reqs}
    return required, optional


def _imports(path: Path) -> dict[str, bool]:
    """Top-level module names a file imports, each with whether an import of it sits at module
    level (needed by anything that imports the file) rather than inside a function."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: dict[str, bool] = {}

    def visit(node: ast.AST, at_top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = at_top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            names: list[str] = []
            if isinstance(child, ast.Import):
                names = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                names = [child.module]
            for name in names:
                top = name.split(".")[0]
                found[top] = found.get(top, False) or inside
            visit(child, inside)

    visit(tree, True)
    return found


def _third_party_imports() -> dict[str, list[str]]:
    """Imported module name -> the files importing it, for modules outside the standard
    library and graphsub."""
    out: dict[str, list[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        for name in _imports(path):
            if name in sys.stdlib_module_names or name in ("graphsub", "__future__"):
                continue
            out.setdefault(name, []).append(str(path.relative_to(ROOT)))
    return out


#: Modules that ship inside another declared distribution's wheel under a name of their own.
PROVIDED_BY = {"google": "protobuf", "z3": "z3-solver", "yaml": "pyyaml", "functorch": "torch"}


def _distribution(module: str) -> str:
    if module in PROVIDED_BY:
        return PROVIDED_BY[module]
    installed = packages_distributions().get(module)
    return (installed[0] if installed else module).lower().replace("_", "-")


def test_every_imported_package_is_declared() -> None:
    required, optional = _declared()
    undeclared = {m: files for m, files in _third_party_imports().items()
                  if _distribution(m) not in required | optional}
    assert not undeclared, f"imported but not declared in pyproject.toml: {undeclared}"


#: Packages of optional extras, and the graphsub packages that may import them at module level
#: (they are only imported once the extra is known to be installed).
OPTIONAL_HOMES = {"torch": ("targets/torch/", "frontends/"),
                  "distributed": ("executors.py",)}


def test_optional_packages_are_imported_only_where_they_are_needed() -> None:
    """An extra's package imported at module level anywhere else would make the plain install
    crash on import."""
    required, _ = _declared()
    problems = []
    for path in sorted(SRC.rglob("*.py")):
        rel = str(path.relative_to(SRC))
        for module, at_top in _imports(path).items():
            if (at_top and module not in sys.stdlib_module_names
                    and module not in ("graphsub", "__future__")
                    and _distribution(module) not in required
                    and not rel.startswith(OPTIONAL_HOMES.get(module, ("<nowhere>",)))):
                problems.append(f"{rel} imports {module} at module level")
    assert not problems, "; ".join(problems)
