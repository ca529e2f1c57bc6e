"""How long a first torch.compile takes through graphsub, against inductor alone (issue 58,
item 6): the whole first call, graphsub with no options (a 10 s time limit) within
inductor's own compilation + the time limit + 20%.

    PYTHONPATH=src python bench/bench_compile_time.py [--models llama,qwen2,bert,vit,resnet,convnext]
        [--shapes llama=1x128,1x1024,decode2048 ...] [--layers 2] [--hidden 256]
        [--time-limit 10] [--out out/bench/compile_time.json]

Each first call runs in a process of its own with empty caches (inductor's and graphsub's,
as on a fresh machine), the model built before the clock starts; the figure is the first
call's wall time (dynamo's capture, the compilation, the call). The models, shapes and
attention are bench_gpu.py's (transformers' default attention, random weights, float32, the
CPU, inductor's default mode). The bound, `allowed`, is 1.2 x (inductor's first call + the
time limit).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tables import markdown, save_rows  # noqa: E402

#: The grid's shapes per model (bench_gpu.py's CPU grid).
SHAPES = {"llama": "1x128,1x1024,decode2048", "qwen2": "1x128,1x1024,decode2048",
          "bert": "1x128,16x128", "vit": "1x128,16x128", "resnet": "1x1", "convnext": "1x1"}

CHILD = """
import json, sys, time
sys.path.insert(0, {bench!r})
import torch
from bench_gpu import Workload, build_model
kind, shape, backend, limit, layers, hidden = {args!r}
model = build_model(kind, hidden, layers)
work = Workload.parse(shape)
compiled = torch.compile(model) if backend == "inductor" else torch.compile(
    model, backend="graphsub", options={{"time_limit": limit}})
call, _ = work.caller(kind, compiled, model, torch.float32, "cpu")
start = time.perf_counter()
with torch.no_grad():
    call()
seconds = time.perf_counter() - start
chosen = ""
if backend == "graphsub":
    from graphsub.frontends import torch_compile
    chosen = ",".join(r.chosen for r in torch_compile.reports())
print("RESULT " + json.dumps({{"seconds": seconds, "chosen": chosen}}))
"""


def first_call(kind: str, shape: str, backend: str, args: argparse.Namespace) -> dict:
    """One first call in a fresh process with empty caches."""
    with tempfile.TemporaryDirectory() as inductor_cache, \
            tempfile.TemporaryDirectory() as graphsub_cache:
        env = {"TORCHINDUCTOR_CACHE_DIR": inductor_cache, "GRAPHSUB_CACHE_DIR": graphsub_cache}
        code = CHILD.format(bench=str(Path(__file__).resolve().parent),
                            args=(kind, shape, backend, args.time_limit, args.layers,
                                  args.hidden))
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env={**os.environ, **env})
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        return {"failed": (proc.stderr or proc.stdout)[-500:]}
    return json.loads(line.removeprefix("RESULT "))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(SHAPES))
    p.add_argument("--shapes", nargs="*", default=[],
                   help="MODEL=SHAPE,SHAPE... in place of the grid's shapes for MODEL")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--time-limit", type=float, default=10.0)
    p.add_argument("--out", default="out/bench/compile_time.json")
    args = p.parse_args()
    shapes = dict(SHAPES, **dict(s.split("=", 1) for s in args.shapes))
    import torch

    from graphsub.targets.ort import cpu_model

    meta = {"date": date.today().isoformat(), "command": " ".join(sys.argv),
            "device": f"{cpu_model()}, {torch.get_num_threads()} threads",
            "torch": torch.__version__}
    rows = []
    for kind in args.models.split(","):
        for shape in shapes[kind].split(","):
            inductor = first_call(kind, shape, "inductor", args)
            graphsub = first_call(kind, shape, "graphsub", args)
            row = {"model": kind, "shape": shape, "inductor_s": inductor.get("seconds"),
                   "graphsub_s": graphsub.get("seconds"), "chosen": graphsub.get("chosen"),
                   "failed": inductor.get("failed") or graphsub.get("failed")}
            if row["inductor_s"] is not None and row["graphsub_s"] is not None:
                allowed = 1.2 * (row["inductor_s"] + args.time_limit)
                row["allowed_s"] = round(allowed, 1)
                row["within"] = row["graphsub_s"] <= allowed
                row["graphsub_over_allowed"] = round(row["graphsub_s"] / allowed, 3)
            rows.append(row)
            print(json.dumps(row), flush=True)
            save_rows(args.out, meta, rows)
    print(f"\n{meta}")
    print(markdown(["model", "shape", "inductor s", "graphsub s", "allowed s",
                    "graphsub / allowed", "within", "graphsub chose"],
                   [[r["model"], r["shape"], f"{r['inductor_s']:.1f}" if r["inductor_s"] else "-",
                     f"{r['graphsub_s']:.1f}" if r["graphsub_s"] else "-",
                     str(r.get("allowed_s", "-")), str(r.get("graphsub_over_allowed", "-")),
                     str(r.get("within", "-")), r.get("chosen") or (r.get("failed") or "")[:60]]
                    for r in rows]))


if __name__ == "__main__":
    main()
