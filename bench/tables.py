"""What the benchmark scripts end with: rows saved as JSON next to a markdown table."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def save_rows(path: str | Path, meta: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2, default=str))


def markdown(headers: Sequence[str], lines: Sequence[Sequence[str]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(line) + " |" for line in lines]
    return "\n".join(out)


def rules_text(rules: dict[str, int]) -> str:
    return ", ".join(f"{k} x{v}" for k, v in rules.items()) or "(original kept)"
