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


def cpu_meta() -> dict[str, Any]:
    """What a CPU benchmark's results say about where and how they were measured."""
    import platform
    import sys
    from datetime import date

    import onnxruntime

    from graphsub.backends.ort import cpu_model

    return {"date": date.today().isoformat(), "host": platform.node(),
            "processor": cpu_model(), "onnxruntime": onnxruntime.__version__,
            "command": " ".join(sys.argv)}


def peer_models(path: str | Path, ort_type: tuple[str, int, int],
                names: Sequence[str]) -> dict[str, bytes | str]:
    """The model at `path` as each named peer writes it ("ort-transformers": onnxruntime's
    transformers optimizer for (model type, heads, hidden); "onnxscript": its ORT fusions;
    "onnxslim"), or why a peer has none: a peer that fails is reported, not fatal."""
    out: dict[str, bytes | str] = {}
    for name in names:
        try:
            out[name] = _peer(name, Path(path), ort_type)
        except Exception as exc:  # noqa: BLE001
            out[name] = f"failed: {exc}"
    return out


def _peer(name: str, path: Path, ort_type: tuple[str, int, int]) -> bytes:
    import onnx

    if name == "ort-transformers":
        from onnxruntime.transformers.optimizer import optimize_model as ort_optimize

        kind, heads, hidden = ort_type
        return ort_optimize(str(path), kind, heads, hidden, opt_level=0).model.SerializeToString()
    if name == "onnxscript":
        import onnx_ir as ir
        from onnxscript.rewriter.ort_fusions import optimize_for_ort

        model, _ = optimize_for_ort(ir.load(str(path)))
        return ir.to_proto(model).SerializeToString()
    if name == "onnxslim":
        import onnxslim

        return onnxslim.slim(onnx.load(str(path))).SerializeToString()
    raise ValueError(f"unknown peer {name!r}")
