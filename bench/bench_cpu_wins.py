"""CPU wins (issue 8): graphsub on onnxruntime's CPU provider next to onnxsim and onnxslim, on
transformers models exported with `torch.onnx.export(dynamo=True)` and on the zoo.

    python bench/bench_cpu_wins.py [--hf bert,distilbert,gpt2,vit] [--zoo nasrnn,bert,...]
        [--time-limit 60] [--seconds 8] [--out out/bench/cpu_wins.json]

Needs the bench extra (pip install -e '.[bench]': onnxsim, onnxslim, transformers, onnxscript).
The transformers models are built from configs with random weights (every bias and norm
parameter perturbed, so that nothing is trivially zero or one as in a fresh initialization),
sequence 128 with an attention mask input, and exported inside the benchmark.

Per model, four ONNX files are timed side by side in one process with onnxruntime's default
settings (all graph optimizations; blocks in rotating order): the original, graphsub's output
(`optimize_model` with the defaults: measured costs, search, measure, confirm, verify), onnxsim's
and onnxslim's. Ratios are medians over rounds of per-round ratios (original / other), so drift
hits both sides of each ratio alike. Markdown tables come last.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from tables import cpu_meta, markdown, rules_text, save_rows  # noqa: E402

import graphsub  # noqa: E402
from graphsub import zoo  # noqa: E402
from graphsub.onnx_io import to_onnx_bytes  # noqa: E402
from graphsub.optimizer import optimize_model  # noqa: E402
from graphsub.runtime import Timing, graph_input_specs, time_models  # noqa: E402
from graphsub.verdicts import compare_models
from graphsub.verdicts.equivalence import Tolerance  # noqa: E402

HF = {
    "bert": ("bert", dict(hidden_size=384, num_hidden_layers=4, num_attention_heads=6,
                          intermediate_size=1536, vocab_size=2000)),
    "distilbert": ("distilbert", dict(dim=384, n_layers=4, n_heads=6, hidden_dim=1536,
                                      vocab_size=2000)),
    "gpt2": ("gpt2", dict(n_embd=384, n_layer=4, n_head=6, vocab_size=2000, n_positions=256,
                          use_cache=False)),
    "vit": ("vit", dict(hidden_size=384, num_hidden_layers=4, num_attention_heads=6,
                        intermediate_size=1536, image_size=224, patch_size=16)),
}
ZOO = ["nasrnn", "bert", "resnext50", "nasnet_a", "inception_v3", "resnet50", "squeezenet",
       "mobilenet_v2", "sru", "vit", "inception_e_blocks"]
SEQ = 128


def export_hf(name: str, folder: Path) -> Path:
    """A transformers model with random weights, exported by torch.onnx (dynamo)."""
    import torch
    from transformers import AutoConfig, AutoModel

    model_type, config = HF[name]
    torch.manual_seed(0)
    model = AutoModel.from_config(AutoConfig.for_model(model_type, **config)).eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn(p.shape, generator=gen) * 0.02)
    if model_type == "vit":
        args, kwargs, names = (torch.randn(1, 3, 224, 224),), {}, ["pixel_values"]
    else:
        args = (torch.randint(0, 2000, (1, SEQ)),)
        kwargs = {"attention_mask": torch.ones(1, SEQ, dtype=torch.int64)}
        names = ["input_ids", "attention_mask"]
    path = folder / f"hf_{name}.onnx"
    with torch.no_grad():
        program = torch.onnx.export(model, args, kwargs=kwargs, dynamo=True, input_names=names,
                                    verbose=False)
    program.save(str(path))
    return path


def feeds_for(graph) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    out = {}
    for name, t in graph_input_specs(graph):
        if t.dtype.startswith("int"):
            out[name] = (np.ones(t.shape) if "mask" in name else rng.integers(0, 2000, t.shape))
            out[name] = out[name].astype(t.dtype)
        else:
            out[name] = rng.standard_normal(t.shape).astype(t.dtype)
    return out


def paired(a: Timing, b: Timing) -> float:
    """Median over rounds of a's round median / b's (a ratio above 1: b is faster)."""
    return statistics.median(x / y for x, y in zip(a.round_medians(), b.round_medians()))


def simplified(original: bytes) -> dict[str, bytes]:
    import onnx
    import onnxsim
    import onnxslim

    model = onnx.load_from_string(original)
    sim, ok = onnxsim.simplify(model)
    slim = onnxslim.slim(onnx.load_from_string(original))
    return {"onnxsim": sim.SerializeToString() if ok else original,
            "onnxslim": slim.SerializeToString()}


def measure(label: str, graph, original: bytes, args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.perf_counter()
    data, rep = optimize_model(graph, original, label, time_limit=args.time_limit,
                               target="ort-cpu")
    row: dict[str, Any] = {"model": label, "optimize_s": time.perf_counter() - t0,
                           "search_s": rep.search["seconds"], "rules": rep.rules_used,
                           "kept_original": rep.kept_original, "confirmed": rep.speedup}
    others = simplified(original)
    specs = graph_input_specs(graph)
    for name, model in others.items():  # the peers must be right too, or the race is moot
        row[f"{name}_equivalent"] = compare_models(original, model, specs,
                                                   Tolerance(1e-3, 1e-4)).equivalent
    files = {"original": original, "graphsub": data, **others}
    timings = dict(zip(files, time_models(list(files.values()), feeds_for(graph),
                                          min_seconds=args.seconds)))
    row["original_ms"] = timings["original"].median * 1e3
    for name in ("graphsub", "onnxsim", "onnxslim"):
        row[f"{name}_ratio"] = paired(timings["original"], timings[name])
        row[f"{name}_ms"] = timings[name].median * 1e3
    row["graphsub_vs_onnxsim"] = paired(timings["onnxsim"], timings["graphsub"])
    row["graphsub_vs_onnxslim"] = paired(timings["onnxslim"], timings["graphsub"])
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hf", default=",".join(HF))
    ap.add_argument("--zoo", default=",".join(ZOO))
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--out", default="out/bench/cpu_wins.json")
    args = ap.parse_args()
    folder = Path(args.out).parent
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in filter(None, args.hf.split(",")):
        path = export_hf(name, folder)
        rows.append(measure(f"hf_{name}", graphsub.load(path), path.read_bytes(), args))
        print(json.dumps(rows[-1], default=str), flush=True)
    for name in filter(None, args.zoo.split(",")):
        graph = zoo.build(name)
        rows.append(measure(name, graph, to_onnx_bytes(graph), args))
        print(json.dumps(rows[-1], default=str), flush=True)
    meta = cpu_meta()
    save_rows(args.out, meta, rows)
    print(f"\n{meta}\n")
    headers = ["model", "original ms", "graphsub", "onnxsim", "onnxslim", "graphsub / onnxsim",
               "graphsub / onnxslim", "graphsub's rewrites"]
    lines = []
    for r in rows:
        flag = "" if r["onnxsim_equivalent"] and r["onnxslim_equivalent"] else " (peer not equivalent)"
        lines.append([r["model"] + flag, f"{r['original_ms']:.2f}"] + [
            f"{r[k]:.3f}" for k in ("graphsub_ratio", "onnxsim_ratio", "onnxslim_ratio",
                                    "graphsub_vs_onnxsim", "graphsub_vs_onnxslim")]
            + [rules_text(r["rules"])])
    print(markdown(headers, lines))


if __name__ == "__main__":
    main()
