"""graphsub's torch-cpu program of an unchanged model next to torch eager on the original module.

    python bench/bench_torch_backend.py [--models swin,bert,gpt2,vit] [--rounds 15]
        [--small] [--profile] [--cache out/bench/torch_backend] [--json FILE]

Each model is a transformers model built from its default config (random weights; `--small`
shrinks it for quick runs), batch 1, sequence 128 (images 224x224), exported to ONNX with
`torch.onnx.export(dynamo=True)` (the legacy exporter when that fails), imported with
`graphsub.onnx_io.load` and run as graphsub's torch-cpu program (`TorchProgram`, what
`--target torch-cpu` runs). Eager is the original module under `torch.inference_mode()`.
Both run in this process, round by round in alternating order; each round times a few calls
of each and the table shows the medians over rounds and the median of per-round ratios
(graphsub / eager: below 1 is faster than eager). The outputs are compared first.
`--profile` prints torch.profiler's top operators of the graphsub program and the opaque ops.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from graphsub.targets.torch import TorchProgram  # noqa: E402
from graphsub.onnx_io import load  # noqa: E402

SEQ = 128
#: model -> (transformers model type, config overrides, small config overrides)
MODELS: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "swin": ("swin", {}, dict(embed_dim=48, depths=[1, 1, 2, 1], num_heads=[2, 4, 8, 16])),
    "bert": ("bert", {}, dict(num_hidden_layers=2)),
    "gpt2": ("gpt2", dict(use_cache=False), dict(n_layer=2)),
    "vit": ("vit", {}, dict(num_hidden_layers=2)),
}


def build(name: str, small: bool) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    from transformers import AutoConfig, AutoModel

    model_type, config, small_config = MODELS[name]
    torch.manual_seed(0)
    cfg = AutoConfig.for_model(model_type, **config, **(small_config if small else {}))
    model = AutoModel.from_config(cfg).eval()
    gen = torch.Generator().manual_seed(0)
    if model_type in ("swin", "vit"):
        inputs = {"pixel_values": torch.randn(1, 3, 224, 224, generator=gen)}
    else:
        inputs = {"input_ids": torch.randint(0, cfg.vocab_size, (1, SEQ), generator=gen),
                  "attention_mask": torch.ones(1, SEQ, dtype=torch.int64)}
    return model, inputs


def export(name: str, model: torch.nn.Module, inputs: dict[str, torch.Tensor],
           path: Path) -> str:
    names = list(inputs)
    with torch.no_grad():
        try:
            program = torch.onnx.export(model, (), kwargs=inputs, dynamo=True,
                                        input_names=names, verbose=False)
            program.save(str(path))
            return "dynamo"
        except Exception as exc:  # noqa: BLE001
            print(f"  {name}: dynamo export failed ({type(exc).__name__}); legacy exporter",
                  file=sys.stderr)
            torch.onnx.export(model, tuple(inputs.values()), str(path), input_names=names,
                              dynamo=False, opset_version=17)
            return "legacy"


def first_output(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    if hasattr(out, "last_hidden_state"):
        return out.last_hidden_state
    return out[0]


def timed(fn: Any, n: int) -> float:
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def profile(program: TorchProgram, args: list[torch.Tensor], graph: Any) -> None:
    from torch.profiler import ProfilerActivity, profile as tprofile

    ops = Counter(graph[n].op if graph[n].op != "opaque" else "opaque:" + graph[n].attrs["op_type"]
                  for n in graph.topo_order())
    print("  nodes:", dict(ops.most_common()))
    with torch.inference_mode():
        program(*args)
        with tprofile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(3):
                program(*args)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


def bench(name: str, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    model, inputs = build(name, args.small)
    path = folder / f"{name}{'_small' if args.small else ''}.onnx"
    exporter = "cached"
    if not path.exists() or args.reexport:
        exporter = export(name, model, inputs, path)
    t0 = time.perf_counter()
    graph = load(str(path))
    program = TorchProgram(graph, "cpu", fuse=False) if args.no_fuse else TorchProgram(graph, "cpu")
    build_s = time.perf_counter() - t0
    feeds = {n: inputs[n].numpy() for n in program.input_names}
    prog_args = program.inputs_from(feeds)
    with torch.inference_mode():
        ref = first_output(model(**inputs))
        got = program(*prog_args)[0]
    err = float((ref - got).abs().max() / (ref.abs().max() + 1e-12))
    if args.profile:
        profile(program, prog_args, graph)

    def eager() -> None:
        with torch.inference_mode():
            model(**inputs)

    def ours() -> None:
        with torch.inference_mode():
            program(*prog_args)

    for _ in range(2):  # warm up both
        eager()
        ours()
    e_round, g_round = [], []
    for r in range(args.rounds):
        pair = [("e", eager), ("g", ours)] if r % 2 == 0 else [("g", ours), ("e", eager)]
        for tag, fn in pair:
            (e_round if tag == "e" else g_round).append(timed(fn, args.calls))
    ratio = statistics.median(g / e for g, e in zip(g_round, e_round))
    fusions = Counter(getattr(program, "fusions", []))
    return {"model": name + ("-small" if args.small else ""), "exporter": exporter,
            "nodes": len(graph.topo_order()), "build_s": build_s, "max_rel_err": err,
            "ort_calls": len(re.findall(r"run_in_onnxruntime(?:_\d+)?\(", program.module.code)),
            "fusions": ", ".join(f"{n} {k}" for k, n in sorted(fusions.items())) or "-",
            "eager_ms": statistics.median(e_round) * 1e3,
            "graphsub_ms": statistics.median(g_round) * 1e3, "ratio": ratio}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=3, help="calls per side per round")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--reexport", action="store_true")
    ap.add_argument("--no-fuse", action="store_true", help="TorchProgram(fuse=False)")
    ap.add_argument("--cache", default="out/bench/torch_backend")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    folder = Path(args.cache)
    folder.mkdir(parents=True, exist_ok=True)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    rows = []
    for name in args.models.split(","):
        row = bench(name, args, folder)
        rows.append(row)
        print(f"  {row}", file=sys.stderr)
    print("\n| model | nodes | onnxruntime calls | fusions | eager ms | graphsub torch-cpu ms "
          "| ratio | max rel err |")
    print("|---|---:|---:|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['model']} | {r['nodes']} | {r['ort_calls']} | {r['fusions']} | "
              f"{r['eager_ms']:.1f} | {r['graphsub_ms']:.1f} | {r['ratio']:.2f} | "
              f"{r['max_rel_err']:.1e} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
