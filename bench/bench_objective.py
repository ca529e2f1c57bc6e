"""MetaFlow's multi-objective cost, as `--objective` reaches it: what weighing peak memory
does to what the search keeps.

    python bench/bench_objective.py [--models squeezenet,resnext50,inception_v3,nasrnn]
        [--objectives latency,latency+memory=0.3,latency+memory=1] [--budget 200]

Each model is searched (backtracking, the built-in rules) under the deterministic analytic
a100 profile, bounded by expansions, once per objective; the table gives, for the graph each
search returns, its predicted latency and its peak memory (graphsub.cost.multi.peak_memory:
weights held plus the most activation bytes alive at once in topological order) against the
input model's, and the rules applied. Objectives are written with '+' for ',' on the command
line of this script (a comma separates objectives).
"""

from __future__ import annotations

import argparse
import sys
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from tables import markdown, rules_text, save_rows  # noqa: E402

import graphsub  # noqa: E402
from graphsub import zoo  # noqa: E402
from graphsub.cost import AnalyticCostModel  # noqa: E402
from graphsub.cost.multi import peak_memory  # noqa: E402
from graphsub.pipeline import Objective  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="squeezenet,resnext50,inception_v3,nasrnn")
    parser.add_argument("--objectives",
                        default="latency,latency+memory=0.3,latency+memory=1")
    parser.add_argument("--budget", type=int, default=200)
    parser.add_argument("--out", default="out/bench/objective.json")
    args = parser.parse_args()
    rows, lines = [], []
    for name in args.models.split(","):
        graph = zoo.build(name)
        time_model = AnalyticCostModel("a100")
        latency0, memory0 = time_model.graph_cost(graph), peak_memory(graph)
        for text in args.objectives.split(","):
            objective = Objective.parse(text.replace("+", ","))
            result = graphsub.optimize(graph, cost=AnalyticCostModel("a100"), time_limit=3600,
                                       budget=args.budget, objective=objective)
            latency = time_model.graph_cost(result.graph) / latency0
            memory = peak_memory(result.graph) / memory0
            rules = dict(result.rules_used().most_common())
            rows.append({"model": name, "objective": objective.describe(), "latency": latency,
                         "peak_memory": memory, "peak_memory_mb": peak_memory(result.graph) / 1e6,
                         "input_peak_memory_mb": memory0 / 1e6, "rules": rules,
                         "seconds": result.stats.seconds})
            lines.append([name, objective.describe(), f"{latency:.3f}", f"{memory:.3f}",
                          f"{memory0 / 1e6:.1f}", rules_text(rules)])
            print(lines[-1], flush=True)
    save_rows(args.out, {"date": str(date.today()), "budget": args.budget,
                         "cost": "analytic a100"}, rows)
    print(markdown(["model", "objective", "predicted latency / input", "peak memory / input",
                    "input peak MB", "rules applied"], lines))


if __name__ == "__main__":
    main()
