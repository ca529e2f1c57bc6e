"""Extraction on Tensat's reference e-graphs (issue 10): tree greedy, DAG greedy and the ILP.

    python bench/bench_extraction.py [--time-limit 60] [--names bert,vgg_acyclic]
        [--json out/bench/extraction.json]

The six e-graphs extraction-gym took from Tensat (bert, resnet50, vgg, each also `_acyclic`;
../shared/data/extraction-gym-tensat), each extracted by `tree_greedy` (egg's default),
`dag_greedy` (the MCTS paper's cost function) and `ilp` (HiGHS, --time-limit seconds). Costs
are the DAG cost of each extraction (TASO's measured operator times, ms); the gaps are to the
ILP's cost, so they are exact gaps where the ILP proved its optimum and gaps to the best
known extraction otherwise ("ILP bound" is then HiGHS's proven lower bound). The greedy
extractors' own estimates of the root's cost are shown too, as the MCTS paper's Tables 1 and 3
report them: the tree cost counts a subgraph once per use. Prints a JSON line per e-graph as it
goes, then a markdown table (for bench/RESULTS.md) and last a rich table.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import date
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tables import markdown, save_rows  # noqa: E402

from graphsub.egraph.extract import dag_greedy, ilp, tree_greedy  # noqa: E402
from graphsub.egraph.serialized import load_serialized  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "extraction-gym-tensat"
NAMES = "bert,bert_acyclic,resnet50,resnet50_acyclic,vgg,vgg_acyclic"
HEADERS = ["e-graph", "nodes", "classes", "tree-greedy", "gap", "dag-greedy", "gap",
           "ILP", "ILP status", "ILP bound", "s tree", "s dag", "s ILP",
           "tree estimate", "dag estimate"]


def run(path: Path, time_limit: float) -> dict[str, Any]:
    problem = load_serialized(path)
    tree, dag, exact = tree_greedy(problem), dag_greedy(problem), ilp(problem, time_limit)
    row = {"egraph": path.stem, "nodes": problem.num_nodes, "classes": problem.num_classes,
           "time_limit": time_limit, "ilp_status": exact.status, "ilp_bound": exact.bound}
    for name, e in (("tree", tree), ("dag", dag), ("ilp", exact)):
        row |= {f"{name}_cost": e.cost, f"{name}_seconds": round(e.seconds, 3),
                f"{name}_estimate": e.estimate, f"{name}_classes": len(e.choice)}
    print(json.dumps(row), flush=True)
    return row


def gap(row: dict[str, Any], name: str) -> str:
    return f"{100 * (row[f'{name}_cost'] / row['ilp_cost'] - 1):+.2f}%"


def cells(row: dict[str, Any]) -> list[str]:
    bound = "" if row["ilp_bound"] is None else f"{row['ilp_bound']:.4f}"
    return [row["egraph"], str(row["nodes"]), str(row["classes"]),
            f"{row['tree_cost']:.4f}", gap(row, "tree"), f"{row['dag_cost']:.4f}", gap(row, "dag"),
            f"{row['ilp_cost']:.4f}", row["ilp_status"], bound,
            f"{row['tree_seconds']:.2f}", f"{row['dag_seconds']:.2f}",
            f"{row['ilp_seconds']:.1f}", f"{row['tree_estimate']:.4g}",
            f"{row['dag_estimate']:.4g}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA, help="folder of the JSON e-graphs")
    parser.add_argument("--names", default=NAMES, help="comma-separated e-graph names")
    parser.add_argument("--time-limit", type=float, default=60.0, help="ILP seconds")
    parser.add_argument("--json", type=Path, help="save the rows here")
    args = parser.parse_args()
    rows = [run(args.data / f"{name}.json", args.time_limit) for name in args.names.split(",")]
    if args.json:
        save_rows(args.json, {"date": date.today().isoformat(), "command": " ".join(sys.argv)},
                  rows)
    print()
    print(markdown(HEADERS, [cells(row) for row in rows]))
    table = Table(title=f"extraction, DAG cost (ms), ILP limit {args.time_limit:g} s",
                  title_justify="left")
    for header in HEADERS:
        table.add_column(header, justify="left" if "e-graph" in header or "status" in header
                         else "right")
    for row in rows:
        table.add_row(*cells(row))
    Console(width=max(Console().width, 180)).print(table)  # 15 columns: do not squeeze


if __name__ == "__main__":
    main()
