"""One real model's files head to head in onnxruntime (CPU, default settings): the original,
a control (the original in a second session), onnxslim's, onnxsim's and onnxscript's
optimizer's outputs and any files named with --extra, timed side by side for --seconds;
ratios are medians of per-round ratios (original / other) with their quartiles. For the
differences of a few percent that bench_real_models' short timing cannot settle.

    PYTHONPATH=src python bench/head_to_head.py out/real_models/ocr_rec.onnx \\
        --input-shape x=1x3x48x320 --seconds 60 [--input-value sr=16000] [--extra a.onnx,b.onnx]

The peers are given the model with the sizes written into its inputs, as bench_real_models
gives them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from bench_real_models import simplified, with_input_shapes  # noqa: E402

import graphsub  # noqa: E402
from graphsub.runtime import graph_input_specs, random_feeds, time_models  # noqa: E402
from graphsub.runtime.check_sizes import default_profile  # noqa: E402
from graphsub.runtime.inputs import given_values  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--input-shape", action="append", default=[])
    ap.add_argument("--input-value", action="append", default=[])
    ap.add_argument("--extra", default="")
    ap.add_argument("--seconds", type=float, default=60.0)
    args = ap.parse_args()
    shapes = dict(item.split("=", 1) for item in args.input_shape)
    graph = graphsub.load(args.model, {k: tuple(int(d) for d in v.split("x"))
                                       for k, v in shapes.items()} or None)
    if args.input_value:
        graph = graph.with_facts(input_values=given_values(graph, dict(
            item.split("=", 1) for item in args.input_value)))
    profile = default_profile(graph.facts.symbols)
    specs = graph_input_specs(graph, profile[0].values if profile else None)
    original = Path(args.model).read_bytes()
    fixed = Path(args.model).with_suffix(".h2h-fixed.onnx")
    fixed.write_bytes(with_input_shapes(original, shapes))
    files = {"original": original, "control": original,
             **{k: v for k, v in simplified(fixed).items() if v is not None}}
    for extra in filter(None, args.extra.split(",")):
        files[os.path.basename(extra)] = Path(extra).read_bytes()
    timings = dict(zip(files, time_models(list(files.values()), random_feeds(specs),
                                          min_seconds=args.seconds)))
    for name, timing in timings.items():
        ratios = sorted(a / b for a, b in zip(timings["original"].round_medians(),
                                              timing.round_medians()))
        print(f"{name:28s} median {timing.median * 1e3:8.2f} ms  ratio "
              f"{statistics.median(ratios):.3f}  quartiles {ratios[len(ratios) // 4]:.3f}-"
              f"{ratios[3 * len(ratios) // 4]:.3f}  rounds {len(ratios)}")


if __name__ == "__main__":
    main()
