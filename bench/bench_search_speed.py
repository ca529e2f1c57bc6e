"""Expansions per second of the backtracking search, for two source trees side by side.

    python bench/bench_search_speed.py --before /tmp/before/src --seconds 30

runs the same search (backtracking, alpha 1.05, the built-in rules, the deterministic
analytic a100 profile) for the same time on each model with the source tree given as
--before (a checkout of an older commit) and with this checkout's, in separate processes,
one after the other (--rounds times, the order swapped every round, so that a drifting load
falls on both sides alike), and prints graphs expanded and generated per second and the
median of the rounds' ratios.

    python bench/bench_search_speed.py --before /tmp/before/src --budget 1500 --rounds 5

bounds the search by work instead: after a short warm-up search, each side expands the same
number of graphs, timed in CPU seconds of its own process (`time.process_time()`), which a
busy machine disturbs less than wall-clock rates; "expanded/s" is then per CPU second.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import statistics
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tables import markdown, save_rows  # noqa: E402

HERE = Path(__file__).resolve().parents[1] / "src"

CHILD = """
import json, sys, time
from graphsub import optimize, zoo
from graphsub.cost import AnalyticCostModel
from graphsub.rules import builtin_rules
g, rules, cost = zoo.build(sys.argv[1]), builtin_rules(), AnalyticCostModel("a100")
seconds, budget = float(sys.argv[2]), int(sys.argv[3])
if budget:
    optimize(g, rules, "backtracking", cost=cost, time_limit=3600.0, budget=20)  # warm-up
started = time.process_time()
r = optimize(g, rules, "backtracking", cost=cost, time_limit=seconds if not budget else 3600.0,
             budget=budget or 10**9)
stats = r.stats.as_dict()
if budget:
    stats["seconds"] = time.process_time() - started
print(json.dumps({"nodes": len(g), **stats, "initial": r.initial_cost, "final": r.final_cost}))
"""


def run(src: Path, model: str, seconds: float, budget: int) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, model, str(seconds), str(budget)],
                         check=True, capture_output=True, text=True,
                         env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"})
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", required=True, help="src/ of the older checkout")
    parser.add_argument("--models", default="nasnet_a,bert,nasrnn,inception_v3")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--budget", type=int, default=0,
                        help="expand this many graphs a side, timed in CPU seconds (0: "
                             "--seconds of wall-clock time a side)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="before/now pairs per model, the order alternating")
    parser.add_argument("--out", default="out/bench/search_speed.json")
    args = parser.parse_args()
    def rate(s: dict, key: str) -> float:
        return s[key] / s["seconds"]

    rows = []
    for model in args.models.split(","):
        pairs = []
        for k in range(args.rounds):
            if k % 2:
                now = run(HERE, model, args.seconds, args.budget)
                before = run(Path(args.before), model, args.seconds, args.budget)
            else:
                before = run(Path(args.before), model, args.seconds, args.budget)
                now = run(HERE, model, args.seconds, args.budget)
            pairs.append((before, now))
        ratios = [rate(n, "explored") / rate(b, "explored") for b, n in pairs]
        middle = sorted(range(len(pairs)), key=lambda i: ratios[i])[len(pairs) // 2]
        before, now = pairs[middle]
        row = {"model": model, "nodes": now["nodes"], "before": before, "now": now,
               "ratios": ratios, "median_ratio": statistics.median(ratios)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    meta = {"date": date.today().isoformat(), "command": " ".join(sys.argv),
            "seconds": args.seconds, "budget": args.budget, "rounds": args.rounds}
    save_rows(args.out, meta, rows)

    lines = []
    for r in rows:
        b, n = r["before"], r["now"]
        spread = (f" ({min(r['ratios']):.2f}-{max(r['ratios']):.2f})"
                  if len(r["ratios"]) > 1 else "")
        lines.append([r["model"], str(r["nodes"]), f"{rate(b, 'explored'):.2f}",
                      f"{rate(n, 'explored'):.2f}", f"{r['median_ratio']:.2f}x{spread}",
                      f"{rate(b, 'generated'):.0f}", f"{rate(n, 'generated'):.0f}",
                      f"{n.get('matches_reused', 0)} / {n.get('matches_computed', 0)}",
                      f"{b['final'] / b['initial']:.4f}", f"{n['final'] / n['initial']:.4f}"])
    print(f"\n{meta}\n")
    print(markdown(["model", "nodes", "expanded/s before", "expanded/s now", "ratio",
                    "generated/s before", "generated/s now", "matches reused / computed",
                    "cost ratio before", "cost ratio now"], lines))


if __name__ == "__main__":
    main()
