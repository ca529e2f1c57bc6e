"""What every `graphsub` command shares: the app, the consoles, --json, and one-line errors.
The commands live in graphsub.cli (optimize, compare, ...) and graphsub.cli_generate
(generate, verify, axioms); both register on this app."""

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

JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]


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


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
