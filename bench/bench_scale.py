"""Large models (issue 29): a Llama-style decoder of 2, 8, 16 and 32 layers through
`graphsub optimize` with its default time limit: where the time goes, peak memory, what was
found, and the output's speed against the original and the tools people use instead.

    python bench/bench_scale.py [--layers 2,8,16,32] [--time-limit 60] [--seconds 20]
        [--cache out/scale] [--out out/bench/scale.json] [--plot bench/scale_layers.png]
    python bench/bench_scale.py --search-only [--splits 100,400] [--zoo] [--out ...]

Needs the bench extra (transformers). Per layer count:
- the export: transformers' LlamaModel with TinyLlama-1.1B's widths (hidden 2048, 32 heads,
  4 key/value heads: grouped-query attention, MLP 5632, vocabulary 32000) and random weights,
  through `torch.onnx.export(dynamo=True, external_data=True)` with a dynamic batch and
  sequence: 176 MB of weights a layer, 5.9 GB at 32 layers (cached under --cache);
- `graphsub optimize` as a user runs it (the command, a fresh process, default settings but
  the time limit, measured costs on ort-cpu, the operator-timing cache of earlier sizes),
  with its report: seconds per stage, the counts of its long steps, the rules applied (per
  layer: the same in every layer?), peak memory (the process's peak resident set, from
  wait4, and the peak of its anonymous memory, sampled: the part that is not the model's
  data file mapped);
- onnxruntime's transformers optimizer (model type gpt2, as for Llama in bench_dynamic) and
  onnxslim on the same file, each in a process of its own, writing external data; a peer
  that fails says why;
- each written model timed head to head against the original in onnxruntime (CPU, default
  settings, batch 1, sequence 128; two sessions at a time: a 32-layer session holds 5.6 GB;
  rounds as graphsub's own measuring takes them, selection.timing_options),
  the ratio the median of per-round ratios (above 1: faster than the original); "control" is
  the original against a second session of itself, the noise floor of the other ratios.

With --search-only: the search alone on the whole graph and within MetaFlow's split at the
--splits part sizes, its predicted cost and rewrites per layer: whether whole-graph search
still pays at 32 layers; with --zoo, on the zoo's narrow Llama (analytic costs) at depths
the machine could not hold at width 2048 (--layers 64,128 --splits 400).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from tables import cpu_meta, export_hidden_states, markdown, save_rows  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIG = dict(hidden_size=2048, intermediate_size=5632, num_attention_heads=32,
              num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048)
FEEDS_SHAPE = (1, 128)


def export(layers: int, folder: Path) -> Path:
    """The decoder of `layers` layers as the dynamo exporter writes it (cached)."""
    path = folder / f"llama{layers}.onnx"
    if path.exists() and Path(str(path) + ".data").exists():
        return path
    import torch
    from transformers import LlamaConfig, LlamaModel

    torch.manual_seed(0)
    inner = LlamaModel(LlamaConfig(num_hidden_layers=layers, **CONFIG)).eval()
    return export_hidden_states(inner, path, vocab=CONFIG["vocab_size"], max_seq=1024,
                                decoder=True, external_data=True)


def _anon_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def run_measured(cmd: list[str], timeout: float) -> dict[str, Any]:
    """Run a command; its wall time, exit status, output tail, peak resident set (wait4)
    and peak anonymous memory (sampled every 0.1 s), in GB."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONPATH": str(ROOT / "src"),
                                 "COLUMNS": "120"})
    peak_anon = [0]
    output: list[bytes] = []

    def sample() -> None:
        while proc.poll() is None:
            peak_anon[0] = max(peak_anon[0], _anon_kb(proc.pid))
            time.sleep(0.1)

    def read() -> None:
        assert proc.stdout is not None
        output.append(proc.stdout.read())

    threads = [threading.Thread(target=sample, daemon=True),
               threading.Thread(target=read, daemon=True)]
    for t in threads:
        t.start()
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    _, status, usage = os.wait4(proc.pid, 0)
    timer.cancel()
    proc.returncode = os.waitstatus_to_exitcode(status)
    for t in threads:
        t.join(timeout=5)
    text = b"".join(output).decode(errors="replace")
    return {"seconds": round(time.perf_counter() - start, 1), "status": proc.returncode,
            "peak_rss_gb": round(usage.ru_maxrss / 1e6, 2),
            "peak_anon_gb": round(peak_anon[0] / 1e6, 2), "tail": text[-1500:]}


PEER_SCRIPT = """
import sys, onnx
name, src, dst = sys.argv[1:4]
if name == "ort-transformers":
    from onnxruntime.transformers.optimizer import optimize_model
    m = optimize_model(src, "gpt2", 32, 2048, opt_level=0)
    m.save_model_to_file(dst, use_external_data_format=True)
elif name == "onnxslim":
    import onnxslim
    onnxslim.slim(src, dst, save_as_external_data=True)
"""


def peer(name: str, path: Path, folder: Path, timeout: float) -> dict[str, Any]:
    out = folder / f"{path.stem}.{name}.onnx"
    result = run_measured([sys.executable, "-c", PEER_SCRIPT, name, str(path), str(out)],
                          timeout)
    result["path"] = str(out) if result["status"] == 0 and out.exists() else None
    return result


def head_to_head(original: Path, other: Path, seconds: float) -> dict[str, Any]:
    """The other model against the original in onnxruntime, two sessions, interleaved."""
    from graphsub.runtime.ort_sessions import OrtRunnable
    from graphsub.runtime.timing import compare_runnables
    from graphsub.selection import time_once, timing_options

    rng = np.random.default_rng(0)
    feeds = {"input_ids": rng.integers(0, 32000, FEEDS_SHAPE).astype(np.int64),
             "attention_mask": np.ones(FEEDS_SHAPE, np.int64)}
    a, b = OrtRunnable(str(original)), OrtRunnable(str(other))
    try:
        same = np.abs(a.run(feeds)["last_hidden_state"] - b.run(feeds)["last_hidden_state"])
        run_s = max(time_once(a, feeds), time_once(b, feeds))
        comparison = compare_runnables(a, b, feeds, min_seconds=seconds, min_rounds=5,
                                       **timing_options(run_s))
    finally:
        a.close()
        b.close()
    return {"ratio": round(comparison.speedup, 3), "rounds": len(comparison.ratios),
            "original_ms": round(float(np.median(comparison.before.round_medians())) * 1e3, 1),
            "max_abs_diff": float(same.max())}


def per_layer(rules: dict[str, int], layers: int) -> str:
    """Each rule's count per layer: `merge-matmuls 1/layer` when it applied in every one."""
    parts = []
    for rule, n in sorted(rules.items(), key=lambda kv: -kv[1]):
        parts.append(f"{rule} {n / layers:g}/layer" if n % layers == 0 else f"{rule} {n}")
    return ", ".join(parts) or "(nothing)"


def measure(layers: int, args: argparse.Namespace) -> dict[str, Any]:
    folder = Path(args.cache)
    path = export(layers, folder)
    data_gb = Path(str(path) + ".data").stat().st_size / 1e9
    out, report = folder / f"llama{layers}.graphsub.onnx", folder / f"llama{layers}.report.json"
    print(f"[{layers} layers] graphsub optimize ({data_gb:.2f} GB)", flush=True)
    run = run_measured([sys.executable, "-m", "graphsub.cli", "optimize", str(path), "-o",
                        str(out), "--report", str(report), "--time-limit",
                        str(args.time_limit)], timeout=3600)
    row: dict[str, Any] = {"layers": layers, "data_gb": round(data_gb, 2), "graphsub": run}
    if run["status"] != 0:
        print(run["tail"])
        return row
    rep = json.loads(report.read_text())
    rules = Counter(r for r in rep["rules_used"] if r != "fission and kernel orchestration") \
        if isinstance(rep["rules_used"], list) else Counter(rep["rules_used"])
    best = rep["candidates"][0] if rep["candidates"] else {}
    row.update(seconds=rep["seconds"], steps=rep["steps"], outcome=rep["outcome"],
               kept_original=rep["kept_original"], rules_kept=dict(rules),
               rules_found=dict(Counter(r for r in best.get("rules", [])
                                        if r != "fission and kernel orchestration")),
               search={k: v for k, v in rep["search"].items() if k != "progress"},
               predicted_before_ms=rep["predicted_ms_before"],
               predicted_after_ms=rep["predicted_ms_after"], notes=rep["notes"])
    outside = run["seconds"] - sum(rep["seconds"].get(k) or 0.0 for k in
                                   ("search", "fission", "export", "measure"))
    row["outside_limit_s"] = round(outside, 1)
    # the original against a second session of itself: the ratio two identical models give
    # here, the noise floor of every other ratio
    models = {"control": path, "graphsub": out}
    for name in args.peers.split(","):
        print(f"[{layers} layers] {name}", flush=True)
        row[name] = peer(name, path, folder, timeout=1800)
        if row[name]["path"]:
            models[name] = Path(row[name]["path"])
    for name, other in models.items():
        print(f"[{layers} layers] timing {name} against the original", flush=True)
        try:
            row.setdefault("speed", {})[name] = head_to_head(path, other, args.seconds)
        except Exception as exc:  # noqa: BLE001  (a peer's model that does not run)
            row.setdefault("speed", {})[name] = {"error": str(exc).splitlines()[0][:200]}
    return row


def search_depth(layers: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The search alone (graphsub.optimize: measured costs, the time limit less what the
    main job keeps for measuring) on the whole graph and within MetaFlow's split at two part
    sizes: where whole-graph search stops paying, the split should win."""
    import graphsub
    from graphsub import zoo

    graph = (zoo.build(f"llama:layers={layers},seq=128") if args.zoo
             else graphsub.load(export(layers, Path(args.cache))))
    rows = []
    for split in (None, *(int(n) for n in args.splits.split(","))):
        result = graphsub.optimize(graph, time_limit=args.time_limit * 0.6, split=split,
                                   cost="analytic" if args.zoo else "measured")
        rows.append({"layers": layers, "nodes": len(graph), "split": split,
                     "seconds": result.stats.seconds, "explored": result.stats.explored,
                     "propagated": result.stats.propagated,
                     "before_ms": result.initial_cost * 1e3,
                     "after_ms": result.final_cost * 1e3,
                     "rules": dict(result.rules_used())})
        print(f"[{layers} layers] split {split}: {rows[-1]['after_ms']:.1f} ms predicted, "
              f"{per_layer(rows[-1]['rules'], layers)}", flush=True)
    return rows


def depth_table(rows: list[dict[str, Any]]) -> str:
    return markdown(["layers", "nodes", "split", "search s", "expanded", "propagated",
                     "predicted ms before", "after", "rewrites"],
                    [[str(r["layers"]), str(r["nodes"]), str(r["split"] or "none"),
                      f"{r['seconds']:.1f}", str(r["explored"]), str(r["propagated"]),
                      f"{r['before_ms']:.1f}", f"{r['after_ms']:.1f}",
                      per_layer(r["rules"], r["layers"])] for r in rows])


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in rows if "seconds" in r]
    layers = [r["layers"] for r in done]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    bottom = np.zeros(len(done))
    for stage in ("load", "search", "fission", "export", "measure", "verify", "report"):
        values = np.array([r["seconds"].get(stage) or 0.0 for r in done])
        left.bar([str(n) for n in layers], values, bottom=bottom, label=stage)
        bottom += values
    rest = np.array([r["graphsub"]["seconds"] for r in done]) - bottom
    left.bar([str(n) for n in layers], rest, bottom=bottom, label="start, write", color="0.7")
    left.set_xlabel("layers")
    left.set_ylabel("wall time of graphsub optimize (s)")
    left.legend(fontsize=7, ncol=2)
    right.plot(layers, [r["graphsub"]["peak_rss_gb"] for r in done], "o-", label="peak RSS")
    right.plot(layers, [r["graphsub"]["peak_anon_gb"] for r in done], "s-",
               label="peak anonymous memory")
    right.plot(layers, [r["data_gb"] for r in done], "k--", label="model on disk")
    right.plot(layers, [3 * r["data_gb"] for r in done], "k:", label="3x the model")
    right.set_xlabel("layers")
    right.set_ylabel("GB")
    right.legend(fontsize=7)
    for ax in (left, right):
        ax.grid(alpha=0.3)
    fig.suptitle("graphsub optimize on a Llama-style decoder (hidden 2048, GQA), ort-cpu")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def table(rows: list[dict[str, Any]], peers: list[str]) -> str:
    lines = []
    for r in rows:
        g = r["graphsub"]
        if "seconds" not in r:
            lines.append([str(r["layers"]), f"{r['data_gb']:.2f}", f"failed: {g['tail'][-80:]}"]
                         + [""] * (9 + len(peers)))
            continue
        s = r["seconds"]
        speed = r.get("speed", {})

        def ratio(name: str) -> str:
            v = speed.get(name, {})
            if "ratio" in v:
                return f"{v['ratio']:.3f}"
            return r.get(name, {}).get("tail", "")[-60:].replace("|", "/") or v.get("error", "")

        lines.append([str(r["layers"]), f"{r['data_gb']:.2f}", f"{g['seconds']:.0f}",
                      f"{s['load']:.1f}", f"{s['search']:.1f}",
                      f"{(s.get('measure') or 0) + (s.get('verify') or 0):.1f}",
                      f"{r['outside_limit_s']:.1f}", f"{g['peak_rss_gb']:.1f}",
                      f"{g['peak_anon_gb']:.1f}", per_layer(r["rules_found"], r["layers"]),
                      "original kept" if r["kept_original"] else "candidate",
                      *[ratio(p) for p in ["control", "graphsub", *peers]]])
    return markdown(["layers", "data GB", "wall s", "load s", "search s", "measure+verify s",
                     "outside the limit s", "peak RSS GB", "peak anon GB",
                     "rewrites found (best candidate)", "written",
                     *[f"{p} vs original" for p in ["control", "graphsub", *peers]]], lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", default="2,8,16,32")
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--seconds", type=float, default=20.0, help="head-to-head timing")
    ap.add_argument("--peers", default="ort-transformers,onnxslim")
    ap.add_argument("--cache", default="out/scale")
    ap.add_argument("--out", default="out/bench/scale.json")
    ap.add_argument("--plot", default="bench/scale_layers.png")
    ap.add_argument("--search-only", action="store_true",
                    help="the search alone, whole graph against --splits part sizes")
    ap.add_argument("--splits", default="100,400")
    ap.add_argument("--zoo", action="store_true",
                    help="with --search-only: the zoo's narrow Llama (hidden 256), analytic "
                         "costs, for graphs deeper than the machine holds at width 2048")
    args = ap.parse_args()
    Path(args.cache).mkdir(parents=True, exist_ok=True)
    if args.search_only:
        found = [row for n in args.layers.split(",") for row in search_depth(int(n), args)]
        save_rows(args.out, cpu_meta(), found)
        print(depth_table(found))
        return
    rows = []
    for layers in (int(n) for n in args.layers.split(",")):
        rows.append(measure(layers, args))
        save_rows(args.out, cpu_meta(), rows)
    plot(rows, Path(args.plot))
    print(table(rows, args.peers.split(",")))


if __name__ == "__main__":
    main()
