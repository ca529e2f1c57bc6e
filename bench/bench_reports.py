"""What an HTML report costs on real runs: the evidence stage inside `optimize_model` (time
per operator type, the featured candidate's rewrites replayed and drawn, Z3 on their rules)
and rendering the page, with its size.

    PYTHONPATH=src python3 bench/bench_reports.py [--time-limit 60] [--models llama nasrnn squeezenet]

`llama` is a 6-layer grouped-query Llama decoder from transformers (sequence 128), exported
with torch.onnx.export(dynamo=True) (needs the bench extra); the others are zoo models. Each
model is optimized once on ort-cpu; the page is rendered three times (median).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
import graphsub.optimizer as optimizer  # noqa: E402
from graphsub import zoo  # noqa: E402
from graphsub.onnx_io import load  # noqa: E402
from graphsub.report.files import render_html  # noqa: E402


def graph_of(name: str, folder: Path):
    if name == "llama":
        from bench_fission_ort import export

        path = export("llama", 128, folder)
        return f"{path.name} (transformers export)", load(path)
    return f"{name} (zoo)", zoo.build(name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--models", nargs="+", default=["llama", "nasrnn", "squeezenet"])
    args = parser.parse_args()
    spent: dict[str, float] = {}
    stage = optimizer._evidence_stage

    def timed(*a, **k):
        start = time.perf_counter()
        stage(*a, **k)
        spent["evidence"] = time.perf_counter() - start

    optimizer._evidence_stage = timed
    print("| model | nodes | outcome | rewrites drawn | evidence s | render s | page kB |")
    print("|---|---:|---|---|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as folder:
        for name in args.models:
            label, graph = graph_of(name, Path(folder))
            _, report = optimizer.optimize_model(graph, None, label, time_limit=args.time_limit,
                                                 target="ort-cpu")
            data = report.as_dict()
            renders = []
            for _ in range(3):
                start = time.perf_counter()
                page = render_html(data)
                renders.append(time.perf_counter() - start)
            ev = report.rewrites
            how = "stepwise" if ev.get("stepwise") else "all at once"
            print(f"| {label} | {len(graph)} | {report.outcome} | {len(ev.get('steps', []))} "
                  f"({how}) | {spent.get('evidence', 0.0):.2f} | "
                  f"{statistics.median(renders):.2f} | {len(page) / 1e3:.0f} |", flush=True)


if __name__ == "__main__":
    main()
