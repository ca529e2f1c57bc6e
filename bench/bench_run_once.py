"""Each thing once (issue 52, item 2): `graphsub optimize` on a large model (bench_scale's
Llama-style decoder, hidden 2048, external data) from two source trees, run alternately in
fresh processes: the whole command's seconds, each stage's, and how many onnxruntime
sessions of the original it built.

    python bench/bench_run_once.py BEFORE_SRC AFTER_SRC [--layers 2] [--runs 2]
        [--time-limit 60] [--cache out/scale]

A first run (not counted) fills graphsub's operator-timing cache, which the runs then share.

BEFORE_SRC and AFTER_SRC are `src` folders of two checkouts (e.g. `git worktree add`). The
sessions are counted where onnxruntime builds them (a wrapper of InferenceSession installed
in the process by `-c`): a session of the original is one whose model has the original's
operators in the original's order (its weights are held apart, so its bytes are not the
file's).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_scale import export  # noqa: E402

#: Run in the child: count the sessions of the original, then run the command line.
CHILD = """
import json, sys, onnx, onnxruntime as ort
model_path, counts_path = sys.argv[1], sys.argv[2]
def operators(proto):
    return [n.op_type for n in proto.graph.node]
original = operators(onnx.load(model_path, load_external_data=False))
counted = {"original": 0, "all": 0}
class Counted(ort.InferenceSession):
    def __init__(self, model, *args, **kwargs):
        counted["all"] += 1
        if isinstance(model, (bytes, bytearray)):
            counted["original"] += operators(onnx.load_from_string(bytes(model))) == original
        super().__init__(model, *args, **kwargs)
ort.InferenceSession = Counted
from graphsub.cli import main
sys.argv = ["graphsub"] + sys.argv[3:]
try:
    main()
finally:
    json.dump(counted, open(counts_path, "w"))
"""


def optimize_once(src: Path, model: Path, time_limit: float, folder: Path) -> dict:
    out, report, counts = folder / "out.onnx", folder / "report.json", folder / "counts.json"
    env = {**os.environ, "PYTHONPATH": str(src)}
    start = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(model), str(counts), "optimize",
                              str(model), "-o", str(out), "--report", str(report),
                              "--time-limit", str(time_limit)], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, err = child.communicate()
    seconds = time.perf_counter() - start
    if child.returncode != 0:
        raise SystemExit(f"graphsub optimize failed ({src}):\n{err[-2000:]}")
    rep = json.loads(report.read_text())
    return {"seconds": round(seconds, 1), "stages": rep["seconds"],
            "outcome": rep["outcome"], "sessions": json.loads(counts.read_text())}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--cache", default="out/scale")
    args = ap.parse_args()
    model = export(args.layers, Path(args.cache))
    rows: dict[str, list[dict]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as folder:  # fills the operator-timing cache for both
        optimize_once(args.after, model, args.time_limit, Path(folder))
    for run in range(args.runs):
        for name in ("before", "after"):
            with tempfile.TemporaryDirectory() as folder:
                row = optimize_once(getattr(args, name), model, args.time_limit, Path(folder))
            rows[name].append(row)
            print(name, run, json.dumps(row), flush=True)
    for name, runs in rows.items():
        stages = {k: statistics.median((r["stages"].get(k) or 0.0) for r in runs)
                  for k in runs[0]["stages"]}
        print(f"{name}: command {statistics.median(r['seconds'] for r in runs):.1f} s, "
              f"stages (median) {json.dumps({k: round(v, 1) for k, v in stages.items()})}, "
              f"sessions of the original {[r['sessions']['original'] for r in runs]}, "
              f"all sessions {[r['sessions']['all'] for r in runs]}")


if __name__ == "__main__":
    main()
