"""Foundation benchmarks (issue 2): ONNX load + save of the largest zoo model, structural hash
of a 500-node graph, one copy-on-write node replacement.

    python bench/bench_ir.py [--json]

Prints medians over repeated runs; targets: load + save of NasNet-A < 2 s, hash of a
500-node graph < 20 ms, one replacement < 1 ms.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import graphsub
from graphsub import zoo
from graphsub.ir.graph import Graph, Value
from graphsub.ir.hashing import graph_hash


def median_time(fn: Callable[[], object], repeats: int) -> tuple[float, list[float]]:
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples), samples


def largest_zoo_model() -> tuple[str, Graph]:
    """The paper zoo model with the most nodes (NasNet-A)."""
    best: tuple[str, Graph] | None = None
    for m in zoo.models():
        if m.name.startswith("light_") or m.params:
            continue
        g = m.build()
        if best is None or len(g) > len(best[1]):
            best = (m.name, g)
    assert best is not None
    return best


def graph_of_about(n_nodes: int) -> Graph:
    """A real model cut to about n nodes: resnet_blocks with enough blocks."""
    per_block = len(zoo.build("resnet_blocks:n=2")) - len(zoo.build("resnet_blocks:n=1"))
    blocks = max(1, round(n_nodes / per_block))
    return zoo.build(f"resnet_blocks:n={blocks}")


def replace_one_node(g: Graph, target: int) -> Graph:
    """Swap one relu for a sigmoid: add a node, redirect its users, drop the old one."""
    ed = g.edit()
    (new,) = ed.add("sigmoid", [g[target].inputs[0]])
    ed.replace_uses(Value(target), new)
    return ed.finish()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results: dict[str, object] = {"machine": f"{platform.machine()}, {platform.processor() or 'cpu'}, "
                                             f"python {platform.python_version()}",
                                  "graphsub": graphsub.__version__}

    name, big = largest_zoo_model()
    with tempfile.TemporaryDirectory() as d:
        src, dst = Path(d) / "src.onnx", Path(d) / "dst.onnx"
        graphsub.save(big, src)
        med, _ = median_time(lambda: graphsub.save(graphsub.load(src), dst), repeats=5)
        results["load_save"] = {"model": name, "nodes": len(big),
                                "file_mb": round(src.stat().st_size / 1e6, 1),
                                "median_s": round(med, 3), "target_s": 2.0}

    g = graph_of_about(500)

    def fresh_hash() -> str:
        return graph_hash(Graph(g.nodes, g.inputs, g.outputs, g.output_names, check=False))

    med, _ = median_time(fresh_hash, repeats=50)
    results["structural_hash"] = {"nodes": len(g), "median_ms": round(med * 1e3, 3),
                                  "target_ms": 20.0}

    relus = g.nodes_by_op("relu")
    target = relus[len(relus) // 2]
    med, _ = median_time(lambda: replace_one_node(g, target), repeats=200)
    results["cow_replace"] = {"nodes": len(g), "median_ms": round(med * 1e3, 3),
                              "target_ms": 1.0}

    if args.json:
        print(json.dumps(results, indent=2))
        return
    ls = results["load_save"]
    print(f"load + save {ls['model']} ({ls['nodes']} nodes, {ls['file_mb']} MB): "
          f"{ls['median_s']:.3f} s (target < 2 s)")
    h = results["structural_hash"]
    print(f"structural hash, {h['nodes']} nodes: {h['median_ms']:.3f} ms (target < 20 ms)")
    c = results["cow_replace"]
    print(f"copy-on-write replacement, {c['nodes']} nodes: {c['median_ms']:.3f} ms (target < 1 ms)")


if __name__ == "__main__":
    main()
