"""Equality saturation with every rule every iteration (Tensat's schedule) against egg's
back-off scheduler, on zoo models: final cost, iterations, e-nodes, seconds, and how many
iterations banned a rule.

    PYTHONPATH=src python bench/bench_scheduler.py [--models squeezenet,bert] [--time 40]
"""

from __future__ import annotations

import argparse
import time
import warnings

from graphsub import zoo
from graphsub.cost import AnalyticCostModel
from graphsub.egraph.saturation import EqsatOptions, eqsat_search
from graphsub.rules import builtin_rules
from graphsub.search import Limits


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="squeezenet,nasrnn,bert,resnext50,inception_e_blocks")
    ap.add_argument("--time", type=float, default=40.0)
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    rules, cost = builtin_rules(check=False), AnalyticCostModel("a100")
    print("| model | scheduler | final / initial cost | iterations | e-nodes | stopped | "
          "seconds | iterations with a ban |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        graph = zoo.build(name)
        for scheduler in ("simple", "backoff"):
            start = time.perf_counter()
            result = eqsat_search(graph, rules, cost, Limits(time=args.time),
                                  EqsatOptions(scheduler=scheduler))
            seconds = time.perf_counter() - start
            eg = result.stats.egraph
            banned = sum(1 for record in eg["log"] if record["banned"])
            print(f"| {name} | {scheduler} | {result.final_cost / result.initial_cost:.4f} | "
                  f"{eg['iterations']} | {eg['nodes']} | {eg['stopped_by']} | {seconds:.1f} | "
                  f"{banned} |")


if __name__ == "__main__":
    main()
