"""Writing and reading report files: the format follows the file's suffix (.json: the data;
.html: the page with its plots), and a saved JSON report renders to HTML later."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from graphsub.errors import GraphsubError

#: What --report accepts, by suffix.
FORMATS = {".json": "json", ".html": "html", ".htm": "html"}


def report_format(path: Path, option: str = "--report") -> str:
    """'json' or 'html' for a report path, or a GraphsubError saying what to give: checked
    before any work, so that a typo does not cost a search."""
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise GraphsubError(f"{option} {path}: the format follows the suffix; give a .json "
                            "file (the data) or a .html file (the page with plots)")
    return fmt


def report_kind(data: Any) -> str:
    """'optimize' or 'compare' for a report's data, or a GraphsubError."""
    if isinstance(data, dict) and {"verdict", "candidates", "search"} <= data.keys():
        return "optimize"
    if isinstance(data, dict) and "runs" in data and "model" in data:
        return "compare"
    raise GraphsubError("this JSON is not a graphsub report: give a file written by "
                        "`graphsub optimize --report FILE.json` or `graphsub compare --report "
                        "FILE.json`")


def render_html(data: dict[str, Any]) -> str:
    """The HTML page for a report's data, whichever command made it."""
    from graphsub.report.html import compare_html, optimize_html
    from graphsub.report.optimize import json_ready, upgrade

    data = upgrade(json_ready(data))
    return optimize_html(data) if report_kind(data) == "optimize" else compare_html(data)


def save_report(data: dict[str, Any], path: Path) -> None:
    """Write a report's data to `path` as JSON or HTML, by its suffix, atomically."""
    from graphsub.onnx_io.files import write_atomic

    if report_format(path) == "html":
        text = render_html(data)
    else:
        text = json.dumps(data, indent=2, default=str) + "\n"
    write_atomic(text.encode(), path)


def load_report(path: Path) -> dict[str, Any]:
    """A saved JSON report, or a GraphsubError naming what is wrong with the file."""
    if not path.is_file():
        raise GraphsubError(f"report {path} does not exist")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise GraphsubError(f"report {path} is not JSON ({exc}); give the .json file "
                            "`graphsub optimize --report` wrote") from None
    from graphsub.report.optimize import upgrade

    report_kind(data)
    return upgrade(data)
