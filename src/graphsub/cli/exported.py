"""`graphsub optimize model.pt2 -o fast.pt2`: a saved torch.export program optimized
(graphsub.frontends.exported), written as a program (`torch.export.save`) or, with
`--package`, as the AOTInductor package compiled from it."""

from __future__ import annotations

import io
import logging
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from graphsub.cli.app import emit_json, err, out
from graphsub.errors import GraphsubError
from graphsub.onnx_io.files import write_atomic

#: The suffix of a saved ExportedProgram (and of an AOTInductor package).
SUFFIX = ".pt2"


def is_exported(model: str) -> bool:
    return model.endswith(SUFFIX)


def load_program(path: Path) -> Any:
    """The ExportedProgram saved at `path`, or a GraphsubError saying what the file is."""
    if not path.is_file():
        raise GraphsubError(f"{path} does not exist")
    try:
        import torch
    except ImportError:
        raise GraphsubError("reading a .pt2 program needs torch: pip install torch==2.13.0") \
            from None
    quiet = logging.getLogger("torch.export")  # it logs a traceback before trying old formats
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        return torch.export.load(str(path))
    except Exception as exc:  # noqa: BLE001 - torch's loaders raise many kinds
        raise GraphsubError(
            f"{path} is not a program saved by torch.export.save ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:160] if str(exc) else ''}); an AOTInductor package "
            f"cannot be optimized: give the ExportedProgram it was compiled from") from None
    finally:
        quiet.setLevel(level)


def optimize_program_file(model: str, output: Path, *, time_limit: float, target: str | None,
                          rules: list[str], package: bool, report: Path | None,
                          as_json: bool, command: list[str]) -> None:
    """Load, optimize, write atomically (never a partial file), report."""
    import torch

    from graphsub.frontends.exported import last_report, optimize_exported
    from graphsub.report.files import save_report
    from graphsub.report.optimize import versions

    with err.status(f"loading {model}..."):
        program = load_program(Path(model))
    with err.status(f"optimizing {model} (search up to {time_limit:g} s, then AOTInductor "
                    "compiles both programs and races them)..."):
        optimized = optimize_exported(program, time_limit=time_limit, target=target,
                                      rules=rules, package=output if package else None)
    rep = last_report()
    assert rep is not None  # optimize_exported always leaves one
    if not package:
        with err.status(f"writing {output}..."):
            written = io.BytesIO()
            torch.export.save(optimized, written)
            write_atomic(written.getvalue(), output)  # never half a file
    data = {"program": model, "output": str(output),
            "written": "AOTInductor package" if package else "ExportedProgram",
            **rep.as_dict(), "command": command, "versions": versions()}
    if report is not None:
        with err.status("writing the report..."):
            save_report(data, report)
    if as_json:
        emit_json(data)
        return
    table = Table(title=f"graphsub optimize: {escape(model)} on {rep.target}",
                  title_justify="left")
    table.add_column("")
    table.add_column("", justify="left")
    table.add_row("returned", "graphsub's rewrites" if rep.chosen != "original" and
                  not rep.fallback else "the program unchanged")
    if rep.fallback:
        table.add_row("why", escape(rep.fallback))
    if rep.speedup is not None:
        table.add_row("AOTInductor, optimized against original", f"{rep.speedup:.3f}x")
    used: dict[str, int] = {}
    for part in rep.parts:
        for name, count in part.rules_used.items():
            used[name] = used.get(name, 0) + count
    if used and rep.chosen != "original" and not rep.fallback:
        table.add_row("rules applied", escape(", ".join(f"{k} x{v}" for k, v in
                                                        sorted(used.items()))))
    if rep.causal_masks:
        table.add_row("masks proven causal", escape(", ".join(rep.causal_masks)))
    table.add_row("seconds", f"{rep.seconds:.1f}")
    table.add_row("written", f"{output} ({data['written']})")
    if report is not None:
        table.add_row("report", str(report))
    out.print(table)
