"""Mutation testing of the verifier (graphsub.proofs.mutation).

    python bench/bench_mutation.py [--source library|taso|both] [--limit N] [--workers 2]
                                   [--timeout-ms 3000] [--out out/bench/mutation.json]
                                   [--retest]

Every rule of the built-in library and/or TASO's graph_subst.pb (the first N of each with
--limit) is mutated (`mutants`: attributes dropped or changed, permutations and operands
swapped, constants nudged, conditions dropped, operators left out), and each mutant, with the
rule it came from, goes through `verify_rule` on a process pool. A mutant is very likely
wrong, so a verifier that says `proven` or `tested` of one has let it through (it survived);
`refuted` and `unknown` kill it. The originals are verified too: a mutant of a rule the
verifier cannot establish says little, so the score is also given over the mutants of
established (proven or tested) rules alone.

Prints per-kind counts, the survivors by name with their verdicts and the total time, and
writes all of it, every mutant's verdict included, as JSON to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Sequence
from datetime import date
from pathlib import Path

from graphsub.executors import make_executor
from graphsub.proofs.mutation import (KILLING, KINDS, SURVIVING, Mutant, MutationScore, mutants,
                                      mutation_score)
from graphsub.proofs.prover import Verdict, verify_rule
from graphsub.rules import library_files, load_rules, parse_rules, print_rule
from graphsub.rules.ast import Rule

TASO_PB = Path(__file__).resolve().parents[2] / "shared" / "data" / "taso" / "graph_subst.pb"
#: Rules per task: small enough for a progress line every few seconds and an even load.
BATCH = 8


def verify_texts(texts: Sequence[str], timeout_ms: int) -> list[Verdict]:
    """Verdicts for rules given as text (as graphsub.proofs.batch sends them to workers),
    each on its own: a verification that raises is reported as status `error` with the
    exception, instead of losing the rest of the run."""
    out = []
    for text in texts:
        (rule,) = parse_rules(text, origin="<mutant>")
        start = time.perf_counter()
        try:
            out.append(verify_rule(rule, timeout_ms=timeout_ms))
        except Exception as exc:  # noqa: BLE001 (a crash of the verifier is a finding too)
            out.append(Verdict(rule.name, "error", time.perf_counter() - start,
                               f"{type(exc).__name__}: {exc}"))
    return out


def load(source: str, limit: int | None) -> list[Rule]:
    rules: list[Rule] = []
    if source in ("library", "both"):
        rules += load_rules(library_files(), check=False)[:limit]
    if source in ("taso", "both"):
        if not TASO_PB.exists():
            sys.exit(f"{TASO_PB} is missing: TASO's rules are read from ../shared/data/taso")
        from graphsub.rules.taso import import_taso_rules

        rules += import_taso_rules(TASO_PB, check=False).rules[:limit]
    return rules


def verify_all(rules: Sequence[Rule], timeout_ms: int, workers: int) -> dict[str, Verdict]:
    texts = [print_rule(r) for r in rules]
    batches = [texts[i:i + BATCH] for i in range(0, len(texts), BATCH)]
    ex = make_executor("process", workers)
    out: dict[str, Verdict] = {}
    start = last = time.perf_counter()
    try:
        tasks = [(b, timeout_ms) for b in batches]
        for done, verdicts in enumerate(ex.run(verify_texts, tasks), 1):
            out.update((v.rule, v) for v in verdicts)
            now = time.perf_counter()
            if now - last > 15 or done == len(batches):
                last = now
                print(f"[{now - start:7.1f} s] verified {len(out)}/{len(texts)}", file=sys.stderr,
                      flush=True)
    finally:
        ex.close()
    return out


def first_line(text: str) -> str:
    return text.splitlines()[0] if text else ""


def score_row(score: MutationScore) -> dict[str, float | int]:
    return {"mutants": score.total, "refuted": score.refuted, "unknown": score.unknown,
            "proven": score.proven, "tested": score.tested, "error": score.other,
            "killed": score.killed, "survived": score.survived, "score": round(score.score, 4)}


def retest(item: tuple[str, str]) -> tuple[str, str]:
    """A survivor tested hard: twelve more seeds of the numerical check (15 examples each)
    and four of the exact test. "holds" where none finds its two sides different (a mutant
    right wherever it rewrites, as far as the draws tell), else what found the difference."""
    import numpy as np

    from graphsub.proofs.identity import identity_test
    from graphsub.rules.check import RuleCheckError, check_rule
    from graphsub.rules.parser import parse_rules

    name, text = item
    (rule,) = parse_rules(text, "<mutant>")
    for seed in range(12):
        try:
            with np.errstate(all="ignore"):
                check_rule(rule, examples=15, seed=seed)
        except RuleCheckError as exc:
            if "is wrong" in str(exc):
                return name, "numerical check"
        except Exception:  # noqa: BLE001 (an operator failing on a draw: no difference)
            pass
    for seed in range(4):
        try:
            if identity_test(rule, seed).status == "refutes":
                return name, "exact test"
        except Exception:  # noqa: BLE001
            continue
    return name, "holds"


def table(rows: dict[str, dict[str, float | int]]) -> str:
    cols = ["mutants", "refuted", "unknown", "proven", "tested", "error", "score"]
    lines = ["| kind | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for kind, row in rows.items():
        lines.append(f"| {kind} | " + " | ".join(str(row[c]) for c in cols) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", choices=("library", "taso", "both"), default="both")
    parser.add_argument("--limit", type=int, default=None,
                        help="mutate only the first N rules of each source")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--timeout-ms", type=int, default=3000)
    parser.add_argument("--out", type=Path, default=Path("out/bench/mutation.json"))
    parser.add_argument("--retest", action="store_true",
                        help="test every survivor hard afterwards (retest(): about ten minutes "
                             "on two workers)")
    args = parser.parse_args()

    start = time.perf_counter()
    originals = load(args.source, args.limit)
    made: list[tuple[Rule, Mutant]] = [(r, m) for r in originals for m in mutants(r)]
    print(f"{len(made)} mutants of {len(originals)} rules", file=sys.stderr, flush=True)
    verdicts = verify_all([*originals, *(m.rule for _, m in made)], args.timeout_ms,
                          args.workers)
    wall = time.perf_counter() - start

    parents = {r.name: verdicts[r.name] for r in originals}
    established = {name for name, v in parents.items() if v.status in SURVIVING}
    by_kind: dict[str, dict[str, float | int]] = {}
    for kind in KINDS:
        kind_verdicts = [verdicts[m.rule.name] for _, m in made if m.kind == kind]
        if kind_verdicts:
            by_kind[kind] = score_row(mutation_score(kind_verdicts))
    by_kind["all"] = score_row(mutation_score(verdicts[m.rule.name] for _, m in made))
    by_kind["all, of established rules"] = score_row(mutation_score(
        verdicts[m.rule.name] for r, m in made if r.name in established))

    records = []
    for r, m in made:
        v = verdicts[m.rule.name]
        records.append({"name": m.rule.name, "parent": r.name,
                        "parent_status": parents[r.name].status, "kind": m.kind,
                        "description": m.description, "status": v.status,
                        "seconds": round(v.seconds, 2), "reason": first_line(v.reason),
                        "rule": print_rule(m.rule)})
    survivors = [rec for rec in records if rec["status"] in SURVIVING]
    errors = [rec for rec in records if rec["status"] not in SURVIVING | KILLING]

    print(table(by_kind))
    statuses = ("proven", "tested", "refuted", "unknown", "error")
    print("\noriginals: " + ", ".join(f"{s} {sum(v.status == s for v in parents.values())}"
                                       for s in statuses))
    print(f"\n{len(survivors)} survivors (proven or tested):")
    for rec in survivors:
        print(f"  {rec['name']}: {rec['status']} ({rec['description']}; original "
              f"{rec['parent_status']})")
    if errors:
        print(f"\n{len(errors)} verifications raised:")
        for rec in errors:
            print(f"  {rec['name']}: {rec['reason']}")
    print(f"\n{len(made)} mutants of {len(originals)} rules verified in {wall:.1f} s "
          f"({args.workers} workers, {args.timeout_ms} ms per proof)")
    if args.retest and survivors:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(args.workers) as pool:
            found = dict(pool.map(retest, [(rec["name"], rec["rule"]) for rec in survivors]))
        for rec in survivors:
            rec["retest"] = found[rec["name"]]
        wrong = [name for name, how in found.items() if how != "holds"]
        print(f"retested hard: {len(found) - len(wrong)} of {len(found)} survivors hold"
              + (f"; different: {', '.join(wrong)}" if wrong else ""))

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "date": date.today().isoformat(), "machine": f"{platform.machine()} x{os.cpu_count()}",
        "source": args.source, "limit": args.limit, "workers": args.workers,
        "timeout_ms": args.timeout_ms, "wall_s": round(wall, 1),
        "originals": {name: {"status": v.status, "seconds": round(v.seconds, 2),
                             "reason": first_line(v.reason)}
                      for name, v in parents.items()},
        "by_kind": by_kind, "survivors": survivors, "errors": errors, "mutants": records,
    }, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
