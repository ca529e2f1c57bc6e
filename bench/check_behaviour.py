"""Whether two source trees search alike: every algorithm on zoo models, bounded by work, not
time, so the result does not depend on the machine's speed or load.

    python bench/check_behaviour.py --before /tmp/before/src [--models squeezenet,nasrnn]

runs each algorithm (analytic a100 cost, the built-in rules; backtracking and greedy 60
expansions, the OCGGS searches k = 2, eqsat 3 iterations, mcts 4 iterations per decision; a
time limit of an hour that none reaches) on each model with the tree given as --before (a
checkout of an older commit) and with this checkout's, in separate processes, and prints the
final costs and the rules each applied, side by side, with any difference. It exits 1 when
a result differs. A refactoring that is meant to change nothing should print no difference.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1] / "src"

#: Per algorithm: the settings that bound it by work.
BOUNDS: dict[str, dict[str, int]] = {
    "backtracking": {"budget": 60}, "greedy": {"budget": 60},
    "pruning": {"k": 2}, "dpp": {"k": 2}, "sampling": {"k": 2}, "enumeration": {"k": 2},
    "eqsat": {"budget": 3}, "mcts": {"budget": 4},
}

CHILD = """
import json, sys
import graphsub
from graphsub import zoo
from graphsub.cost import AnalyticCostModel
from graphsub.rules import builtin_rules
model, algorithm, bounds = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
g = zoo.build(model)
r = graphsub.optimize(g, builtin_rules(), algorithm, cost=AnalyticCostModel("a100"),
                      time_limit=3600.0, **bounds)
print(json.dumps({"initial": r.initial_cost, "final": r.final_cost,
                  "rules": dict(sorted(r.rules_used().items())),
                  "stopped_by": str(r.stats.stopped_by)}))
"""


def run(src: Path, model: str, algorithm: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, model, algorithm,
                          json.dumps(BOUNDS[algorithm])], check=True, capture_output=True,
                         text=True, env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"})
    return json.loads(out.stdout.strip().splitlines()[-1])


def same(a: dict, b: dict) -> bool:
    close = abs(a["final"] - b["final"]) <= 1e-9 * max(abs(a["final"]), 1e-30)
    return close and a["rules"] == b["rules"] and a["stopped_by"] == b["stopped_by"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="src/ of the older checkout")
    parser.add_argument("--models", default="squeezenet,nasrnn,bert")
    parser.add_argument("--algorithms", default=",".join(BOUNDS))
    args = parser.parse_args()
    differ = 0
    print("| model | algorithm | final cost ratio | rules applied | stopped by | same |")
    print("|---|---|---|---|---|---|")
    for model in args.models.split(","):
        for algorithm in args.algorithms.split(","):
            before, now = run(Path(args.before), model, algorithm), run(HERE, model, algorithm)
            ok = same(before, now)
            differ += not ok
            ratio = now["final"] / now["initial"]
            applied = sum(now["rules"].values())
            print(f"| {model} | {algorithm} | {ratio:.4f} | {applied} | {now['stopped_by']} | "
                  f"{'yes' if ok else 'NO'} |", flush=True)
            if not ok:
                print(f"<!-- before {json.dumps(before)}\n     now {json.dumps(now)} -->",
                      flush=True)
    print(f"\n{differ} difference(s)")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
