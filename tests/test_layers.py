"""graphsub's packages form layers (docs/architecture.md): a module imports only from its own
layer or the ones below, and no two packages import each other.

An import cycle hides behind an eager top-level `__init__` until someone imports a submodule
first (`import graphsub.egraph.mcts` once failed with a circular-import error), so the test
reads the imports themselves, those inside functions included: a function-level import is
a dependency that merely runs later. Imports under `if TYPE_CHECKING:` never run and only name
types for annotations, so they are left out.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

#: Bottom to top. A module belongs to the longest prefix listed here.
LAYERS: list[tuple[str, ...]] = [
    ("graphsub.errors", "graphsub.cache", "graphsub.lazy", "graphsub.tensors",
     "graphsub.executors", "graphsub.budget", "graphsub.progress"),
    ("graphsub.ops",),
    ("graphsub.ir",),
    ("graphsub.runtime",),
    ("graphsub.verdicts",),
    ("graphsub.onnx_io",),
    ("graphsub.rules",),
    ("graphsub.cost", "graphsub.proofs"),
    ("graphsub.targets",),
    ("graphsub.search", "graphsub.generate", "graphsub.fission"),
    ("graphsub.egraph",),
    ("graphsub.selection", "graphsub.report", "graphsub.zoo", "graphsub.loaded"),
    ("graphsub.pipeline",),
    ("graphsub.optimizer",),
    ("graphsub", "graphsub.compare", "graphsub.fuzz"),
    ("graphsub.frontends", "graphsub.cli"),
]


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _unit(module: str) -> str:
    """The entry of LAYERS a module belongs to."""
    units = [u for layer in LAYERS for u in layer if module == u or module.startswith(u + ".")]
    assert units, f"{module} is in no layer: add it to LAYERS and docs/architecture.md"
    return max(units, key=len)


def _layer(unit: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if unit in layer)


def _is_module(name: str) -> bool:
    path = SRC.joinpath(*name.split("."))
    return path.is_dir() or path.with_suffix(".py").exists()


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _graphsub_imports(path: Path) -> list[tuple[str, int]]:
    """(imported graphsub module, line) for every import that can run."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.extend((a.name, child.lineno) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[:len(package.split(".")) - child.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                # `from graphsub.x import y` imports graphsub.x.y when y is a module
                found.extend((f"{base}.{a.name}" if _is_module(f"{base}.{a.name}") else base,
                             child.lineno) for a in child.names)
            visit(child)

    visit(ast.parse(path.read_text(), filename=str(path)))
    return [(m, line) for m, line in found if m == "graphsub" or m.startswith("graphsub.")]


def _dependencies() -> nx.DiGraph:
    """Unit -> unit, each edge with the imports that make it."""
    graph = nx.DiGraph()
    for path in sorted((SRC / "graphsub").rglob("*.py")):
        source = _unit(_module_name(path))
        graph.add_node(source)
        for target, line in _graphsub_imports(path):
            dest = _unit(target)
            if dest != source:
                if not graph.has_edge(source, dest):
                    graph.add_edge(source, dest, where=[])
                graph.edges[source, dest]["where"].append(
                    f"{path.relative_to(SRC)}:{line} imports {target}")
    return graph


def test_every_import_goes_down_the_layers():
    upward = [f"{a} (layer {_layer(a)}) -> {b} (layer {_layer(b)}): " + "; ".join(where[:3])
              for a, b, where in _dependencies().edges(data="where") if _layer(b) > _layer(a)]
    assert not upward, "imports against the layers:\n" + "\n".join(upward)


def test_no_two_packages_import_each_other():
    graph = _dependencies()
    cycles = [" -> ".join(c + [c[0]]) + ": " + "; ".join(
        graph.edges[c[i], c[(i + 1) % len(c)]]["where"][0] for i in range(len(c)))
        for c in nx.simple_cycles(graph)]
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_no_module_imports_itself_through_others():
    """Within packages too: the module import graph has no cycle (the prover and its lemmas
    once imported each other, one of them from inside a function)."""
    graph = nx.DiGraph()
    for path in sorted((SRC / "graphsub").rglob("*.py")):
        module = _module_name(path)
        graph.add_node(module)
        graph.add_edges_from((module, target) for target, _ in _graphsub_imports(path)
                             if target != module)
    cycle = [] if nx.is_directed_acyclic_graph(graph) else nx.find_cycle(graph)
    assert not cycle, " -> ".join(a for a, _ in cycle)


def in_a_fresh_interpreter(script: str) -> str:
    """What `script` prints, run by a new Python in src/ (nothing imported before it)."""
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=True, cwd=SRC).stdout


@pytest.mark.slow  # one interpreter per module: about a minute
def test_every_module_imports_first_in_a_fresh_interpreter():
    """Each module imported before any other graphsub module: a cycle that an eager package
    `__init__` hides shows up as an ImportError here (an optional package that is not
    installed, torch on a plain install, is not one)."""
    modules = sorted(_module_name(p) for p in (SRC / "graphsub").rglob("*.py")
                     if "__main__" not in p.name)
    script = (
        "import importlib, sys\n"
        "failed = []\n"
        f"for name in {modules!r}:\n"
        "    for m in [m for m in sys.modules if m == 'graphsub' or m.startswith('graphsub.')]:\n"
        "        del sys.modules[m]\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ModuleNotFoundError as exc:\n"
        "        if exc.name is None or exc.name.split('.')[0] == 'graphsub':\n"
        "            failed.append(f'{name}: {exc}')\n"
        "    except ImportError as exc:\n"
        "        failed.append(f'{name}: {exc}')\n"
        "print('\\n'.join(failed))\n")
    out = in_a_fresh_interpreter(script)
    assert not out.strip(), out


def test_importing_the_tensor_types_stays_light():
    """The bottom layer imports nothing above it: not the operators, not the IR, not
    networkx."""
    script = ("import sys, graphsub.tensors.types\n"
              "print(sorted(m for m in sys.modules if m.startswith(('graphsub', 'networkx'))))")
    loaded = eval(in_a_fresh_interpreter(script))
    assert set(loaded) <= {"graphsub", "graphsub.lazy", "graphsub.errors", "graphsub.tensors",
                           "graphsub.tensors.types", "graphsub.tensors.symbolic"}, \
        loaded


def test_subpackages_read_as_attributes_after_importing_the_package():
    """`import graphsub` then `graphsub.zoo.build(...)`, as with any package, though the
    package imports nothing eagerly; a name that is neither export nor subpackage is still an
    AttributeError."""
    script = ("import graphsub\n"
              "print(len(graphsub.zoo.build('squeezenet')) > 0, graphsub.rules.__name__)\n"
              "try:\n"
              "    graphsub.no_such_thing\n"
              "except AttributeError as exc:\n"
              "    print(exc)\n")
    out = in_a_fresh_interpreter(script).splitlines()
    assert out == ["True graphsub.rules", "module 'graphsub' has no attribute 'no_such_thing'"]


def test_opaque_nodes_are_evaluated_once_the_runtime_is_imported():
    """The operators sit below the runtime: an opaque node's evaluator (onnxruntime) is
    registered by graphsub.runtime, and without it evaluation says where to go."""
    script = ("from graphsub.ops import get_op\n"
              "try:\n"
              "    get_op('opaque').evaluate({'op_type': 'Gather'}, [])\n"
              "except Exception as exc:\n"
              "    print(type(exc).__name__, exc)\n"
              "import graphsub.runtime.reference\n"
              "from graphsub.ops import opaque\n"
              "print(opaque._evaluator.__module__)\n")
    out = in_a_fresh_interpreter(script).splitlines()
    assert out[0].startswith("GraphsubError an opaque Gather node is run by onnxruntime"), out
    assert out[1] == "graphsub.runtime.opaque"


def _package(module: str) -> str:
    """The top-level package (or module) of graphsub a module belongs to."""
    return ".".join(module.split(".")[:2])


def test_no_two_top_level_packages_import_each_other():
    """Layers are finer than packages (a package's bottom modules may sit in a lower layer),
    so the layer test alone let `ir` and `ops` import each other: ops imported ir's types
    while ir's graph imported ops. Whole packages must not form a cycle either."""
    graph = nx.DiGraph()
    for path in sorted((SRC / "graphsub").rglob("*.py")):
        source = _package(_module_name(path))
        for target, line in _graphsub_imports(path):
            dest = _package(target)
            if dest not in (source, "graphsub"):
                graph.add_edge(source, dest, where=f"{path.relative_to(SRC)}:{line}")
    cycles = [" -> ".join(c + [c[0]]) + ": " + "; ".join(
        graph.edges[c[i], c[(i + 1) % len(c)]]["where"] for i in range(len(c)))
        for c in nx.simple_cycles(graph)]
    assert not cycles, "package cycles:\n" + "\n".join(cycles[:10])
