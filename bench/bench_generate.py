"""Generator and verifier benchmark (issue 4).

    python bench/bench_generate.py gen --max-ops 3 [--ops a,b] [--variables 3] [--workers 2]
                                       [--executor process|dask] [--timeout-ms 2000]
    python bench/bench_generate.py dask --max-ops 3 --ops a,b [--variables 2]
    python bench/bench_generate.py taso-verify [--timeout-ms 5000] [--workers 2]
    python bench/bench_generate.py optimize --rules out/bench/gen-3.rules [--models a,b]

`gen` runs the whole generator (enumerate, pair, prune, check, verify) and prints the counts of
each stage, the wall time per stage, the peak memory, and the recall of TASO's own rule file
(how many of its rules are among the candidates, up to renaming, operand order of add/mul and
direction). `dask` times the same generation on a local Dask cluster with 1 and then 2
workers. `taso-verify` proves TASO's 133 rules. `optimize` runs `optimize_model` on zoo models
with the built-in rules and with built-in plus generated rules and times both results against
the original, interleaved.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from datetime import date
from pathlib import Path

from graphsub.generate import generate, make_executor, rules_text
from graphsub.generate.opset import DEFAULT_OPS
from graphsub.generate.recall import recall

TASO_PB = Path(__file__).resolve().parents[2] / "shared" / "data" / "taso" / "graph_subst.pb"
#: The operators TASO's own 133 rules use.
TASO_RULE_OPS = "matmul,ewadd,ewmul,conv,concat,split,relu"
OUT = Path("out/bench")


def _progress_printer():
    """Stage progress on stderr, a line per stage at most every 10 s."""
    last: dict[str, float] = {}
    start = time.perf_counter()

    def show(stage: str, done: int, total: int) -> None:
        now = time.perf_counter()
        if done == total or now - last.get(stage, 0.0) > 10:
            last[stage] = now
            print(f"[{now - start:7.1f} s] {stage} {done}/{total}", file=sys.stderr, flush=True)

    return show


def cmd_gen(args: argparse.Namespace) -> None:
    from graphsub.rules.taso import import_taso_rules

    ops = args.ops.split(",")
    ex = make_executor(args.executor, args.workers)
    start = time.perf_counter()
    try:
        rules, report = generate(args.max_ops, ops, variables=args.variables, executor=ex,
                                 timeout_ms=args.timeout_ms, verify=not args.no_verify,
                                 progress=_progress_printer())
    finally:
        ex.close()
    wall = time.perf_counter() - start
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"gen-{args.max_ops}.rules"
    path.write_text(rules_text(rules, report))
    data = report.to_dict()
    data["wall_s"] = round(wall, 1)
    data["machine"] = f"{platform.machine()} x{os.cpu_count()}"
    data["date"] = date.today().isoformat()
    if TASO_PB.exists():
        taso = import_taso_rules(TASO_PB, check=False).rules
        r = recall(report.candidate_rules, taso)
        data["taso_recall"] = {"found": len(r.found), "total": len(taso), "missing": r.missing}
    print(json.dumps(data, indent=2))
    print(report.prune.table() if report.prune else "")
    print(f"wrote {len(rules)} rules to {path} in {wall:.1f} s")


def cmd_dask(args: argparse.Namespace) -> None:
    ops = args.ops.split(",")
    times = {}
    for workers in (1, 2):
        ex = make_executor("dask", workers)
        try:
            start = time.perf_counter()
            rules, report = generate(args.max_ops, ops, variables=args.variables, executor=ex,
                                     verify=False)
            times[workers] = time.perf_counter() - start
        finally:
            ex.close()
        print(f"dask, {workers} worker(s): {times[workers]:.1f} s, {len(rules)} rules, "
              f"stages {report.seconds}", flush=True)
    print(f"speedup with 2 workers over 1: {times[1] / times[2]:.2f}x")


def cmd_taso_verify(args: argparse.Namespace) -> None:
    from graphsub.rules.taso import import_taso_rules
    from graphsub.proofs.batch import verify_rules

    rules = import_taso_rules(TASO_PB, check=False).rules
    ex = make_executor("process", args.workers)
    start = time.perf_counter()
    try:
        verdicts = verify_rules(rules, args.timeout_ms, ex, numeric=True)
    finally:
        ex.close()
    wall = time.perf_counter() - start
    counts = {s: sum(v.status == s for v in verdicts) for s in ("proven", "refuted", "unknown")}
    print(json.dumps({"total": len(verdicts), **counts, "wall_s": round(wall, 1),
                      "not_proven": [v.rule for v in verdicts if v.status != "proven"]}, indent=2))


def cmd_optimize(args: argparse.Namespace) -> None:
    from graphsub import zoo
    from graphsub.onnx_io import to_onnx_bytes
    from graphsub.optimizer import optimize_model
    from graphsub.rules import builtin_rules, load_rules
    from graphsub.runtime import graph_input_specs, random_feeds, time_models

    builtin = builtin_rules()
    generated = [r for r in load_rules([args.rules])
                 if "verified: proven" in r.doc or not args.verified_only]
    threads = os.cpu_count() or 1
    print(f"{len(builtin)} built-in rules, {len(generated)} generated rules ({args.rules})")
    print("| model | original ms | built-in ms | ratio | built-in + generated ms | ratio | "
          "rules used (built-in + generated) |")
    print("|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        graph = zoo.build(name)
        original = to_onnx_bytes(graph)
        results = []
        for rules in (builtin, builtin + generated):
            data, rep = optimize_model(graph, original, name, rules, time_limit=args.time_limit,
                                       threads=threads)
            results.append((data, rep))
        feeds = random_feeds(graph_input_specs(graph), seed=1)
        t0, t1, t2 = time_models([original, results[0][0], results[1][0]], feeds,
                                 threads=threads, min_seconds=5.0)
        used = results[1][1].rules_used if not results[1][1].kept_original else "original kept"
        print(f"| {name} | {t0.median * 1e3:.2f} | {t1.median * 1e3:.2f} | "
              f"{t0.median / t1.median:.3f} | {t2.median * 1e3:.2f} | "
              f"{t0.median / t2.median:.3f} | {used} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gen")
    g.add_argument("--max-ops", type=int, default=3)
    g.add_argument("--ops", default=",".join(DEFAULT_OPS))
    g.add_argument("--variables", type=int, default=3)
    g.add_argument("--workers", type=int, default=os.cpu_count())
    g.add_argument("--executor", default="process")
    g.add_argument("--timeout-ms", type=int, default=2000)
    g.add_argument("--no-verify", action="store_true")
    d = sub.add_parser("dask")
    d.add_argument("--max-ops", type=int, default=3)
    d.add_argument("--ops", default=TASO_RULE_OPS)
    d.add_argument("--variables", type=int, default=2)
    t = sub.add_parser("taso-verify")
    t.add_argument("--timeout-ms", type=int, default=5000)
    t.add_argument("--workers", type=int, default=os.cpu_count())
    o = sub.add_parser("optimize")
    o.add_argument("--rules", required=True)
    o.add_argument("--models", default="nasrnn,bert,resnext50,nasnet_a,inception_v3")
    o.add_argument("--time-limit", type=float, default=60.0)
    o.add_argument("--verified-only", action="store_true",
                   help="Use only the generated rules Z3 proved.")
    args = ap.parse_args()
    {"gen": cmd_gen, "dask": cmd_dask, "taso-verify": cmd_taso_verify,
     "optimize": cmd_optimize}[args.cmd](args)


if __name__ == "__main__":
    main()
