"""onnxruntime's fused attention kernels on the CPU against the operators they replace
(issue 37): does writing attention as one operator pay on onnxruntime?

    python bench/bench_ort_attention.py [--seqs 512 1024 2048] [--heads 8] [--head-size 64]
        [--runs 10]

One attention, batch 1, float32, scale 1/8: ONNX Attention (opset 23, causal) against the
materialized form (MatMul, Mul, Add of a causal mask, Softmax, MatMul); com.microsoft
MultiHeadAttention (no mask; query transposed to batch x sequence x hidden around it)
against the materialized form without the mask. Each model gets its own session (default
options, all graph optimizations); medians of `--runs` runs after one warm-up. Ratios are
the fused kernel's time over the materialized form's (above 1: the fused one is slower).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tables import cpu_meta, markdown  # noqa: E402


def median_ms(model: bytes, feeds: dict[str, np.ndarray], runs: int) -> tuple[float, np.ndarray]:
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    out = session.run(None, feeds)[0]
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3, out


def models(seq: int, heads: int, size: int) -> dict[str, bytes]:
    def info(name, shape):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)

    inputs = [info(n, [1, heads, seq, size]) for n in "qkv"]
    out = [info("y", None)]
    scale = numpy_helper.from_array(np.array(size ** -0.5, np.float32), "c")
    mask = numpy_helper.from_array(np.triu(np.full((seq, seq), -np.inf, np.float32), 1)
                                   [None, None], "m")

    def materialized(masked: bool) -> bytes:
        nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
                 helper.make_node("MatMul", ["q", "kt"], ["s"]),
                 helper.make_node("Mul", ["s", "c"], ["s2"])]
        if masked:
            nodes.append(helper.make_node("Add", ["s2", "m"], ["s3"]))
        nodes += [helper.make_node("Softmax", ["s3" if masked else "s2"], ["p"], axis=-1),
                  helper.make_node("MatMul", ["p", "v"], ["y"])]
        graph = helper.make_graph(nodes, "g", inputs, out, [scale] + ([mask] if masked else []))
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]
                                 ).SerializeToString()

    attention = helper.make_graph(
        [helper.make_node("Attention", ["q", "k", "v"], ["y"], is_causal=1,
                          scale=float(size ** -0.5))], "g", inputs, out)
    shape3 = numpy_helper.from_array(np.array([1, seq, heads * size], np.int64), "shape3")
    shape4 = numpy_helper.from_array(np.array([1, seq, heads, size], np.int64), "shape4")
    mha = helper.make_graph(
        [helper.make_node("Transpose", ["q"], ["qt"], perm=[0, 2, 1, 3]),
         helper.make_node("Reshape", ["qt", "shape3"], ["q3"]),
         helper.make_node("MultiHeadAttention", ["q3", "k", "v"], ["y3"],
                          domain="com.microsoft", num_heads=heads, scale=float(size ** -0.5)),
         helper.make_node("Reshape", ["y3", "shape4"], ["y4"]),
         helper.make_node("Transpose", ["y4"], ["y"], perm=[0, 2, 1, 3])],
        "g", inputs, out, [shape3, shape4])
    return {
        "attention-23": helper.make_model(
            attention, opset_imports=[helper.make_opsetid("", 23)]).SerializeToString(),
        "materialized causal": materialized(True),
        "multi-head-attention": helper.make_model(
            mha, opset_imports=[helper.make_opsetid("", 17),
                                helper.make_opsetid("com.microsoft", 1)]).SerializeToString(),
        "materialized": materialized(False),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seqs", type=int, nargs="+", default=[512, 1024, 2048])
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-size", type=int, default=64)
    p.add_argument("--runs", type=int, default=10)
    args = p.parse_args()
    rows = []
    for seq in args.seqs:
        rng = np.random.default_rng(0)
        feeds = {n: rng.standard_normal((1, args.heads, seq, args.head_size)).astype(np.float32)
                 for n in "qkv"}
        ms, outs = {}, {}
        for name, model in models(seq, args.heads, args.head_size).items():
            ms[name], outs[name] = median_ms(model, feeds, args.runs)
        for fused, plain in (("attention-23", "materialized causal"),
                             ("multi-head-attention", "materialized")):
            diff = float(np.abs(outs[fused] - outs[plain]).max())
            rows.append([str(seq), fused, f"{ms[fused]:.2f}", f"{ms[plain]:.2f}",
                         f"{ms[fused] / ms[plain]:.2f}", f"{diff:.1e}"])
    print(cpu_meta())
    print(markdown(["seq", "fused kernel", "fused ms", "materialized ms",
                    "fused / materialized", "max |diff|"], rows))


if __name__ == "__main__":
    main()
