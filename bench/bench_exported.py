"""torch.export and AOTInductor (issue 60): a transformers model exported with a dynamic
sequence length, through `graphsub.optimize_exported`, both programs compiled by AOTInductor
and timed side by side; decoders against the hand-written ideal form too (attention with the
causal flag and grouped heads, exported and compiled the same way).

    PYTHONPATH=src python bench/bench_exported.py --models llama,bert --time-limit 20

For each model: the optimized program's outputs against the original package's at three
lengths; median seconds per call of each package (blocks of calls in rotating order,
`bench_gpu.time_blocks`), their ratios; what graphsub rewrote and how long it took. Writes
out/bench/exported.json and prints the markdown table bench/RESULTS.md quotes.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gpu import build_model, error, make_input, time_blocks  # noqa: E402
from tables import cpu_meta, markdown, rules_text, save_rows  # noqa: E402

DECODERS = ("llama", "qwen2")


def register_ideal_prefill() -> None:
    """transformers' attention interface gains "graphsub_ideal": scaled_dot_product_attention
    as a person writes it by hand for a prefill over any length (export's lengths are
    symbolic, at least 2): the causal flag where the model is causal, grouped key/value heads,
    no mask tensor, no copies of the heads."""
    import torch
    import transformers as tf

    def ideal(module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
              dropout: float = 0.0, scaling: float | None = None, is_causal: bool | None = None,
              **kwargs: Any) -> tuple[Any, None]:
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, is_causal=bool(getattr(module, "is_causal", False)),
            scale=scaling, enable_gqa=key.shape[1] != query.shape[1])
        return out.transpose(1, 2).contiguous(), None

    tf.AttentionInterface.register("graphsub_ideal", ideal)
    tf.AttentionMaskInterface.register("graphsub_ideal", tf.masking_utils.sdpa_mask)


def export(kind: str, hidden: int, layers: int, seq: int, attn: str = "sdpa") -> Any:
    import torch

    model = build_model(kind, hidden, layers, attn)
    x = make_input(kind, 1, seq, torch.float32, "cpu")
    length = torch.export.Dim("seq", min=2, max=1024)
    with torch.no_grad():
        return torch.export.export(model, (x,), dynamic_shapes=({1: length},))


def attention_form(program: Any) -> str:
    """How the program computes attention: its fused calls, with their flags."""
    forms: Counter[str] = Counter()
    for node in program.graph.nodes:
        if node.op == "call_function" and "attention" in str(node.target):
            named = dict(zip(("query", "key", "value", "attn_mask", "dropout_p", "is_causal"),
                             node.args), **node.kwargs)
            flags = [k for k in ("is_causal", "enable_gqa") if named.get(k)]
            masked = named.get("attn_mask") is not None
            forms[" ".join(["masked" if masked else "unmasked", *flags])] += 1
    return ", ".join(f"{k} x{v}" for k, v in sorted(forms.items())) or "none fused"


def run_model(kind: str, args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    import torch
    from torch._inductor import aoti_compile_and_package, aoti_load_package

    from graphsub.frontends.exported import last_report, optimize_exported

    ep = export(kind, args.hidden, args.layers, args.seq)
    started = time.perf_counter()
    # (--candidate: graphsub's rewritten program whatever the race would decide, to measure
    # what the rewrites give; by default what optimize_exported returns)
    fast = optimize_exported(ep, time_limit=args.time_limit, race=not args.candidate,
                             package=scratch / f"{kind}-graphsub.pt2")
    seconds = time.perf_counter() - started
    report = last_report()
    assert report is not None
    packages = {"original": aoti_compile_and_package(
        ep, package_path=str(scratch / f"{kind}-original.pt2")),
                "graphsub": str(scratch / f"{kind}-graphsub.pt2")}
    if kind in DECODERS:
        ideal = export(kind, args.hidden, args.layers, args.seq, attn="graphsub_ideal")
        packages["ideal"] = aoti_compile_and_package(
            ideal, package_path=str(scratch / f"{kind}-ideal.pt2"))
    loaded = {name: aoti_load_package(path) for name, path in packages.items()}
    used: Counter[str] = Counter()
    for part in report.parts:
        used.update(part.rules_used)
    row: dict[str, Any] = {
        "model": kind, "hidden": args.hidden, "layers": args.layers, "example": args.seq,
        "returned": "graphsub" if fast is not ep else "original", "race": report.race,
        "fallback": report.fallback, "optimize_s": round(seconds, 1),
        "attention": attention_form(fast), "attention_before": attention_form(ep),
        "parameters_added": sum(t.numel() for n, t in fast.state_dict.items()
                                if n.startswith("graphsub.")),
        "parameters": (sum(t.numel() for t in ep.state_dict.values()),
                       sum(t.numel() for t in fast.state_dict.values())),
        "package_bytes": {name: Path(path).stat().st_size for name, path in packages.items()},
        "rules": dict(used.most_common()), "lengths": {}}
    for length in args.lengths:
        x = make_input(kind, 1, length, torch.float32, "cpu")
        with torch.no_grad():
            outs = {name: fn(x) for name, fn in loaded.items()}
            medians = time_blocks({name: (lambda fn=fn: fn(x)) for name, fn in loaded.items()},
                                  args.rounds, "cpu")
        row["lengths"][length] = {
            "error": error(outs["graphsub"], outs["original"]),
            "ms": {name: round(t * 1e3, 4) for name, t in medians.items()},
            "speedup": round(medians["original"] / medians["graphsub"], 3),
            **({"vs_ideal": round(medians["ideal"] / medians["graphsub"], 3)}
               if "ideal" in medians else {})}
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="llama,bert")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seq", type=int, default=128, help="the example's length")
    parser.add_argument("--lengths", default="32,128,384",
                        help="lengths the packages are compared and timed at")
    parser.add_argument("--time-limit", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--candidate", action="store_true",
                        help="time graphsub's rewritten program without the race that decides "
                             "whether it is returned")
    parser.add_argument("--out", default="out/bench/exported.json")
    args = parser.parse_args()
    args.lengths = [int(n) for n in args.lengths.split(",")]
    register_ideal_prefill()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-exported-") as scratch:
        for kind in args.models.split(","):
            rows.append(run_model(kind, args, Path(scratch)))
            print(rows[-1], flush=True)
    save_rows(args.out, {**cpu_meta(), "args": vars(args)}, rows)
    lines = []
    for r in rows:
        for length, m in r["lengths"].items():
            lines.append([r["model"], str(length), r["returned"],
                          f"{m['ms']['original']:.3f}", f"{m['ms']['graphsub']:.3f}",
                          f"{m['speedup']:.3f}x",
                          f"{m['vs_ideal']:.3f}x" if "vs_ideal" in m else "",
                          f"{m['error']:.1e}", r["attention"], f"{r['optimize_s']:.0f}"])
    print(markdown(["model", "length", "returned", "original ms", "graphsub ms",
                    "speedup", "vs ideal form", "max error", "attention after",
                    "optimize s"], lines))
    for r in rows:
        print(f"{r['model']}: {rules_text(r['rules'])}; race {r['race']}; attention before: "
              f"{r['attention_before']}; parameters {r['parameters'][0]} -> "
              f"{r['parameters'][1]} ({r['parameters_added']} in merged weights); package "
              f"bytes {r['package_bytes']}")


if __name__ == "__main__":
    main()
