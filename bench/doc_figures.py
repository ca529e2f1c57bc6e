"""Figures the docs quote that no other benchmark measures (issue 52, item 6), each measured
again before it is written:

    python bench/doc_figures.py imports          # seconds to import onnxruntime, torch and the peers
    python bench/doc_figures.py egraph-clone     # EGraph.clone() of a ~2,000-node e-graph
    python bench/doc_figures.py fission-groups   # generated-kernel candidates on Segformer 128x128,
                                                 # and seconds per inductor compilation
    python bench/doc_figures.py cold-weights     # NasRNN's products priced with hot and cold weights

Run fission-groups with an empty GRAPHSUB_CACHE_DIR (and TORCHINDUCTOR_CACHE_DIR), so that no
compilation comes from an earlier run's cache; cold-weights times every operator afresh and
caches nothing. Each prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable


def imports(runs: int) -> dict[str, object]:
    """Seconds to import each package in a fresh interpreter (median of `runs`)."""
    out: dict[str, object] = {}
    for package in ("onnxruntime", "torch", "onnxsim", "onnxslim", "onnxscript"):
        code = (f"import time; t = time.perf_counter(); import {package}; "
                "print(time.perf_counter() - t)")
        seconds = []
        for _ in range(runs):
            done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
            if done.returncode != 0:
                seconds = []
                break
            seconds.append(float(done.stdout.strip().splitlines()[-1]))
        out[package] = ({"median_s": round(statistics.median(seconds), 3),
                         "runs_s": [round(s, 3) for s in seconds]} if seconds
                        else "not importable")
    return out


def egraph_clone(model: str, node_limit: int, runs: int) -> dict[str, object]:
    """Grow an e-graph of `model` with the built-in rules up to `node_limit` e-nodes (MCTS's
    default), then time EGraph.clone() and Runner.clone() (medians of `runs`)."""
    from graphsub import zoo
    from graphsub.egraph.egraph import egraph_from_graph
    from graphsub.egraph.runner import Runner
    from graphsub.rules import builtin_rules

    rules = builtin_rules()
    runner = Runner(egraph_from_graph(zoo.build(model)).egraph, rules, node_limit=node_limit)
    everything = list(range(len(rules)))
    while not runner.full and runner.iterate(everything):
        pass

    def median_ms(make: Callable[[], object]) -> float:
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            make()
            times.append(time.perf_counter() - start)
        return round(statistics.median(times) * 1e3, 4)

    return {"model": model, "e-nodes": runner.egraph.num_nodes,
            "classes": runner.egraph.num_classes,
            "egraph_clone_ms": median_ms(runner.egraph.clone),
            "runner_clone_ms": median_ms(runner.clone)}


def fission_groups(model: str, target_name: str, compile_count: int) -> dict[str, object]:
    """Count the generated-kernel candidates of `model` after fission (connected, convex
    groups of up to MAX_GROUP primitives, and their variants), then price the
    `compile_count` most promising on the target, each an inductor compilation, timed."""
    from graphsub import zoo
    from graphsub.cost import make_cost_model
    from graphsub.cost.analytic import AnalyticCostModel
    from graphsub.fission.candidates import FUSABLE, connected_groups, group_kernels
    from graphsub.fission.primitives import category, fission
    from graphsub.fission.stage import MAX_GROUP
    from graphsub.targets import get_target

    primitive = fission(zoo.build(model))
    weight_only = primitive.weight_only()

    def allowed(nid: int) -> bool:
        return nid not in weight_only and category(primitive[nid].op) in FUSABLE

    groups = sum(1 for _ in connected_groups(primitive, MAX_GROUP, allowed))
    analytic = AnalyticCostModel()
    alone = analytic.priced(primitive)[1]
    kernels = group_kernels(primitive, MAX_GROUP, analytic.graph_cost)
    gain = {id(k): sum(alone[n] for n in k.nodes) - k.cost for k in kernels}
    promising = sorted((k for k in kernels if gain[id(k)] > 0), key=lambda k: -gain[id(k)])
    cost_model = make_cost_model("measured", get_target(target_name))
    seconds, bodies = [], set()
    for k in promising:
        if len(seconds) >= compile_count:
            break
        if k.graph.structural_hash() in bodies:  # the same body and types: priced once
            continue
        bodies.add(k.graph.structural_hash())
        start = time.perf_counter()
        cost_model.graph_cost(k.graph)
        seconds.append(round(time.perf_counter() - start, 2))
    return {"model": model, "primitives": len(primitive.nodes), "groups": groups,
            "candidates (variants)": len(kernels), "predicted to save": len(promising),
            "target": target_name, "compilations_s": seconds,
            "median after the first_s": (round(statistics.median(seconds[1:]), 2)
                                         if len(seconds) > 1 else None)}


def cold_weights(model: str, target_name: str, rounds: int) -> dict[str, object]:
    """The model's matrix products priced on the target with its weights hot (in the caches)
    and cold (read from memory, as a model larger than the last-level cache reads them)."""
    from graphsub import zoo
    from graphsub.cost.measured import MeasuredCostModel
    from graphsub.targets import get_target

    graph = zoo.build(model)
    target = get_target(target_name)
    weights = sum(graph[n].type.nbytes for n in graph.nodes_by_op("weight"))
    products = [n for n in graph.nodes if graph[n].op == "matmul"]
    priced: dict[str, list[float]] = {"hot": [], "cold": []}
    for _ in range(rounds):  # alternately, each time timed afresh (no cache)
        for cold in (False, True):
            per_node = MeasuredCostModel(target, cache=False, cold_weights=cold).priced(graph)[1]
            priced["cold" if cold else "hot"].append(sum(per_node[n] for n in products))
    hot, cold_ = (statistics.median(priced[k]) for k in ("hot", "cold"))
    return {"model": model, "target": target_name, "weights_MB": round(weights / 1e6, 1),
            "last_level_cache_MB": round(target.cache_bytes() / 1e6, 1),
            "products": len(products),
            "hot_ms": [round(s * 1e3, 3) for s in priced["hot"]],
            "cold_ms": [round(s * 1e3, 3) for s in priced["cold"]],
            "hot / cold (medians)": round(hot / cold_, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="figure", required=True)
    p = sub.add_parser("imports")
    p.add_argument("--runs", type=int, default=3)
    p = sub.add_parser("egraph-clone")
    p.add_argument("--model", default="nasrnn")
    p.add_argument("--node-limit", type=int, default=2000)
    p.add_argument("--runs", type=int, default=200)
    p = sub.add_parser("fission-groups")
    p.add_argument("--model", default="segformer:image=128")
    p.add_argument("--target", default="torch-cpu")
    p.add_argument("--compile", type=int, default=6)
    p = sub.add_parser("cold-weights")
    p.add_argument("--model", default="nasrnn")
    p.add_argument("--target", default="ort-cpu")
    p.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.figure == "imports":
        result = imports(args.runs)
    elif args.figure == "egraph-clone":
        result = egraph_clone(args.model, args.node_limit, args.runs)
    elif args.figure == "fission-groups":
        result = fission_groups(args.model, args.target, args.compile)
    else:
        result = cold_weights(args.model, args.target, args.rounds)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
