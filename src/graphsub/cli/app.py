"""What every `graphsub` command shares: the app, the consoles, --json, one-line errors and
--input-shape (the model a command names is opened by graphsub.loaded, as in the API). The
commands live in graphsub.cli.commands (optimize, compare, ...), graphsub.cli.generate (generate,
verify, axioms) and graphsub.cli.explain (explain); all register on this app."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from graphsub.errors import GraphsubError

app = typer.Typer(help="graphsub: a tensor-graph superoptimizer for ONNX models.",
                  no_args_is_help=True, add_completion=False,
                  context_settings={"help_option_names": ["-h", "--help"]})
out = Console()
err = Console(stderr=True)

JsonOpt = Annotated[bool, typer.Option("--json", metavar="", help="Print machine-readable JSON.")]


def handle_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Print input errors as one line (no traceback) and exit with status 2; an interrupt
    that reaches here (a second Ctrl-C, or one outside a search) exits with status 130,
    as shells expect, with nothing written."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except GraphsubError as exc:
            err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except KeyboardInterrupt:
            err.print("[bold red]interrupted:[/] stopped; nothing was written", highlight=False)
            raise typer.Exit(130) from None

    return wrapper


def main() -> None:
    """The `graphsub` command: the app, with a value of the wrong kind, an unknown option or a
    missing argument told in one line and exit status 2, like every other input error (click
    would draw a box of usage and hints)."""
    # click's UsageError (typer vendors click in recent versions: its BadParameter's base)
    usage_error = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")
    try:
        code = app(standalone_mode=False)
    # (a class found as the app runs, typer's vendored click's or click's: mypy takes no
    # variable for an exception class)
    except usage_error as exc:  # type: ignore[misc]
        where = exc.ctx.command_path if exc.ctx is not None else "graphsub"
        err.print(f"[bold red]error:[/] {escape(exc.format_message())} (see {escape(where)} "
                  "--help)", highlight=False, soft_wrap=True)
        sys.exit(2)
    except typer.Abort:
        err.print("[bold red]interrupted:[/] stopped; nothing was written", highlight=False)
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def parse_input_shapes(items: list[str] | None) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {}
    for item in items or []:
        name, eq, dims = item.rpartition("=")
        try:
            if not eq or not name:
                raise ValueError
            shape = tuple(int(d) for d in dims.lower().replace(",", "x").split("x") if d != "")
        except ValueError:
            raise GraphsubError(f"--input-shape {item!r} is not NAME=DIMS (e.g. "
                                "x=1x3x224x224)") from None
        if any(d <= 0 for d in shape):
            raise GraphsubError(f"--input-shape {item!r}: every dimension must be at least 1 "
                                "(a tensor with a zero dimension holds nothing to optimize)")
        shapes[name] = shape
    return shapes
