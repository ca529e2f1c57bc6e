"""GELU as exporters and frameworks write it, read back as one operator (issue 39 item 1):
for each written form, the nodes before and after the library's normal form, and
onnxruntime's CPU time of the form as written against graphsub's one Gelu (opset 20), timed
alternately in one process.

    PYTHONPATH=src python bench/bench_gelu_forms.py [--shape 64x3072] [--rounds 200]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto

import graphsub
from graphsub.cost import AnalyticCostModel
from graphsub.rules import builtin_rules
from graphsub.rules.roles import Role, with_role
from graphsub.search.normal_form import normal_form

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.rules.test_forms import FORMS, gelu_model  # noqa: E402


def session(data: bytes) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="64x3072")
    p.add_argument("--rounds", type=int, default=200)
    args = p.parse_args()
    shape = tuple(int(d) for d in args.shape.split("x"))
    rules = with_role(builtin_rules(), Role.NORMAL_FORM)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    print("| form | nodes written | after | rewritten by | as written (ms) | one Gelu (ms) | ratio |")
    print("|---|---|---|---|---|---|---|")
    for name, (nodes, constants, _) in FORMS.items():
        model = gelu_model(nodes, constants, TensorProto.FLOAT, shape)
        model.opset_import[0].version = 20
        graph = graphsub.load(model.SerializeToString())
        start = time.perf_counter()
        rewritten, steps = normal_form(graph, rules, AnalyticCostModel("cpu"))
        seconds = time.perf_counter() - start
        sessions = {"written": session(model.SerializeToString()),
                    "gelu": session(graphsub.to_onnx(rewritten, opset=20).SerializeToString())}
        want = sessions["written"].run(None, {"x": x})[0]
        got = sessions["gelu"].run(None, {"x": x})[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        times: dict[str, list[float]] = {k: [] for k in sessions}
        for i in range(args.rounds):
            for key in (list(sessions) if i % 2 else list(sessions)[::-1]):
                t = time.perf_counter()
                sessions[key].run(None, {"x": x})
                times[key].append(time.perf_counter() - t)
        a, b = (statistics.median(times[k]) * 1e3 for k in ("written", "gelu"))
        count = sum(1 for n in graph.nodes.values() if n.op not in ("input", "weight"))
        after = sum(1 for n in rewritten.nodes.values() if n.op not in ("input", "weight"))
        rule = ", ".join(sorted({s.rule for s in steps}))
        print(f"| {name} | {count} | {after} | {rule} ({seconds * 1e3:.0f} ms) | {a:.3f} | "
              f"{b:.3f} | {a / b:.2f}x |")


if __name__ == "__main__":
    main()
