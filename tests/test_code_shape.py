"""What the code promises about its own shape: settings travel in one object, so no function
(but the command line's, which typer reads option by option) takes more than 12 parameters.
(That no stage reads a target's name is tests/targets/test_capabilities.py's.)"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "graphsub"
MOST_PARAMETERS = 12


def _is_typer_command(fn: ast.FunctionDef) -> bool:
    for deco in fn.decorator_list:
        call = deco.func if isinstance(deco, ast.Call) else deco
        if isinstance(call, ast.Attribute) and call.attr in ("command", "callback"):
            return True
    return False


def test_no_function_but_a_command_takes_more_than_twelve_parameters():
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                    and not _is_typer_command(node):
                a = node.args
                names = [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs
                         if p.arg not in ("self", "cls")]
                if len(names) > MOST_PARAMETERS:
                    found.append(f"{path.relative_to(SRC)}:{node.lineno} {node.name} "
                                 f"({len(names)})")
    assert not found, found
