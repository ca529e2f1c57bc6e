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

    from graphsub.targets.ort import cpu_model

    return {"date": date.today().isoformat(), "host": platform.node(),
            "processor": cpu_model(), "onnxruntime": onnxruntime.__version__,
            "command": " ".join(sys.argv)}


def export_hidden_states(inner: Any, path: Path, vocab: int, max_seq: int,
                         decoder: bool, external_data: bool = False) -> Path:
    """A transformers model's last hidden state as `torch.onnx.export(dynamo=True)` writes
    it, inputs input_ids and attention_mask of a dynamic batch and sequence; the model's norms
    and biases perturbed first, so that nothing is trivially zero or one."""
    import warnings

    import torch

    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in inner.parameters():
            if p.dim() == 1:
                p.add_(torch.randn(p.shape, generator=gen) * 0.02)
    extra = {"use_cache": False} if decoder else {}

    class Hidden(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask,
                              **extra).last_hidden_state

    batch, seq = torch.export.Dim("batch", max=64), torch.export.Dim("seq", max=max_seq)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(Hidden().eval(), (torch.randint(0, vocab, (2, 16)),
                                            torch.ones(2, 16, dtype=torch.int64)),
                          str(path), dynamo=True, verbose=False, external_data=external_data,
                          dynamic_shapes=({0: batch, 1: seq}, {0: batch, 1: seq}),
                          input_names=["input_ids", "attention_mask"],
                          output_names=["last_hidden_state"])
    return path


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
