"""Whether `--time-limit` is kept (issue 16): wall-clock time of whole `graphsub optimize` runs
on real exported models, with an empty operator-timing cache (the worst case: every operator
is timed for the first time), and of the e-graph searches on the zoo.

    python bench/bench_time_limits.py [--models llama,swin] [--targets ort-cpu,torch-cpu]
        [--limits 20,60] [--egraph nasrnn,squeezenet,bert,nasnet_a] [--out out/bench/time_limits.json]

Needs the bench extra for the exports (transformers, onnxscript). The Llama-style decoder
(grouped-query attention: Expand nodes) and Swin-T are built from configs with random weights
and exported with `torch.onnx.export(dynamo=True)`. Each optimize run is a subprocess of the
real `graphsub` command, timed from start to exit, with GRAPHSUB_CACHE_DIR pointing at an
empty folder; the report's own split of the time (load and search, measure, verify) is read
back from --report.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from tables import markdown, save_rows  # noqa: E402

GRAPHSUB = str(Path(sys.executable).with_name("graphsub"))


def export_llama(path: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaModel

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=256, num_hidden_layers=2, num_attention_heads=8,
                         num_key_value_heads=2, intermediate_size=512, vocab_size=2000,
                         max_position_embeddings=256, use_cache=False)
    model = LlamaModel(config).eval()
    _perturb(model)
    args = (torch.randint(0, 2000, (1, 64)),)
    kwargs = {"attention_mask": torch.ones(1, 64, dtype=torch.int64)}
    with torch.no_grad():
        torch.onnx.export(model, args, kwargs=kwargs, dynamo=True,
                          input_names=["input_ids", "attention_mask"]).save(str(path))


def export_swin(path: Path) -> None:
    import torch
    from transformers import SwinConfig, SwinModel

    torch.manual_seed(0)
    model = SwinModel(SwinConfig()).eval()  # Swin-T: embedding 96, depths 2, 2, 6, 2
    _perturb(model)
    with torch.no_grad():
        torch.onnx.export(model, (torch.randn(1, 3, 224, 224),), dynamo=True,
                          input_names=["pixel_values"]).save(str(path))


def _perturb(model) -> None:
    """Biases and norm parameters off their initial zeros and ones."""
    import torch

    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn(p.shape, generator=gen) * 0.02)


EXPORTS = {"llama": export_llama, "swin": export_swin}


def optimize_run(model: Path, target: str, limit: float, folder: Path) -> dict[str, Any]:
    out, report = folder / f"{model.stem}.{target}.opt.onnx", folder / "report.json"
    cache = Path(tempfile.mkdtemp(prefix="cache-", dir=folder))
    env = {**os.environ, "GRAPHSUB_CACHE_DIR": str(cache)}
    start = time.perf_counter()
    proc = subprocess.run([GRAPHSUB, "optimize", str(model), "-o", str(out), "--target", target,
                           "--time-limit", str(limit), "--report", str(report)],
                          capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    row: dict[str, Any] = {"model": model.stem, "target": target, "limit": limit,
                           "wall_s": round(wall, 1), "exit": proc.returncode}
    if proc.returncode == 0:
        rep = json.loads(report.read_text())
        seconds = rep["seconds"]
        row.update({k: seconds.get(k, 0.0) for k in ("load", "search", "fission", "measure",
                                                      "verify", "total")},
                   outcome=rep["outcome"], notes=len(rep["notes"]))
    else:
        row["error"] = proc.stderr.strip().splitlines()[-1:] or ["?"]
    return row


def egraph_runs(models: list[str], limits: list[float]) -> list[dict[str, Any]]:
    import graphsub
    from graphsub import zoo
    from graphsub.cost import AnalyticCostModel
    from graphsub.rules import builtin_rules, load_rules

    taso = Path(__file__).resolve().parents[2] / "shared" / "data" / "taso" / "graph_subst.pb"
    rules = builtin_rules() + (load_rules([taso]) if taso.exists() else [])
    rows = []
    for name in models:
        graph = zoo.build(name)
        for algorithm in ("eqsat", "mcts"):
            for limit in limits:
                start = time.perf_counter()
                result = graphsub.optimize(graph, rules, algorithm, cost=AnalyticCostModel("a100"),
                                           time_limit=limit)
                rows.append({"model": name, "algorithm": algorithm, "limit": limit,
                             "wall_s": round(time.perf_counter() - start, 2),
                             "stopped_by": result.stats.stopped_by,
                             "cost_ratio": round(result.final_cost / result.initial_cost, 3)})
                print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="llama,swin")
    parser.add_argument("--targets", default="ort-cpu,torch-cpu")
    parser.add_argument("--limits", default="20,60")
    parser.add_argument("--egraph", default="nasrnn,squeezenet,bert,nasnet_a")
    parser.add_argument("--egraph-limits", default="1,5")
    parser.add_argument("--out", default="out/bench/time_limits.json")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for name in filter(None, args.models.split(",")):
            path = folder / f"{name}.onnx"
            EXPORTS[name](path)
            for target in args.targets.split(","):
                for limit in map(float, args.limits.split(",")):
                    rows.append(optimize_run(path, target, limit, folder))
                    print(rows[-1], flush=True)
    egraph = egraph_runs([m for m in args.egraph.split(",") if m],
                         [float(x) for x in args.egraph_limits.split(",")])
    meta = {"date": str(date.today()), "machine": platform.processor() or platform.machine(),
            "cpus": os.cpu_count()}
    save_rows(args.out, meta, rows + egraph)
    print(markdown(("model", "target", "limit s", "wall s", "load", "search", "fission",
                    "measure", "verify", "outcome", "notes"),
                   [(r["model"], r["target"], f"{r['limit']:g}", f"{r['wall_s']:.1f}",
                     *(f"{r.get(k, '-')}" for k in ("load", "search", "fission", "measure",
                                                     "verify")),
                     r.get("outcome", r.get("error", "")), str(r.get("notes", "")))
                    for r in rows]))
    print(markdown(("model", "algorithm", "limit s", "wall s", "stopped by", "cost ratio"),
                   [(r["model"], r["algorithm"], f"{r['limit']:g}", f"{r['wall_s']:.2f}",
                     r["stopped_by"], f"{r['cost_ratio']:.3f}") for r in egraph]))


if __name__ == "__main__":
    main()
