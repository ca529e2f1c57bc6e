"""Optimizer benchmark (issue 3): every zoo model through `optimize_model` with the default
settings, then the written model re-timed against the original, interleaved, in a fresh
measurement; and how well the predicted graph cost tracks measured latency.

    python bench/bench_optimize.py [--models a,b,...] [--time-limit 60] [--out out/bench/optimize.json]

Two timings of original vs optimized, both with onnxruntime's default session settings:
graphsub's harness (`time_models`: both sessions alive, blocks of runs in rotating order, a pause
before each block), and as a cross-check one live session at a time (each round creates, warms
up, times and drops a session per model, alternating), as a user's own deployment runs. Prints
markdown tables (for bench/RESULTS.md) and writes the raw figures and the optimized models
under out/bench/.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from datetime import date

import numpy as np

from graphsub import zoo
from graphsub.targets import get_target
from graphsub.cost import MeasuredCostModel
from graphsub.onnx_io import to_onnx_bytes
from graphsub.optimizer import optimize_model
from graphsub.runtime import Timing, graph_input_specs, make_session, random_feeds, time_models

MODELS = ["nasrnn", "bert", "resnext50", "nasnet_a", "inception_v3", "resnet50", "squeezenet",
          "vgg19", "mobilenet_v2", "sru", "vit", "resnet_blocks", "inception_e_blocks"]
TARGET_SET = ["nasrnn", "bert", "resnext50", "nasnet_a", "inception_v3"]


def time_one_at_a_time(models: list[bytes], feeds: dict, threads: int, rounds: int = 6,
                       runs: int = 15) -> list[Timing]:
    """Each round: for each model (order alternating), a fresh session, 3 warm-up runs, `runs`
    timed runs, then the session is dropped; no two sessions are ever alive together."""
    samples: list[list[float]] = [[] for _ in models]
    for r in range(rounds):
        order = list(range(len(models)))[:: -1 if r % 2 else 1]
        for i in order:
            sess = make_session(models[i], threads)
            for _ in range(3):
                sess.run(None, feeds)
            for _ in range(runs):
                t0 = time.perf_counter()
                sess.run(None, feeds)
                samples[i].append(time.perf_counter() - t0)
            del sess
    return [Timing(tuple(s)) for s in samples]


def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--out", default="out/bench/optimize.json")
    args = ap.parse_args()
    threads = os.cpu_count() or 1
    out_dir = os.path.dirname(args.out) or "."
    os.makedirs(out_dir, exist_ok=True)
    rows = []
    for name in args.models.split(","):
        graph = zoo.build(name)
        original = to_onnx_bytes(graph)
        t0 = time.perf_counter()
        data, rep = optimize_model(graph, original, name, time_limit=args.time_limit,
                                   threads=threads)
        total = time.perf_counter() - t0
        # An independent check of the written model: a fresh interleaved timing.
        with open(os.path.join(out_dir, f"{name}.opt.onnx"), "wb") as f:
            f.write(data)
        feeds = random_feeds(graph_input_specs(graph), seed=1)
        before, after = time_models([original, data], feeds, threads=threads, min_seconds=5.0)
        iso_before, iso_after = time_one_at_a_time([original, data], feeds, threads)
        rows.append({
            "model": name, "nodes": len(graph), "search_s": rep.search["seconds"],
            "total_s": total, "explored": rep.search["explored"],
            "generated": rep.search["generated"], "stopped_by": rep.search["stopped_by"],
            "predicted_before_ms": rep.predicted_ms_before,
            "predicted_after_ms": rep.predicted_ms_after,
            "kept_original": rep.kept_original, "rules_used": rep.rules_used,
            "choice_before_ms": rep.latency_before_ms, "choice_after_ms": rep.latency_after_ms,
            "before_ms": before.median * 1e3, "after_ms": after.median * 1e3,
            "before_iqr_ms": [before.q1 * 1e3, before.q3 * 1e3],
            "after_iqr_ms": [after.q1 * 1e3, after.q3 * 1e3],
            "ratio": before.median / after.median,
            "isolated_before_ms": iso_before.median * 1e3,
            "isolated_after_ms": iso_after.median * 1e3,
            "isolated_ratio": iso_before.median / iso_after.median,
        })
        r = rows[-1]
        print(f"{name}: {r['before_ms']:.2f} -> {r['after_ms']:.2f} ms ({r['ratio']:.3f}x; isolated "
              f"{r['isolated_ratio']:.3f}x), search "
              f"{r['search_s']:.1f} s, {'original kept' if r['kept_original'] else r['rules_used']}",
              flush=True)

    # Cost-model fidelity: predicted (sum of measured one-op costs) vs end-to-end latency.
    model = MeasuredCostModel(get_target("ort-cpu", threads=threads))
    pred = np.array([r["predicted_before_ms"] for r in rows])
    meas = np.array([r["before_ms"] for r in rows])
    corr = float(np.corrcoef(np.log(pred), np.log(meas))[0, 1]) if len(rows) > 2 else float("nan")
    err = float(np.median(np.abs(pred - meas) / meas)) if len(rows) else float("nan")
    summary = {
        "date": date.today().isoformat(), "machine": f"{platform.machine()} x{threads}",
        "time_limit": args.time_limit, "cost_model": model.name,
        "geomean_target_set": geomean([r["ratio"] for r in rows if r["model"] in TARGET_SET]),
        "geomean_target_set_isolated": geomean([r["isolated_ratio"] for r in rows
                                                if r["model"] in TARGET_SET]),
        "min_ratio": min((r["ratio"] for r in rows), default=float("nan")),
        "min_ratio_isolated": min((r["isolated_ratio"] for r in rows), default=float("nan")),
        "log_correlation_pred_vs_measured": corr, "median_abs_pct_error": err,
    }
    with open(args.out, "w") as f:
        json.dump({"summary": summary, "rows": rows}, f, indent=2)
    print()
    print("| model | nodes | original ms | optimized ms | ratio | isolated: original ms | "
          "optimized ms | ratio | search s | expanded | result |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        result = "original kept" if r["kept_original"] else ", ".join(
            f"{k} x{v}" for k, v in r["rules_used"].items())
        print(f"| {r['model']} | {r['nodes']} | {r['before_ms']:.2f} | {r['after_ms']:.2f} | "
              f"{r['ratio']:.3f} | {r['isolated_before_ms']:.2f} | {r['isolated_after_ms']:.2f} | "
              f"{r['isolated_ratio']:.3f} | {r['search_s']:.1f} | {r['explored']} | {result} |")
    print()
    print("| model | predicted (sum of one-op costs) ms | measured ms |")
    print("|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['predicted_before_ms']:.2f} | {r['before_ms']:.2f} |")
    print()
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
