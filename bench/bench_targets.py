"""Optimizing for a device (issue 8): the zoo through `optimize_model` on one target, then the
written graph timed against the original in every mode a PyTorch user might run it.

    python bench/bench_targets.py --target torch-cuda [--models nasrnn,bert,...]
        [--time-limit 60] [--seconds 3] [--no-inductor] [--out out/bench/targets.json]

Per model, side by side in one process (medians; ratios are original / optimized):
- `optimize_model` with the defaults on the target (measured per-operator costs, backtracking
  search, measure / confirm / verify): search seconds, rules applied, and the head-to-head
  ratio it confirmed (on torch-cuda: CUDA-graph replays timed with CUDA events);
- the chosen graph re-timed against the original: CUDA-graph replays (torch-cuda), eager
  launches, and each graph compiled by inductor (torch.compile of the backend's FX program);
- the search under the analytic profile of the target's device instead of measured costs,
  its best graph timed the same way (what the analytic search alone gives);
- cost-model fidelity: the original's predicted cost (sum of measured operator costs) next to
  its measured latency.

Runs in one call on a GPU machine (it needs only torch, onnx, onnxruntime, numpy, scipy, typer,
rich; set GRAPHSUB_CACHE_DIR), prints JSON lines as it goes and markdown tables last.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from datetime import date
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from tables import markdown, rules_text, save_rows  # noqa: E402
os.environ.setdefault("GRAPHSUB_CACHE_DIR", str(Path("out/cache").resolve()))

import torch  # noqa: E402

import graphsub  # noqa: E402
from graphsub import zoo  # noqa: E402
from graphsub.targets import get_target  # noqa: E402
from graphsub.targets.torch import TorchProgram, TorchRunnable  # noqa: E402
from graphsub.cost import make_cost_model  # noqa: E402
from graphsub.optimizer import optimize_model  # noqa: E402
from graphsub.runtime import Runnable, graph_input_specs, random_feeds, time_runnables  # noqa: E402

MODELS = ["nasrnn", "bert", "resnext50", "nasnet_a", "inception_v3", "squeezenet"]


class CompiledRunnable(Runnable):
    """A graph's FX program compiled by inductor, timed like the backend's runnables."""

    def __init__(self, program: TorchProgram, label: str) -> None:
        self.program = program
        self.fn = torch.compile(program.module, backend="inductor")
        self.label = label
        self.cuda = program.device.type == "cuda"
        self.inputs: list[torch.Tensor] = []

    def run(self, feeds):
        with torch.inference_mode():
            outs = self.fn(*self.program.inputs_from(feeds))
        return {n: t.cpu().numpy() for n, t in zip(self.program.output_names, outs)}

    def bind(self, feeds) -> None:
        self.inputs = self.program.inputs_from(feeds)

    def timed(self, n: int) -> list[float]:
        out = []
        with torch.inference_mode():
            for _ in range(n):
                if self.cuda:
                    start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                    start.record()
                    self.fn(*self.inputs)
                    end.record()
                    end.synchronize()
                    out.append(start.elapsed_time(end) / 1e3)
                else:
                    t0 = time.perf_counter()
                    self.fn(*self.inputs)
                    out.append(time.perf_counter() - t0)
        return out


def ratio_pair(runnables: list[Runnable], feeds: dict, seconds: float) -> tuple[float, float, float]:
    """(original ms, optimized ms, original / optimized) from one side-by-side timing."""
    a, b = time_runnables(runnables, feeds, min_seconds=seconds)
    for r in runnables:
        r.close()
    return a.median * 1e3, b.median * 1e3, a.median / b.median


def measure(name: str, args: argparse.Namespace) -> dict[str, Any]:
    graph = zoo.build(name)
    target = get_target(args.target)
    feeds = random_feeds(graph_input_specs(graph))
    row: dict[str, Any] = {"model": name, "nodes": len(graph)}

    t0 = time.perf_counter()
    data, rep = optimize_model(graph, label=name, time_limit=args.time_limit, target=target,
                               measure_seconds=args.seconds)
    row.update(search_s=rep.search["seconds"], total_s=time.perf_counter() - t0,
               rules=rep.rules_used, kept_original=rep.kept_original,
               confirmed_ratio=rep.speedup, predicted_ms=rep.predicted_ms_before,
               predicted_after_ms=rep.predicted_ms_after, device=rep.device)
    best = graph if rep.kept_original else graphsub.load(data)

    def programs(g):
        return target.program(g)

    cuda = target.torch_device.type == "cuda"
    pair = [programs(graph), programs(best)]
    if cuda:
        row["graphs_ms"], row["graphs_opt_ms"], row["graphs_ratio"] = ratio_pair(
            [TorchRunnable(p, cuda_graphs=True) for p in pair], feeds, args.seconds)
    row["eager_ms"], row["eager_opt_ms"], row["eager_ratio"] = ratio_pair(
        [TorchRunnable(p, cuda_graphs=False) for p in pair], feeds, args.seconds)
    row["measured_ms"] = row["graphs_ms"] if cuda else row["eager_ms"]

    analytic = graphsub.optimize(graph, cost=make_cost_model("analytic", target=target),
                                 time_limit=args.time_limit)
    row["analytic_rules"] = dict(analytic.rules_used())
    apair = [programs(graph), programs(analytic.graph)]
    row["analytic_ms"], row["analytic_opt_ms"], row["analytic_ratio"] = ratio_pair(
        [TorchRunnable(p, cuda_graphs=cuda) for p in apair], feeds, args.seconds)

    if args.inductor:
        try:
            row["inductor_ms"], row["inductor_opt_ms"], row["inductor_ratio"] = ratio_pair(
                [CompiledRunnable(p, n) for p, n in zip(pair, ("original", "optimized"))],
                feeds, args.seconds)
        except Exception as exc:  # noqa: BLE001 - report it and go on with the other models
            row["inductor_error"] = f"{type(exc).__name__}: {exc}"[:300]
    return row


def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def fmt(x: Any, digits: int = 3) -> str:
    return f"{x:.{digits}f}" if isinstance(x, (int, float)) else "-"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default=None)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--no-inductor", dest="inductor", action="store_false")
    ap.add_argument("--out", default="out/bench/targets.json")
    args = ap.parse_args()
    args.target = args.target or ("torch-cuda" if torch.cuda.is_available() else "torch-cpu")
    rows = []
    for name in args.models.split(","):
        row = measure(name, args)
        rows.append(row)
        print(json.dumps(row, default=str), flush=True)
    meta = {"target": args.target, "date": date.today().isoformat(), "host": platform.node(),
            "device": rows[0]["device"] if rows else {}, "torch": torch.__version__,
            "time_limit": args.time_limit, "command": " ".join(sys.argv)}
    save_rows(args.out, meta, rows)

    main_ratio = "graphs_ratio" if args.target == "torch-cuda" else "eager_ratio"
    print(f"\n{meta['device']} -- {meta['date']} -- `{meta['command']}`\n")
    headers = ["model", "search s", "rules applied", "confirmed", "ratio (main)", "eager ratio",
               "inductor orig ms", "inductor opt ms", "inductor ratio", "analytic-search ratio"]
    print(markdown(headers, [
        [r["model"], fmt(r["search_s"], 1), rules_text(r["rules"]), fmt(r["confirmed_ratio"]),
         fmt(r.get(main_ratio)), fmt(r["eager_ratio"]), fmt(r.get("inductor_ms")),
         fmt(r.get("inductor_opt_ms")), fmt(r.get("inductor_ratio")), fmt(r["analytic_ratio"])]
        for r in rows]))
    ratios = [r[main_ratio] for r in rows if r.get(main_ratio)]
    print(f"\ngeometric mean of the main ratio: {geomean(ratios):.3f} over {len(ratios)} models; "
          f"slowest {min(ratios):.3f}")
    print("\n| model | predicted ms (sum of measured op costs) | measured ms |")
    print("|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {fmt(r['predicted_ms'])} | {fmt(r['measured_ms'])} |")
    logs = [(math.log(r["predicted_ms"]), math.log(r["measured_ms"])) for r in rows]
    if len(logs) > 2:
        import numpy as np

        corr = float(np.corrcoef(np.array(logs).T)[0, 1])
        err = float(np.median([abs(math.exp(p - m) - 1) for p, m in logs]))
        print(f"\nlog correlation {corr:.4f}, median |error| {100 * err:.1f}%")


if __name__ == "__main__":
    main()
