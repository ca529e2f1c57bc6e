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
    """'optimize', 'exported' (a torch.export program's) or 'compare' for a report's data,
    or a GraphsubError."""
    if isinstance(data, dict) and {"verdict", "candidates", "search"} <= data.keys():
        return "optimize"
    if isinstance(data, dict) and {"program", "parts", "chosen"} <= data.keys():
        return "exported"
    if isinstance(data, dict) and "runs" in data and "model" in data:
        return "compare"
    raise GraphsubError("this JSON is not a graphsub report: give a file written by "
                        "`graphsub optimize --report FILE.json` or `graphsub compare --report "
                        "FILE.json`")


def render_html(data: dict[str, Any]) -> str:
    """The HTML page for a report's data, whichever command made it."""
    from graphsub.report.html import compare_html, exported_html, optimize_html

    data = upgrade(json_ready(data))
    kind = report_kind(data)
    return optimize_html(data) if kind == "optimize" else \
        exported_html(data) if kind == "exported" else compare_html(data)


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

    report_kind(data)
    return upgrade(data)


def upgrade(data: dict[str, Any]) -> dict[str, Any]:
    """A report saved by an older graphsub in today's form: predicted costs were in seconds
    under *_cost keys, and are in ms under *_ms keys now."""
    if "runs" in data:  # compare
        data = {**data, "runs": [_compare_run(r) for r in data["runs"]]}
    if "predicted_cost_before" not in data:
        return data
    data = dict(data)
    for old, new in (("predicted_cost_before", "predicted_ms_before"),
                     ("predicted_cost_after", "predicted_ms_after")):
        data[new] = _ms(data.pop(old))
    data["candidates"] = [{**{k: v for k, v in c.items() if k != "predicted_cost"},
                           "predicted_ms": _ms(c.get("predicted_cost"))}
                          for c in data.get("candidates", [])]
    search = dict(data.get("search") or {})
    search["progress"] = [(s, _ms(c)) for s, c in search.get("progress") or []]
    data["search"] = search
    fission = dict(data.get("fission") or {})
    if "predicted_cost" in fission:
        fission["predicted_ms"] = _ms(fission.pop("predicted_cost"))
        fission["kernels"] = [{**{k: v for k, v in kernel.items() if k != "total_cost"},
                               "total_ms": _ms(kernel.get("total_cost"))}
                              for kernel in fission.get("kernels", [])]
    data["fission"] = fission
    op = dict(data.get("op_times") or {})
    for side in ("original", "candidate"):
        if op.get(side):
            op[side] = {name: _ms(v) for name, v in op[side].items()}
    data["op_times"] = op
    return data


def _compare_run(run: dict[str, Any]) -> dict[str, Any]:
    if "initial_cost" not in run:
        return run
    rest = {k: v for k, v in run.items() if k not in ("initial_cost", "final_cost")}
    return {**rest, "initial_ms": _ms(run["initial_cost"]), "final_ms": _ms(run.get("final_cost")),
            "progress": [(s, _ms(c)) for s, c in run.get("progress") or []]}


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def json_ready(data: Any) -> Any:
    """`data` as JSON would give it back (enums as their words, tuples as lists), so that a
    report renders the same from memory as from its saved file."""
    return json.loads(json.dumps(data, default=str))
