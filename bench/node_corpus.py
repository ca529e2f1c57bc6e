"""The ONNX operator test corpus through graphsub (issue 51): counts by status and path, and
every case that is not equal, refused in one line or outside onnxruntime.

    python bench/node_corpus.py [--search-seconds 0.3] [--only NAME,...] [--out out/bench/corpus.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tables import cpu_meta, markdown, save_rows  # noqa: E402


def main() -> None:
    from graphsub.fuzz.corpus import STATUSES, check_case, node_cases

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--search-seconds", type=float, default=0.3)
    p.add_argument("--only", default="")
    p.add_argument("--out", default="out/bench/corpus.json")
    args = p.parse_args()
    start = time.perf_counter()
    cases = node_cases(args.only.split(",") if args.only else None)
    rows = []
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for case in cases:
            outcome = check_case(case, args.search_seconds)
            for path, status in outcome.statuses.items():
                counts[path][status] += 1
            row = {"case": case.name, "statuses": outcome.statuses,
                   "messages": outcome.messages, "seconds": round(outcome.seconds, 3)}
            rows.append(row)
            if outcome.worst in ("traceback", "wrong"):
                print(json.dumps(row)[:600], flush=True)
    meta = {**cpu_meta(), "cases": len(cases), "seconds": round(time.perf_counter() - start, 1)}
    save_rows(args.out, meta, rows)
    print(meta)
    print(markdown(["path", *STATUSES], [[path, *(str(c[s]) for s in STATUSES)]
                                         for path, c in counts.items()]))


if __name__ == "__main__":
    main()
