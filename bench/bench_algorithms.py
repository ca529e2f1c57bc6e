"""The search algorithms compared, as OCGGS's section 6 does, under the deterministic analytic
a100 profile (results compare across machines; only the times depend on this one).

    python bench/bench_algorithms.py reference --models nasrnn,bert --seconds 600
    python bench/bench_algorithms.py quality --seconds 10 --reference out/bench/reference*.json
    python bench/bench_algorithms.py exact --k 3
    python bench/bench_algorithms.py scaling --cap 20

reference: long runs (10 minutes) of the algorithms that do not stop on their own, saved for
quality (run several at once, one per core).
quality: every algorithm on each zoo model with the time limit the issue sets for the default
(10 s), next to the best cost any run reaches, the long reference runs included.
exact: OCGGS's small cases with K = 3: enumeration, pruning and dpp, their optima, times, the
sequences each examined and the matches dpp reused from the father.
scaling: the time each algorithm takes to stop on its own (capped) against the number of
blocks of the OCGGS families, with and without the graph split, plotted.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import date
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tables import markdown, save_rows  # noqa: E402

from graphsub import zoo  # noqa: E402
from graphsub.cost import AnalyticCostModel  # noqa: E402
from graphsub.optimizer import optimize  # noqa: E402
from graphsub.search import ALGORITHMS as REGISTERED  # noqa: E402
from graphsub.rules import builtin_rules, load_rules  # noqa: E402

ZOO = "nasrnn,bert,resnext50,nasnet_a,inception_v3,squeezenet,resnet50,mobilenet_v2,vit,vgg19"
ALGORITHMS = "backtracking,greedy,pruning,dpp,sampling"
#: graphsub's built-in rules and TASO's own rule file, the rules TASO and OCGGS search with.
TASO_RULES = Path(__file__).resolve().parents[2] / "shared" / "data" / "taso" / "graph_subst.pb"
_RULES: list = []
PROFILE = ["a100"]  # the analytic profile every run is priced with (--profile)


def rules() -> list:
    if not _RULES:
        _RULES.extend(builtin_rules() + (load_rules([TASO_RULES]) if TASO_RULES.exists() else []))
    return _RULES


def run(spec: str, algorithm: str, seconds: float, k: int = 10, split: int | None = None,
        budget: int = 10**9) -> dict[str, Any]:
    graph = zoo.build(spec)
    started = time.perf_counter()
    takes_k = "k" in REGISTERED[algorithm].option_names()
    result = optimize(graph, rules(), algorithm, time_limit=seconds, budget=budget,
                      cost=AnalyticCostModel(PROFILE[0]), k=k if takes_k else None, split=split)
    wall = time.perf_counter() - started
    row = {"model": spec, "nodes": len(graph), "rules": len(rules()), "budget": budget,
           "algorithm": algorithm, "split": split, "k": k,
           "limit": seconds, "wall": round(wall, 3), "initial": result.initial_cost,
           "final": result.final_cost, "ratio": result.final_cost / result.initial_cost,
           **result.stats.as_dict()}
    print(json.dumps(row), flush=True)
    return row


def algorithm_label(row: dict[str, Any], seconds: float | None = None) -> str:
    label = row["algorithm"] + (f"+split{row['split']}" if row["split"] else "")
    return label + (f" {row['limit']:.0f} s" if seconds is not None and row["limit"] != seconds
                    else "")


def reference(args: argparse.Namespace) -> None:
    rows = [run(model, algorithm, args.seconds) for model in args.models.split(",")
            for algorithm in args.algorithms.split(",")]
    save_rows(args.out, {"date": date.today().isoformat(), "command": " ".join(sys.argv)}, rows)


def quality(args: argparse.Namespace) -> None:
    rows, table = [], []
    algorithms = args.algorithms.split(",")
    references = [r for path in args.reference for r in json.loads(Path(path).read_text())["rows"]]
    for model in args.models.split(","):
        short = [run(model, a, args.seconds) for a in algorithms]
        split = run(model, args.default, args.seconds, split=args.split)
        default = run(model, args.default, args.seconds, budget=1000)  # optimize()'s budget
        long = [r for r in references if r["model"] == model]
        rows += short + [split, default]
        runs = short + [split, default] + long
        best = min(r["final"] for r in runs)
        who = ", ".join(sorted({algorithm_label(r, args.seconds) for r in runs
                                if r["final"] <= best * (1 + 1e-9)}))
        line = [model, str(default["nodes"])]
        line += [f"{r['ratio']:.4f} ({r['seconds']:.1f} s)" for r in short + [split, default]]
        line += [f"{best / default['initial']:.4f} ({who})",
                 f"{(default['final'] / best - 1) * 100:.2f}%",
                 f"{(split['final'] / best - 1) * 100:.2f}%"]
        table.append(line)
    meta = {"date": date.today().isoformat(), "command": " ".join(sys.argv),
            "profile": f"{PROFILE[0]} analytic", "references": args.reference}
    save_rows(args.out, meta, rows)
    print(f"\n{meta}\n")
    print(markdown(["model", "ops", *algorithms, f"{args.default}+split{args.split}",
                    f"{args.default}, budget 1000", "best of all runs (by)", "default's gap",
                    "gap with split"], table))


def exact(args: argparse.Namespace) -> None:
    rows, table = [], []
    for model in args.models.split(","):
        found = {a: run(model, a, args.cap, k=args.k) for a in ("enumeration", "pruning", "dpp")}
        rows += list(found.values())
        enu, pru, dpp = found["enumeration"], found["pruning"], found["dpp"]
        table.append([model, str(enu["nodes"]),
                      *(f"{r['final'] / r['initial']:.4f}" for r in (enu, pru, dpp)),
                      *(f"{r['seconds']:.2f}" for r in (enu, pru, dpp)),
                      *(str(r["explored"]) for r in (enu, pru, dpp)),
                      f"{dpp['matches_reused']} / {dpp['matches_computed']}",
                      "/".join(r["stopped_by"] for r in (enu, pru, dpp))])
    meta = {"date": date.today().isoformat(), "command": " ".join(sys.argv), "k": args.k,
            "profile": f"{PROFILE[0]} analytic"}
    save_rows(args.out, meta, rows)
    print(f"\n{meta}\n")
    print(markdown(["model", "ops", "cost ENU", "cost Pruning", "cost DPP", "s ENU",
                    "s Pruning", "s DPP", "sequences ENU", "sequences Pruning",
                    "sequences DPP", "DPP matches reused / computed", "stopped"], table))


def scaling(args: argparse.Namespace) -> None:
    rows = []
    sizes = [int(n) for n in args.sizes.split(",")]
    for family in args.families.split(","):
        for split in (None, args.split):
            for algorithm in args.algorithms.split(","):
                for n in sizes:
                    rows.append(run(f"{family}:{args.size_param.get(family, 'n')}={n}",
                                    algorithm, args.cap, k=args.k, split=split))
                    rows[-1].update(family=family, n=n)
    meta = {"date": date.today().isoformat(), "command": " ".join(sys.argv),
            "cap": args.cap, "k": args.k, "profile": f"{PROFILE[0]} analytic"}
    save_rows(args.out, meta, rows)
    report_scaling(meta, rows, args.plot)


def report_scaling(meta: dict[str, Any], rows: list[dict[str, Any]], plot: str) -> None:
    """One table per family: a row per size, a column per algorithm (search seconds, a * when
    it hit the cap, and the final cost ratio), and the plot."""
    families = list(dict.fromkeys(r["family"] for r in rows))
    plot_scaling(rows, families, plot, meta["cap"])
    print(f"\n{meta}\n")
    for family in families:
        mine = [r for r in rows if r["family"] == family]
        labels = list(dict.fromkeys(algorithm_label(r) for r in mine))
        lines = []
        for n in dict.fromkeys(r["n"] for r in mine):
            at = {algorithm_label(r): r for r in mine if r["n"] == n}
            cells = [f"{at[lab]['seconds']:.1f}{'*' if at[lab]['stopped_by'] == 'time' else ''}"
                     f" ({at[lab]['ratio']:.3f})" if lab in at else "" for lab in labels]
            lines.append([str(n), str(next(iter(at.values()))["nodes"]), *cells])
        print(f"\n{family}\n")
        print(markdown(["n", "ops", *labels], lines))


def scaling_report(args: argparse.Namespace) -> None:
    saved = json.loads(Path(args.saved).read_text())
    report_scaling(saved["meta"], saved["rows"], args.plot)


def plot_scaling(rows: list[dict[str, Any]], families: list[str], path: str, cap: float) -> None:
    """Search time against operators, one panel per family: a colour per algorithm, solid
    for the whole graph, dashed with the split."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    algorithms = list(dict.fromkeys(r["algorithm"] for r in rows))
    colours = dict(zip(algorithms, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    fig, axes = plt.subplots(1, len(families), figsize=(5.2 * len(families), 4.4),
                             squeeze=False)
    for ax, family in zip(axes[0], families):
        mine = [r for r in rows if r["family"] == family]
        for label in dict.fromkeys(algorithm_label(r) for r in mine):
            runs = [r for r in mine if algorithm_label(r) == label]
            ax.plot([r["nodes"] for r in runs], [r["seconds"] for r in runs], marker="o",
                    markersize=4, color=colours[runs[0]["algorithm"]],
                    linestyle="--" if runs[0]["split"] else "-", label=label)
        ax.axhline(cap, color="grey", linewidth=0.8, linestyle=":")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_title(family)
        ax.set_xlabel("operators")
        ax.grid(True, which="major", alpha=0.3)
    axes[0][0].set_ylabel(f"search time, s (dotted: the {cap:.0f} s cap)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels) // 2 or 1, fontsize=8,
               frameon=False)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="a100", help="analytic device profile")
    sub = parser.add_subparsers(dest="mode", required=True)
    q = sub.add_parser("quality")
    q.add_argument("--models", default=ZOO)
    q.add_argument("--algorithms", default=ALGORITHMS)
    q.add_argument("--default", default="backtracking", help="the default algorithm ...")
    q.add_argument("--split", type=int, default=30, help="... run also with this split")
    q.add_argument("--seconds", type=float, default=10.0)
    q.add_argument("--reference", nargs="*", default=[], help="rows saved by `reference`")
    q.add_argument("--out", default="out/bench/algorithms_quality.json")
    r = sub.add_parser("reference")
    r.add_argument("--models", default=ZOO)
    r.add_argument("--algorithms", default="backtracking")
    r.add_argument("--seconds", type=float, default=600.0)
    r.add_argument("--out", default="out/bench/reference.json")
    e = sub.add_parser("exact")
    e.add_argument("--models", default="resnet_blocks:n=1,resnet_blocks:n=2,resnet_blocks:n=3,"
                                        "resnet_blocks:n=4,sru,inception_e_blocks:n=1,"
                                        "inception_e_blocks:n=2")
    e.add_argument("--k", type=int, default=3)
    e.add_argument("--cap", type=float, default=600.0)
    e.add_argument("--out", default="out/bench/algorithms_exact.json")
    s = sub.add_parser("scaling")
    s.add_argument("--families", default="resnet_blocks,inception_e_blocks,sru")
    s.add_argument("--sizes", default="1,2,4,8,16,32")
    s.add_argument("--algorithms", default="backtracking,greedy,dpp,sampling")
    s.add_argument("--split", type=int, default=30)
    s.add_argument("--k", type=int, default=10)
    s.add_argument("--cap", type=float, default=30.0)
    s.add_argument("--plot", default="bench/scaling.png")
    s.add_argument("--out", default="out/bench/algorithms_scaling.json")
    sr = sub.add_parser("scaling-report", help="tables and plot again from saved rows")
    sr.add_argument("saved", nargs="?", default="out/bench/algorithms_scaling.json")
    sr.add_argument("--plot", default="bench/scaling.png")
    args = parser.parse_args()
    PROFILE[0] = args.profile
    args.size_param = {"sru": "steps"}
    {"quality": quality, "reference": reference, "exact": exact,
     "scaling": scaling, "scaling-report": scaling_report}[args.mode](args)


if __name__ == "__main__":
    main()
