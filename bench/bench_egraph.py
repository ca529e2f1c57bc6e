"""The e-graph searches on the zoo: eqsat (Tensat's schedule) and MCTS next to backtracking,
sampling and the original, under the analytic `a100` profile or the measured cost of this
machine (onnxruntime on the CPU), with search times and e-graph growth.

    python bench/bench_egraph.py --cost a100 --json /tmp/egraph_a100.json
    python bench/bench_egraph.py --cost measured --algorithms backtracking,eqsat,mcts
    python bench/bench_egraph.py --initial-extraction   # the MCTS paper's Table 1 on the zoo

Rules: the built-in library and TASO's graph_subst.pb (as bench_algorithms.py). The last lines
printed are a table: each algorithm's final cost as a fraction of the original's, its search
seconds, and for the e-graph searches e-nodes, e-nodes added per second of construction and
seconds per MCTS iteration. The MCTS paper's reductions (Tables 2 and 4) are printed beside.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from graphsub import zoo  # noqa: E402
from graphsub.cost import AnalyticCostModel, make_cost_model  # noqa: E402
from graphsub.targets import get_target  # noqa: E402
from graphsub.optimizer import optimize  # noqa: E402
from graphsub.rules import builtin_rules, load_rules  # noqa: E402

TASO_RULES = Path(__file__).resolve().parents[2] / "shared" / "data" / "taso" / "graph_subst.pb"
MODELS = ["nasrnn", "bert", "resnext50", "nasnet_a", "inception_v3", "squeezenet"]
#: Runtime reduction (%) over the original in the paper's cost model: TENSAT, and MCTS with
#: OCF/ILP extraction (the setting graphsub's mcts defaults to). MCTS paper, Table 4 (P100),
#: where the issue's figures come from, and Table 2 (A100).
PAPER = {
    "nasrnn": {"P100": (10.22, 18.93), "A100": (36.92, 41.19)},
    "bert": {"P100": (22.35, 14.03), "A100": (18.27, 14.63)},
    "resnext50": {"P100": (27.11, 28.43), "A100": (None, None)},
    "nasnet_a": {"P100": (17.83, 23.14), "A100": (11.18, 17.71)},
    "inception_v3": {"P100": (18.34, 18.94), "A100": (0.36, -0.01)},
    "squeezenet": {"P100": (29.74, 33.17), "A100": (46.02, 48.16)},
}


def cost_model(name: str):
    if name == "measured":
        return make_cost_model("measured", target=get_target("ort-cpu"))
    return AnalyticCostModel(name)


def run(model: str, algorithm: str, rules: list, cost, seconds: float,
        node_limit: int | None) -> dict[str, Any]:
    graph = zoo.build(model)
    started = time.perf_counter()
    result = optimize(graph, rules, algorithm, cost=cost, time_limit=seconds,
                      node_limit=node_limit, budget=None if algorithm in ("eqsat", "mcts")
                      else 10**9)
    wall = time.perf_counter() - started
    eg = result.stats.egraph
    row: dict[str, Any] = {
        "model": model, "algorithm": algorithm, "node_limit": node_limit, "limit": seconds,
        "wall": round(wall, 2), "initial": result.initial_cost, "final": result.final_cost,
        "ratio": result.final_cost / result.initial_cost, "steps": len(result.trace),
        "stopped_by": result.stats.stopped_by}
    if eg:
        extraction = sum(d["seconds"] for d in eg["extraction"].values())
        construction = max(result.stats.seconds - extraction, 1e-9)
        row.update(enodes=eg["nodes"], classes=eg["classes"], initial_nodes=len(graph),
                   construction_s=round(construction, 2), extraction=eg["extraction"],
                   enodes_per_s=round((eg["nodes"] - len(graph)) / construction, 1),
                   applications=eg["applications"], decisions=len(eg.get("decisions", [])))
        if "mcts" in eg:
            row["mcts"] = eg["mcts"]
    print(json.dumps(row, default=str), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cost", default="a100", help="analytic profile, or 'measured'")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--algorithms", default="backtracking,sampling,eqsat,eqsat@2000,mcts",
                        help="eqsat@N: eqsat with node limit N")
    parser.add_argument("--seconds", type=float, default=20.0,
                        help="time limit of backtracking and sampling")
    parser.add_argument("--eqsat-seconds", type=float, default=60.0)
    parser.add_argument("--mcts-seconds", type=float, default=90.0)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--initial-extraction", action="store_true",
                        help="only extract from each model's initial e-graph (no rules): each "
                             "extractor's estimate against the ILP, as the MCTS paper's Table 1")
    args = parser.parse_args()
    if args.initial_extraction:
        initial_extraction(args.models.split(","), cost_model(args.cost))
        return
    rules = builtin_rules() + (load_rules([TASO_RULES]) if TASO_RULES.exists() else [])
    cost = cost_model(args.cost)
    rows = []
    for model in args.models.split(","):
        for spec in args.algorithms.split(","):
            algorithm, _, limit = spec.partition("@")
            seconds = {"eqsat": args.eqsat_seconds, "mcts": args.mcts_seconds}.get(
                algorithm, args.seconds)
            rows.append(run(model, algorithm, rules, cost, seconds,
                            int(limit) if limit else None))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1, default=str))
    print_table(rows, args.cost, len(rules))


def initial_extraction(models: list[str], cost) -> None:
    from graphsub.egraph import extract
    from graphsub.egraph.egraph import egraph_from_graph
    from graphsub.egraph.readback import NodeCosts, extraction_problem

    print("| model | graph cost | ILP | DAG-greedy estimate | tree-greedy estimate |")
    print("|---|---|---|---|---|")
    for model in models:
        graph = zoo.build(model)
        enc = egraph_from_graph(graph)
        problem = extraction_problem(enc.egraph, enc.outputs, NodeCosts(cost)).problem
        ilp, dag, tree = (extract.ilp(problem, 60.0), extract.dag_greedy(problem),
                          extract.tree_greedy(problem))
        print(f"| {model} | {cost.graph_cost(graph) * 1e3:.4f} | {ilp.cost * 1e3:.4f} | "
              f"{dag.estimate * 1e3:.4f} | {tree.estimate * 1e3:.4g} |")


def print_table(rows: list[dict[str, Any]], cost: str, n_rules: int) -> None:
    specs = list(dict.fromkeys(r["algorithm"] + (f"@{r['node_limit']}" if r["node_limit"]
                                                  else "") for r in rows))
    table = Table(title=f"e-graph searches on the zoo, cost {cost}, {n_rules} rules: "
                        "final / original cost (search s)")
    table.add_column("model")
    for s in specs:
        table.add_column(s, justify="right")
    table.add_column("e-nodes/s (eqsat)", justify="right")
    table.add_column("s/MCTS iter", justify="right")
    table.add_column("paper P100 TENSAT/MCTS %", justify="right")
    for model in dict.fromkeys(r["model"] for r in rows):
        cells = []
        growth = mcts = "-"
        for s in specs:
            algorithm, _, limit = s.partition("@")
            r = next((r for r in rows if r["model"] == model and r["algorithm"] == algorithm
                      and (r["node_limit"] or None) == (int(limit) if limit else None)), None)
            cells.append("-" if r is None else f"{r['ratio']:.3f} ({r['wall']:.0f})")
            if r is not None and algorithm == "eqsat" and not limit:
                growth = f"{r['enodes_per_s']:.0f} ({r['enodes']})"
            if r is not None and algorithm == "mcts":
                mcts = f"{r['mcts']['seconds_per_iteration']}"
        tensat, ours = PAPER.get(model, {}).get("P100", (None, None))
        table.add_row(model, *cells, growth, mcts, f"{tensat} / {ours}")
    Console(width=200).print(table)


if __name__ == "__main__":
    main()
