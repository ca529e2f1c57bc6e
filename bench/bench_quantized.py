"""Quantized models in onnxruntime's four formats (issue 28): a ResNet-style CNN (the zoo's
resnet_blocks) quantized to QDQ and QOperator by quantize_static, and a transformer (the
zoo's BERT, 2 layers, hidden 256) quantized by quantize_dynamic and to 4-bit MatMul weights
by MatMulNBitsQuantizer, through `graphsub optimize` next to onnxsim, onnxslim and
onnxruntime's offline optimizer on onnxruntime's CPU provider.

    python bench/bench_quantized.py [--time-limit 60] [--seconds 4] [--cache out/quantized]
        [--out out/bench/quantized.json]

Per model: whether graphsub's output equals the original (quantized outputs as onnxruntime
computes them), its weights' size against the original's (a folded DequantizeLinear would
store its weights as float32, four times the int8), and the speed of every file against
the original, timed side by side (bench_real_models.measure).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from bench_real_models import arguments, measure, ratio  # noqa: E402
from tables import cpu_meta, markdown, save_rows  # noqa: E402

import graphsub  # noqa: E402
from graphsub import zoo  # noqa: E402
from graphsub.runtime import graph_input_specs, random_feeds  # noqa: E402

#: name -> (zoo model, quantizer)
MODELS = {"resnet_qdq": ("resnet_blocks", "qdq"), "resnet_qoperator": ("resnet_blocks", "qoperator"),
          "bert_dynamic": ("bert:layers=2,hidden=256,seq=64", "dynamic"),
          "bert_4bit": ("bert:layers=2,hidden=256,seq=64", "nbits")}
QUANTIZERS = {"qdq": "quantize_static (QDQ)", "qoperator": "quantize_static (QOperator)",
              "dynamic": "quantize_dynamic", "nbits": "MatMulNBitsQuantizer (4-bit)"}


def quantized(zoo_name: str, how: str, folder: Path) -> Path:
    """The zoo model written as ONNX and quantized by onnxruntime's tool for `how`, calibrated
    (static formats) on eight random input sets."""
    import onnx
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, quantize_dynamic,
                                          quantize_static)
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    graph = zoo.build(zoo_name)
    src = folder / f"{zoo_name.split(':')[0]}.float.onnx"
    out = folder / f"{zoo_name.split(':')[0]}_{how}.onnx"
    if out.exists():
        return out
    onnx.save(graphsub.to_onnx(graph), src)

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = [random_feeds(graph_input_specs(graph), seed=i) for i in range(8)]

        def get_next(self):
            return self.feeds.pop() if self.feeds else None

    if how == "dynamic":
        quantize_dynamic(str(src), str(out))
    elif how == "nbits":
        quantizer = MatMulNBitsQuantizer(onnx.load(src), block_size=32, is_symmetric=False,
                                         bits=4)
        quantizer.process()
        quantizer.model.save_model_to_file(str(out), False)
    else:
        quantize_static(str(src), str(out), Reader(),
                        quant_format=QuantFormat.QDQ if how == "qdq" else QuantFormat.QOperator)
    return out


def main() -> None:
    args = arguments(",".join(MODELS), 60.0, "out/quantized", "out/bench/quantized.json")
    folder = Path(args.cache)
    folder.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for name in args.models.split(","):
        zoo_name, how = MODELS[name]
        row = measure(name, quantized(zoo_name, how, folder), args, QUANTIZERS[how], {}, {})
        print(json.dumps(row), flush=True)
        rows.append(row)
    save_rows(args.out, {**cpu_meta(), "command": " ".join(sys.argv)}, rows)
    headers = ["model", "quantizer", "weights MB", "graphsub weights MB", "equal", "original ms",
               "graphsub", "onnxsim", "onnxslim", "ort offline", "graphsub's rewrites"]
    print(markdown(headers, [[r["model"], r["exporter"], f"{r['initializer_mb']:.2f}",
                              f"{r.get('graphsub_initializer_mb', float('nan')):.2f}",
                              str(r.get("graphsub_equivalent", r.get("error"))),
                              f"{r.get('original_ms', float('nan')):.2f}", ratio(r, "graphsub"),
                              ratio(r, "onnxsim"), ratio(r, "onnxslim"), ratio(r, "ort-offline"),
                              ", ".join(f"{k} x{v}" for k, v in (r.get("rules") or {}).items())
                              or "(original kept)"] for r in rows]))


if __name__ == "__main__":
    main()
