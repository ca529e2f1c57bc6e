"""graphsub against inductor in each of its modes, through torch.compile (issue 37).

    python bench/bench_gpu.py [--models llama,qwen2,bert,vit,resnet] [--dtypes bfloat16,float16]
        [--shapes 1x128,1x2048,16x512] [--modes eager,default,reduce-overhead,max-autotune]
        [--layers 4] [--hidden 1024] [--time-limit 10] [--rounds 15] [--budget 480]
        [--device cuda|cpu] [--sdpa] [--out out/bench/gpu.json]

Hugging Face architectures with random weights and eager attention, as their owners write
them (transformers' own modules, no export): an encoder (BERT), grouped-query decoders
(Llama: 16 query / 8 key-value heads at hidden 1024; Qwen2: biases on the projections), a
vision transformer (ViT; a shape's sequence is its number of patches), a CNN (ResNet-50's
layout; batch from the shape). For each model, precision and shape (batch x sequence), the
contenders are: the module eager; inductor alone in each mode (`torch.compile(model,
mode=M)`); graphsub in the same mode (`torch.compile(model, backend="graphsub",
options={"mode": M})`); with `--sdpa`, the same weights written with
scaled_dot_product_attention under inductor in the mode (what a person would rewrite the
model to by hand: the reference for what attention fusion can reach).

Every output is checked against the module computed in float32 (its error may be at most 4x
the eager module's own, plus 1e-3 of its scale); timing is by CUDA events (wall clock on the
CPU) around blocks of calls, contenders interleaved in rotating order, `--rounds` blocks
each, under torch.no_grad() (not inference mode: graphsub's result must work outside it);
figures are medians per call and ratios of medians measured side by side. Results are
written after each configuration (`--out`), so a run cut short keeps what it measured;
`--budget` seconds stops starting new configurations. The last lines printed are a table.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
import traceback
import warnings
from datetime import date
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tables import markdown, save_rows  # noqa: E402

MODES = ("eager", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def build_model(kind: str, hidden: int, layers: int, sdpa: bool = False) -> Any:
    """A transformers model with random weights (norms and biases perturbed, so that nothing
    is trivially one or zero), returning one tensor."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    attn = "sdpa" if sdpa else "eager"
    heads = max(hidden // 64, 1)
    decoders = {"llama": (tf.LlamaModel, tf.LlamaConfig, 2),  # query heads per kv head
                "qwen2": (tf.Qwen2Model, tf.Qwen2Config, 4)}
    if kind in decoders:
        model_class, config_class, group = decoders[kind]
        inner = model_class(config_class(
            vocab_size=1000, hidden_size=hidden, num_hidden_layers=layers,
            num_attention_heads=heads, num_key_value_heads=max(heads // group, 1),
            intermediate_size=int(2.75 * hidden), max_position_embeddings=8192,
            attn_implementation=attn))
    elif kind == "bert":
        inner = tf.BertModel(tf.BertConfig(
            vocab_size=1000, hidden_size=hidden, num_hidden_layers=layers,
            num_attention_heads=heads, intermediate_size=4 * hidden,
            max_position_embeddings=8192, attn_implementation=attn), add_pooling_layer=False)
    elif kind == "vit":
        inner = tf.ViTModel(tf.ViTConfig(
            image_size=224, patch_size=16, hidden_size=hidden, num_hidden_layers=layers,
            num_attention_heads=heads, intermediate_size=4 * hidden,
            attn_implementation=attn), add_pooling_layer=False)
    elif kind == "resnet":
        inner = tf.ResNetModel(tf.ResNetConfig(layer_type="bottleneck", depths=[3, 4, 6, 3],
                                               hidden_sizes=[256, 512, 1024, 2048]))
    else:
        raise SystemExit(f"unknown model {kind!r} (llama, qwen2, bert, vit, resnet)")
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in inner.parameters():
            if p.dim() == 1:
                p.add_(torch.randn(p.shape, generator=gen) * 0.02)

    class Output(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: Any) -> Any:
            if kind in ("llama", "qwen2"):
                return self.inner(input_ids=x, use_cache=False).last_hidden_state
            if kind == "bert":
                return self.inner(input_ids=x).last_hidden_state
            if kind == "vit":
                return self.inner(pixel_values=x, interpolate_pos_encoding=True).last_hidden_state
            return self.inner(pixel_values=x).pooler_output

    return Output().eval()


def make_input(kind: str, batch: int, seq: int, dtype: Any, device: str) -> Any:
    import torch

    gen = torch.Generator().manual_seed(2)
    if kind in ("llama", "qwen2", "bert"):
        return torch.randint(0, 1000, (batch, seq), generator=gen).to(device)
    side = 224 if kind == "resnet" else 16 * max(1, round(math.sqrt(seq)))  # vit: ~seq patches
    return torch.randn(batch, 3, side, side, generator=gen).to(device=device, dtype=dtype)


def time_blocks(fns: dict[str, Callable[[], Any]], rounds: int, device: str,
                block_seconds: float = 0.05) -> dict[str, float]:
    """Median seconds per call of each function: blocks of calls in rotating order."""
    import torch

    cuda = device == "cuda"
    per_call: dict[str, list[float]] = {name: [] for name in fns}
    with torch.no_grad():
        sizes = {}
        for name, fn in fns.items():  # warm, then size each block to ~block_seconds
            for _ in range(3):
                fn()
            t = _elapsed(fn, 3, cuda) / 3
            sizes[name] = max(1, min(200, int(block_seconds / max(t, 1e-6))))
        names = list(fns)
        for r in range(rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                n = sizes[name]
                per_call[name].append(_elapsed(fns[name], n, cuda) / n)
    return {name: statistics.median(v) for name, v in per_call.items()}


def _elapsed(fn: Callable[[], Any], n: int, cuda: bool) -> float:
    import torch

    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(n):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return time.perf_counter() - t


def error(out: Any, truth: Any) -> float:
    return float((out.float() - truth.float()).abs().max())


def run_config(kind: str, dtype_name: str, batch: int, seq: int, args: argparse.Namespace
               ) -> list[dict[str, Any]]:
    import torch
    import torch._dynamo

    import graphsub.frontends.torch_compile as tc

    dtype = getattr(torch, dtype_name)
    device = args.device
    torch._dynamo.reset()
    model = build_model(kind, args.hidden, args.layers).to(device=device, dtype=dtype)
    x = make_input(kind, batch, seq, dtype, device)
    with torch.no_grad():
        wide = build_model(kind, args.hidden, args.layers).to(device=device)
        truth = wide(x.float() if x.is_floating_point() else x)
        del wide
        eager_out = model(x)
    noise = error(eager_out, truth)
    allowed = 4 * noise + 1e-3 * float(truth.abs().max())
    contenders: dict[str, Callable[[], Any]] = {"eager": lambda: model(x)}
    info: dict[str, dict[str, Any]] = {"eager": {"error": noise}}
    sdpa_model = None
    if args.sdpa and kind in ("llama", "qwen2", "bert", "vit"):
        sdpa_model = build_model(kind, args.hidden, args.layers, sdpa=True).to(
            device=device, dtype=dtype)
    for mode in [m for m in args.modes if m != "eager"]:
        entries = [(f"inductor {mode}", lambda m=mode: torch.compile(model, mode=m))]
        for cost in args.costs or [None]:
            options = {"time_limit": args.time_limit, **({"cost": cost} if cost else {})}
            entries.append((f"graphsub{f'({cost})' if cost else ''} {mode}",
                            lambda m=mode, o=options: torch.compile(
                                model, backend="graphsub", options={"mode": m, **o})))
        if sdpa_model is not None:
            entries.append((f"sdpa+inductor {mode}",
                            lambda m=mode: torch.compile(sdpa_model, mode=m)))
        for name, make in entries:
            start = time.perf_counter()
            before = len(tc.reports())
            try:
                compiled = make()
                with warnings.catch_warnings(record=True) as caught, torch.no_grad():
                    warnings.simplefilter("always")
                    out = compiled(x)
                    out = compiled(x)  # a second call (CUDA-graph trees replay here)
            except Exception as exc:  # noqa: BLE001 - a contender that fails is a result
                info[name] = {"failed": f"{type(exc).__name__}: {exc}"[:500]}
                traceback.print_exc()
                print(json.dumps({"compiled": name, **info[name]}), flush=True)
                continue
            entry: dict[str, Any] = {"compile_s": round(time.perf_counter() - start, 1),
                                     "error": error(out, truth)}
            entry["correct"] = entry["error"] <= allowed
            reports = tc.reports()[before:]
            if name.startswith("graphsub"):
                entry["chosen"] = [r.chosen or ("fallback: " + r.fallback if r.fallback else "")
                                   for r in reports]
                entry["race"] = [r.race for r in reports]
                entry["dropped"] = [r.dropped for r in reports if r.dropped]
                entry["rules"] = [p.rules_used for r in reports for p in r.parts]
                entry["predicted_ms"] = [(round(p.predicted_before * 1e3, 3),
                                          round(p.predicted_after * 1e3, 3))
                                         for r in reports for p in r.parts]
                # where a part's search went nowhere: its seconds, why it was kept, notes
                entry["parts"] = [{"search_s": round(p.search_seconds, 2), "kept": p.kept,
                                   "notes": [n[:160] for n in p.notes]}
                                  for r in reports for p in r.parts]
                entry["warnings"] = sorted({str(w.message)[:200] for w in caught})[:5]
            info[name] = entry
            print(json.dumps({"compiled": name, **entry}, default=str), flush=True)
            contenders[name] = lambda c=compiled: c(x)
    times = time_blocks(contenders, args.rounds, device)
    rows = []
    for name, t in times.items():
        mode = name.split(" ")[-1] if name != "eager" else "eager"
        base = times.get(f"inductor {mode}")
        rows.append({"model": kind, "dtype": dtype_name, "batch": batch, "seq": seq,
                     "contender": name, "ms": round(t * 1e3, 4),
                     "vs_eager": round(times["eager"] / t, 3),
                     "vs_inductor_same_mode": round(base / t, 3) if base else None,
                     **info.get(name, {})})
    return rows


def cli_optimize(models: list[str], target: str, out_dir: Path) -> list[dict[str, Any]]:
    """`graphsub optimize MODEL --target T` at the default time limit: what is kept."""
    import subprocess

    rows = []
    for model in models:
        report = out_dir / f"{model}.report.json"
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", "from graphsub.cli import main; main()",
                               "optimize", model, "-o",
                               str(out_dir / f"{model}.onnx"), "--target", target,
                               "--report", str(report)], capture_output=True, text=True)
        row: dict[str, Any] = {"model": model, "target": target, "exit": proc.returncode,
                               "seconds": round(time.perf_counter() - start, 1)}
        if report.exists():
            data = json.loads(report.read_text())
            row.update({k: data.get(k) for k in ("outcome", "speedup", "kept_original", "seconds",
                                                 "rules_used", "verdict")})
        else:
            row["stderr"] = proc.stderr[-500:]
        rows.append(row)
        print(json.dumps(row, default=str), flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="llama,bert")
    p.add_argument("--dtypes", default="bfloat16")
    p.add_argument("--shapes", default="1x2048")
    p.add_argument("--modes", default="eager,reduce-overhead,max-autotune")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--time-limit", type=float, default=10.0)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--budget", type=float, default=float("inf"),
                   help="seconds after which no new configuration starts")
    p.add_argument("--device", default=None)
    p.add_argument("--costs", default="",
                   help="cost models graphsub searches with, one contender each (compiled,"
                        "measured); default: the backend's own choice")
    p.add_argument("--sdpa", action="store_true")
    p.add_argument("--cli", default="", help="zoo models for `graphsub optimize --target`")
    p.add_argument("--out", default="out/bench/gpu.json")
    args = p.parse_args()
    import torch

    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    args.modes = args.modes.split(",")
    args.costs = [c for c in args.costs.split(",") if c]
    unknown = set(args.modes) - set(MODES)
    if unknown:
        raise SystemExit(f"unknown modes {sorted(unknown)} (known: {', '.join(MODES)})")
    torch._dynamo.config.cache_size_limit = 64
    if hasattr(torch._dynamo.config, "recompile_limit"):
        torch._dynamo.config.recompile_limit = 64
    if args.device == "cuda":
        device_name = torch.cuda.get_device_name()
    else:
        from graphsub.backends.ort import cpu_model

        device_name = f"{cpu_model()}, {torch.get_num_threads()} threads"
    meta = {"date": date.today().isoformat(), "device": device_name,
            "torch": torch.__version__, "command": " ".join(sys.argv)}
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    for kind in args.models.split(","):
        for dtype_name in args.dtypes.split(","):
            for shape in args.shapes.split(","):
                if time.perf_counter() - started > args.budget:
                    print(f"budget spent: {kind} {dtype_name} {shape} not run", flush=True)
                    continue
                batch, seq = (int(v) for v in shape.split("x"))
                try:
                    new = run_config(kind, dtype_name, batch, seq, args)
                except Exception as exc:  # noqa: BLE001 - one configuration, not the run
                    traceback.print_exc()
                    new = [{"model": kind, "dtype": dtype_name, "batch": batch, "seq": seq,
                            "failed": f"{type(exc).__name__}: {exc}"[:500]}]
                rows += new
                for row in new:
                    print(json.dumps(row, default=str), flush=True)
                save_rows(args.out, meta, rows)
    if args.cli and time.perf_counter() - started <= args.budget:
        out_dir = Path(args.out).parent / "cli"
        out_dir.mkdir(parents=True, exist_ok=True)
        rows += cli_optimize(args.cli.split(","), "torch-cuda" if args.device == "cuda"
                             else "torch-cpu", out_dir)
        save_rows(args.out, meta, rows)
    print(f"\n{meta}")
    print(markdown(["model", "dtype", "shape", "contender", "ms", "vs inductor (same mode)",
                    "vs eager", "correct", "graphsub chose"],
                   [[r["model"], r["dtype"], f"{r['batch']}x{r['seq']}", r.get("contender", "-"),
                     str(r.get("ms", "-")), str(r.get("vs_inductor_same_mode") or "-"),
                     str(r.get("vs_eager", "-")), str(r.get("correct", "-")),
                     ",".join(r.get("chosen", [])) or r.get("failed", "")[:60]]
                    for r in rows if "contender" in r or "failed" in r]))


if __name__ == "__main__":
    main()
