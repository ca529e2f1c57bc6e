"""Issue 18's ort-cpu comparison: graphsub (search, fission and kernel orchestration, measured
and confirmed on onnxruntime's CPU provider) against the fusers an onnxruntime user would reach
for instead, on dynamo exports of the transformers models of bench_fission_torch.py.

    python bench/bench_fission_ort.py [--models bert,llama,vit,swin] [--seqs 128,512]
        [--time-limit 60] [--seconds 8] [--threads N] [--out out/bench/fission_ort.json]

Needs the bench extra (pip install -e '.[bench]'). Per model (and per sequence length for the
text models), five ONNX files are timed side by side in one process, blocks of runs in rotating
order with onnxruntime's default session settings (all graph optimizations):
- the export (`torch.onnx.export(..., dynamo=True)`);
- onnxruntime's transformers optimizer (`onnxruntime.transformers.optimizer.optimize_model`,
  the model type that fits: bert, gpt2 for the decoder, vit, swin; its fused com.microsoft
  operators included);
- onnxscript's ORT fusions (`onnxscript.rewriter.ort_fusions.optimize_for_ort`);
- onnxslim (`onnxslim.slim`);
- graphsub (`optimize_model(..., target="ort-cpu")` with its defaults, fission included:
  standard ONNX);
- with `--ort-fusions`, graphsub with that option too ("graphsub+fusions": its candidates also
  written with onnxruntime's com.microsoft operators by onnxscript's fusions, and measured).
Every file is checked against the export on random inputs first. Ratios are medians over rounds
of per-round ratios (the export's time over the other's: above 1 is faster than the export),
and "graphsub / best" is the same against the fastest equivalent peer of that model.

A sixth file, "unguarded", is timed alongside for what it explains and is no way to run a
model: the export with the exporter's guard around each softmax (Where(IsNaN(p), 0, p), which
makes a fully masked query's row zeros) and the mask's Add before it removed by hand: what
those passes cost on onnxruntime. The peers' fused attention kernels run neither; graphsub
drops the guard only where a constant mask proves it changes nothing (rule
softmax-guard-unneeded), as here: these exports have no attention-mask input.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
import traceback
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from bench_fission_torch import build  # noqa: E402
from tables import markdown, peer_models, save_rows  # noqa: E402

import graphsub  # noqa: E402
from graphsub.optimizer import optimize_model  # noqa: E402
from graphsub.runtime import Timing, graph_input_specs, time_models  # noqa: E402
from graphsub.verdicts import compare_models
from graphsub.verdicts.equivalence import Tolerance  # noqa: E402

#: onnxruntime's transformers optimizer: model type, heads and hidden size per model.
ORT_TYPES = {"bert": ("bert", 12, 768), "llama": ("gpt2", 8, 512), "vit": ("vit", 12, 768),
             "swin": ("swin", 3, 96)}
TEXT = {"bert", "llama"}
PEERS = ["ort-transformers", "onnxscript", "onnxslim"]


def export(name: str, seq: int, folder: Path) -> Path:
    import torch

    model, inputs = build(name, seq)
    path = folder / f"{name}_{seq}.onnx" if name in TEXT else folder / f"{name}.onnx"
    with torch.no_grad():
        program = torch.onnx.export(model, inputs, dynamo=True, verbose=False)
    program.save(str(path))
    return path


def peers(name: str, path: Path) -> dict[str, bytes | str]:
    """Each peer's model, or why it has none."""
    return peer_models(path, ORT_TYPES[name], PEERS)


def unguarded(model_bytes: bytes) -> bytes:
    """The model without the softmax guards and the mask additions before them (see above)."""
    model = onnx.load_from_string(model_bytes)
    nodes = list(model.graph.node)
    producer = {o: n for n in nodes for o in n.output}
    renamed: dict[str, str] = {}
    dropped: set[int] = set()
    for n in nodes:
        guard = producer.get(n.input[0]) if n.op_type == "Where" else None
        if guard is not None and guard.op_type == "IsNaN":
            renamed[n.output[0]] = n.input[2]
            dropped |= {id(n), id(guard)}
        if n.op_type == "Softmax" and producer.get(n.input[0]) is not None \
                and producer[n.input[0]].op_type == "Add":
            add = producer[n.input[0]]
            renamed[add.output[0]] = add.input[0]
            dropped.add(id(add))
    kept = [n for n in nodes if id(n) not in dropped]
    for n in kept:
        for i, name in enumerate(n.input):
            while name in renamed:
                name = renamed[name]
            n.input[i] = name
    del model.graph.node[:]
    model.graph.node.extend(kept)
    return model.SerializeToString()


def feeds_for(graph) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    out = {}
    for name, t in graph_input_specs(graph):
        if t.dtype.startswith("int"):
            out[name] = rng.integers(0, 1000, t.shape).astype(t.dtype)
        else:
            out[name] = rng.standard_normal(t.shape).astype(t.dtype)
    return out


def paired(a: Timing, b: Timing) -> float:
    """Median over rounds of a's round median / b's (above 1: b is faster)."""
    return statistics.median(x / y for x, y in zip(a.round_medians(), b.round_medians()))


def measure(name: str, seq: int, folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    path = export(name, seq, folder)
    label = f"{name} seq {seq}" if name in TEXT else name
    original = path.read_bytes()
    graph = graphsub.load(path)
    specs = graph_input_specs(graph)
    row: dict[str, Any] = {"model": label}
    files: dict[str, bytes] = {"export": original}
    for peer, got in peers(name, path).items():
        if isinstance(got, str):
            row[f"{peer}_note"] = got
            continue
        check = compare_models(original, got, specs, Tolerance(1e-3, 1e-4))
        if check.equivalent:
            files[peer] = got
        else:
            row[f"{peer}_note"] = "not equivalent"
    start = time.perf_counter()
    data, report = optimize_model(graph, original, path.name, time_limit=args.time_limit,
                                  target="ort-cpu")
    row.update(optimize_s=time.perf_counter() - start, rules=report.rules_used,
               kept_original=report.kept_original, verdict=report.verdict,
               fission_kept=bool(report.fission.get("kept")),
               fission_kernels=[f"{k['count']} {k['kernel']}"
                                for k in report.fission.get("kernels", [])])
    files["graphsub"] = data
    if args.ort_fusions:
        start = time.perf_counter()
        fused, fused_report = optimize_model(graph, original, path.name,
                                             time_limit=args.time_limit, target="ort-cpu",
                                             ort_fusions=True)
        row.update(fusions_s=time.perf_counter() - start,
                   fusions_rules=fused_report.rules_used,
                   fusions_kept_original=fused_report.kept_original)
        files["graphsub+fusions"] = fused
    files["unguarded"] = unguarded(original)
    timings = dict(zip(files, time_models(list(files.values()), feeds_for(graph),
                                          threads=args.threads, min_seconds=args.seconds)))
    row["export_ms"] = timings["export"].median * 1e3
    for way in files:
        row[f"{way}_ratio"] = paired(timings["export"], timings[way])
    present = [p for p in PEERS if p in files]
    if present:
        best = max(present, key=lambda p: row[f"{p}_ratio"])
        row["best_peer"] = best
        row["graphsub_vs_best"] = paired(timings[best], timings["graphsub"])
        if "graphsub+fusions" in files:
            row["fusions_vs_best"] = paired(timings[best], timings["graphsub+fusions"])
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="bert,llama,vit,swin")
    ap.add_argument("--seqs", default="128,512")
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--ort-fusions", action="store_true",
                    help="also run graphsub with --ort-fusions (onnxruntime's own operators)")
    ap.add_argument("--out", default="out/bench/fission_ort.json")
    args = ap.parse_args()
    folder = Path(args.out).parent
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.models.split(","):
        for seq in ([int(s) for s in args.seqs.split(",")] if name in TEXT else [0]):
            try:
                rows.append(measure(name, seq, folder, args))
            except Exception:  # noqa: BLE001 - one model's failure is shown, the rest run
                traceback.print_exc()
                rows.append({"model": f"{name} {seq}", "error": traceback.format_exc(limit=1)})
            print(rows[-1], flush=True)
    import onnxruntime

    from graphsub.targets.ort import cpu_model

    meta = {"date": date.today().isoformat(), "processor": cpu_model(),
            "machine": platform.machine(), "onnxruntime": onnxruntime.__version__,
            "threads": args.threads or "default", "command": " ".join(sys.argv)}
    save_rows(args.out, meta, rows)
    print(f"\n{meta}\n")
    headers = ["model", "export ms", *PEERS, "graphsub", "graphsub / best peer",
               "graphsub kept", "fission kernels", "unguarded"]
    if args.ort_fusions:
        headers += ["graphsub+fusions", "graphsub+fusions / best peer"]
    lines = []
    for r in rows:
        if "error" in r:
            lines.append([r["model"], "error", "", "", "", "", "", "", "", ""])
            continue
        lines.append([r["model"], f"{r['export_ms']:.2f}",
                      *[f"{r[p + '_ratio']:.3f}" if p + "_ratio" in r else r.get(p + "_note", "")
                        for p in PEERS],
                      f"{r['graphsub_ratio']:.3f}",
                      f"{r['graphsub_vs_best']:.3f} ({r['best_peer']})" if "best_peer" in r else "",
                      "original" if r["kept_original"] else
                      ("fission" if r["fission_kept"] else "search"),
                      ", ".join(r["fission_kernels"]) or "none", f"{r['unguarded_ratio']:.3f}"]
                     + ([f"{r['graphsub+fusions_ratio']:.3f}", f"{r.get('fusions_vs_best', 0):.3f}"]
                        if args.ort_fusions else []))
    print(markdown(headers, lines))


if __name__ == "__main__":
    main()
