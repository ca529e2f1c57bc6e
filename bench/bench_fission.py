"""Operator fission and kernel orchestration (issue 18): the two ways of choosing kernels side
by side, and what the orchestration chooses on a target.

    python bench/bench_fission.py ways [--models ...] [--time-limit 60]
    python bench/bench_fission.py target --target ort-cpu [--models ...]

`ways`: on each model, Korch's way (fission, candidate kernels, the binary linear program) and
the e-graph way (fission and kernel rules together in Tensat's equality saturation, ILP
extraction), both priced by the analytic cost model (deterministic, so the two compare
exactly), started from the model and from its primitive graph. Prints predicted costs and
seconds.

`target`: fission and orchestration priced by the measured cost model of a target: the
candidates, the kernels chosen, and the predicted cost against the model's.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import graphsub
from graphsub import zoo
from graphsub.targets import get_target
from graphsub.cost import AnalyticCostModel, make_cost_model
from graphsub.fission import fission, fission_rules, kernel_rules
from graphsub.fission.stage import fission_and_orchestrate
from graphsub.rules.roles import Role

MODELS = ["softmax_subgraph", "linear_attention", "bert:layers=2", "vit:layers=2",
          "segformer:image=128"]


def ways(models: list[str], time_limit: float) -> None:
    print("| model | original ms | BLP ms | BLP s | eqsat from model ms | s | stop | "
          "eqsat from primitives ms | s | stop |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    # fission's and the kernel rules, and only they, searched with (their files declare the
    # fission and kernel roles, which no search reads of itself)
    rules = [dataclasses.replace(r, roles=frozenset({Role.SEARCH}))
             for r in (*fission_rules(), *kernel_rules())]
    for spec in models:
        graph = zoo.build(spec)
        cost = AnalyticCostModel()
        start = time.perf_counter()
        outcome = fission_and_orchestrate(graph, cost, time_limit=time_limit)
        blp_s = time.perf_counter() - start
        row = [spec, f"{cost.graph_cost(graph) * 1e3:.4f}", f"{outcome.cost * 1e3:.4f}",
               f"{blp_s:.2f}"]
        for begin in (graph, fission(graph)):
            start = time.perf_counter()
            result = graphsub.optimize(begin, rules, algorithm="eqsat", rules_only=True,
                                       cost=cost, time_limit=time_limit)
            row += [f"{result.final_cost * 1e3:.4f}", f"{time.perf_counter() - start:.1f}",
                    str(result.stats.stopped_by)]
        print("| " + " | ".join(row) + " |", flush=True)


def on_target(models: list[str], target_name: str) -> None:
    target = get_target(target_name)
    print(f"target {target_name}: {target.device().describe()}")
    print("| model | predicted original ms | orchestrated ms | candidates | kernels chosen | s |")
    print("|---|---|---|---|---|---|")
    for spec in models:
        graph = zoo.build(spec)
        cost = make_cost_model("measured", target)
        start = time.perf_counter()
        outcome = fission_and_orchestrate(graph, cost, target.runs_as_one_kernel)
        seconds = time.perf_counter() - start
        kernels = ", ".join(f"{k['count']} {k['kernel']}" for k in outcome.as_dict()["kernels"])
        candidates = ", ".join(f"{n} {kind}" for kind, n in outcome.candidates.items())
        print(f"| {spec} | {cost.graph_cost(graph) * 1e3:.3f} | {outcome.cost * 1e3:.3f} | "
              f"{candidates} | {kernels or 'none'} | {seconds:.1f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("part", choices=["ways", "target"])
    parser.add_argument("--models", nargs="*", default=MODELS)
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--target", default="ort-cpu")
    args = parser.parse_args()
    if args.part == "ways":
        ways(args.models, args.time_limit)
    else:
        on_target(args.models, args.target)


if __name__ == "__main__":
    main()
