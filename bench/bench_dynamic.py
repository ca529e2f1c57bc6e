"""Dynamic sizes (issue 27): transformers models exported with a dynamic batch and sequence,
optimized without --input-shape, timed at two sizes against the original and against the
tools people use instead on the same dynamic file.

    python bench/bench_dynamic.py [--models bert,llama] [--time-limit 60] [--seconds 6]
        [--shapes batch=1,seq=128 batch=4,seq=256] [--out out/bench/dynamic.json]

Needs the bench extra (transformers, onnxscript). Per model:
- the export: transformers' BertModel / LlamaModel (grouped-query attention, rotary
  embeddings) from configs with random weights, through `torch.onnx.export(dynamo=True,
  dynamic_shapes=...)`: inputs input_ids and attention_mask of shape batch x seq;
- the search alone (graphsub.optimize, the analytic cost for the torch-cpu profile, the same
  budget) on the dynamic file and on the same file fixed to the first shape with
  --input-shape: the rewrites each applies, to show that what graphsub does on the static
  model it does on the dynamic one;
- graphsub optimize_model on the dynamic file (ort-cpu, measured costs, both shapes as its
  profile), and again with --ort-fusions (graphsub+fusions), onnxruntime's transformers optimizer (`optimize_model(path, model_type, heads,
  hidden)`) and onnxscript's ORT fusions (`optimize_for_ort`) on the same file; every output
  is checked against the original at each shape and keeps the symbolic inputs;
- at each shape, the four files timed side by side in one process (onnxruntime's default
  settings, blocks in rotating order); ratios are medians of per-round ratios (original /
  other: above 1 is faster).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from tables import (cpu_meta, export_hidden_states, markdown, peer_models,  # noqa: E402
                    rules_text, save_rows)

import graphsub  # noqa: E402
from graphsub.tensors.types import TensorType  # noqa: E402
from graphsub.onnx_io.importer import model_data  # noqa: E402
from graphsub.optimizer import optimize_model  # noqa: E402
from graphsub.runtime import Timing, time_models  # noqa: E402
from graphsub.verdicts import compare_models
from graphsub.runtime.check_sizes import parse_profile  # noqa: E402
from graphsub.verdicts.equivalence import Tolerance  # noqa: E402

CONFIGS = {
    "bert": dict(hidden_size=384, num_hidden_layers=4, num_attention_heads=6,
                 intermediate_size=1536, vocab_size=2000, max_position_embeddings=512),
    "llama": dict(hidden_size=384, num_hidden_layers=4, num_attention_heads=6,
                  num_key_value_heads=2, intermediate_size=1024, vocab_size=2000,
                  max_position_embeddings=1024),
}
#: onnxruntime's transformers optimizer: model type, heads, hidden size.
ORT_TYPES = {"bert": ("bert", 6, 384), "llama": ("gpt2", 6, 384)}
PEERS = ["ort-transformers", "onnxscript"]


def export(name: str, folder: Path) -> Path:
    import torch
    from transformers import BertConfig, BertModel, LlamaConfig, LlamaModel

    torch.manual_seed(0)
    inner = (BertModel(BertConfig(**CONFIGS[name]), add_pooling_layer=False) if name == "bert"
             else LlamaModel(LlamaConfig(**CONFIGS[name])))
    return export_hidden_states(inner, folder / f"{name}_dynamic.onnx", vocab=2000,
                                max_seq=512, decoder=name == "llama")


def peers(name: str, path: Path) -> dict[str, bytes | str]:
    """Each peer's model on the same dynamic file, or why it has none."""
    return peer_models(path, ORT_TYPES[name], PEERS)


def feeds_at(binding: dict[str, int]) -> dict[str, np.ndarray]:
    """Token ids and an attention mask whose last quarter of the first row is padding."""
    rng = np.random.default_rng(0)
    b, s = binding["batch"], binding["seq"]
    mask = np.ones((b, s), np.int64)
    mask[0, s - s // 4:] = 0
    return {"input_ids": rng.integers(0, 2000, (b, s)).astype(np.int64),
            "attention_mask": mask}


def paired(a: Timing, b: Timing) -> float:
    """Median over rounds of a's round median / b's (above 1: b is faster)."""
    return statistics.median(x / y for x, y in zip(a.round_medians(), b.round_medians()))


def _input_dims(data: bytes) -> list[list[int | str]]:
    model = onnx.load_from_string(data)
    return [[d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim]
            for i in model.graph.input]


def search_rules(path: Path, first: dict[str, int], seconds: float) -> dict[str, Any]:
    """The rewrites the search alone applies to the dynamic model and to the same model at
    the first shape, with one cost model (analytic, torch-cpu's profile) and one budget."""
    out = {}
    shapes = {"input_ids": (first["batch"], first["seq"]),
              "attention_mask": (first["batch"], first["seq"])}
    for label, given in (("dynamic", None), ("static", shapes)):
        graph = graphsub.load(path, given)
        result = graphsub.optimize(graph, cost="analytic", target="torch-cpu",
                                   time_limit=seconds, budget=300,
                                   shape_profile=(f"batch={first['batch']},seq={first['seq']}",)
                                   if given is None else ())
        out[label] = dict(Counter(s.rule for s in result.trace).most_common())
        out[f"{label}_undecided"] = result.stats.undecided
    return out


def measure(name: str, folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    path = export(name, folder)
    original = model_data(path)
    shapes = [parse_profile(text) for text in args.shapes]
    row: dict[str, Any] = {"model": name, "shapes": [str(s) for s in shapes]}
    row["search"] = search_rules(path, shapes[0].values, args.search_seconds)
    graph = graphsub.load(path)
    t0 = time.perf_counter()
    data, rep = optimize_model(graph, original, name, time_limit=args.time_limit,
                               target="ort-cpu", shape_profile=tuple(args.shapes))
    row.update(optimize_s=time.perf_counter() - t0, rules=rep.rules_used,
               kept_original=rep.kept_original, outcome=rep.outcome,
               verified_at=len(rep.shapes.get("verified_at", [])))
    fused, fused_rep = optimize_model(graph, original, name, time_limit=args.time_limit,
                                      target="ort-cpu", shape_profile=tuple(args.shapes),
                                      ort_fusions=True)
    row.update(fused_rules=fused_rep.rules_used, fused_kept_original=fused_rep.kept_original,
               fused_outcome=fused_rep.outcome,
               fused_verified_at=len(fused_rep.shapes.get("verified_at", [])))
    files = {"original": original, "graphsub": data, "graphsub+fusions": fused}
    for peer, result in peers(name, path).items():
        if isinstance(result, bytes):
            files[peer] = result
        else:
            row[f"{peer}_failed"] = result[:300]
    row["symbolic_inputs"] = {k: _input_dims(v) == _input_dims(original) for k, v in files.items()}
    for shape in shapes:
        feeds = feeds_at(shape.values)
        specs = [(i, TensorType(a.shape, str(a.dtype))) for i, a in feeds.items()]
        key = str(shape)
        row[key] = {}
        for label, model in files.items():
            if label != "original":
                row[key][f"{label}_equivalent"] = compare_models(
                    original, model, specs, Tolerance(1e-3, 1e-4)).equivalent
        timings = dict(zip(files, time_models(list(files.values()), feeds,
                                              min_seconds=args.seconds)))
        row[key]["original_ms"] = timings["original"].median * 1e3
        for label in files:
            if label != "original":
                row[key][f"{label}_ratio"] = paired(timings["original"], timings[label])
        for peer in PEERS:
            if peer in files:
                for ours in ("graphsub", "graphsub+fusions"):
                    row[key][f"{ours}_vs_{peer}"] = paired(timings[peer], timings[ours])
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="bert,llama")
    ap.add_argument("--shapes", nargs="+", default=["batch=1,seq=128", "batch=4,seq=256"])
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--search-seconds", type=float, default=30.0)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--out", default="out/bench/dynamic.json")
    args = ap.parse_args()
    folder = Path(args.out).parent
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in filter(None, args.models.split(",")):
        rows.append(measure(name, folder, args))
        print(json.dumps(rows[-1], default=str), flush=True)
    meta = cpu_meta()
    save_rows(args.out, meta, rows)
    print(f"\n{meta}\n")
    headers = ["model", "shape", "original ms", "graphsub", "graphsub+fusions",
               "ort-transformers", "onnxscript", "graphsub+fusions / ort-transformers",
               "graphsub+fusions / onnxscript"]
    lines = []
    for r in rows:
        for shape in r["shapes"]:
            m = r[shape]
            lines.append([r["model"], shape, f"{m['original_ms']:.2f}"] + [
                f"{m[k]:.3f}" if k in m else "-" for k in (
                    "graphsub_ratio", "graphsub+fusions_ratio", "ort-transformers_ratio",
                    "onnxscript_ratio", "graphsub+fusions_vs_ort-transformers",
                    "graphsub+fusions_vs_onnxscript")])
    print(markdown(headers, lines))
    print()
    print(markdown(["model", "graphsub kept (outcome)", "graphsub+fusions kept (outcome)",
                    "search on the dynamic file", "search at the first shape (static)"],
                   [[r["model"], f"{rules_text(r['rules'])} ({r['outcome']}, verified at "
                     f"{r['verified_at']} bindings)",
                     f"{rules_text(r['fused_rules'])} ({r['fused_outcome']}, verified at "
                     f"{r['fused_verified_at']} bindings)",
                     rules_text(r["search"]["dynamic"]), rules_text(r["search"]["static"])]
                    for r in rows]))


if __name__ == "__main__":
    main()
