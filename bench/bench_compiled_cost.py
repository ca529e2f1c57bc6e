"""How well each cost model predicts what inductor runs: a Hugging Face model's captured graph
and its normal form (attention fused), each priced by the compiled, the measured and the
analytic cost model, and each compiled by inductor and timed. The compiled model prices the
kernels inductor builds (graphsub.cost.compiled); the measured one operators one by one.

    python bench/bench_compiled_cost.py --models llama,bert --seq 1024

Use a fresh GRAPHSUB_CACHE_DIR for figures: cached timings taken while the machine was busy
are kept until the cache is cleared.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from bench_gpu import build_model, make_input  # noqa: E402


def captured_graph(kind: str, hidden: int, layers: int, seq: int) -> Any:
    """The graph graphsub converts from the model's one captured part."""
    import torch

    import graphsub.frontends.torch_compile as tc

    graphs = []
    convert = tc.convert_graph

    def keep(*args: Any, **kwargs: Any) -> Any:
        graphs.append(convert(*args, **kwargs))
        return graphs[-1]

    tc.convert_graph = keep
    try:
        torch.manual_seed(0)
        model = build_model(kind, hidden, layers, "eager")
        x = make_input(kind, 1, seq, torch.float32, "cpu")
        fast = torch.compile(model, backend="graphsub",
                             options={"time_limit": 1, "cost": "analytic", "race": False,
                                      "fission": False, "inductor": False})
        with torch.no_grad():
            fast(x)
    finally:
        tc.convert_graph = convert
    return graphs[0][0]


def inductor_seconds(graph: Any, target: Any, rounds: int) -> float:
    """Median seconds of graphsub's program of the graph compiled by inductor."""
    import torch
    from torch._inductor.compile_fx import compile_fx

    inputs = [torch.randint(0, 100, graph[i].type.shape) if "int" in graph[i].type.dtype
              else torch.randn(graph[i].type.shape) for i in graph.inputs]
    fn = compile_fx(target.program(graph).module, inputs)
    with torch.no_grad():
        for _ in range(3):
            fn(*inputs)
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            fn(*inputs)
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="llama,bert")
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--out", default="out/bench/compiled_cost.json")
    args = p.parse_args()

    from graphsub.targets import get_target
    from graphsub.cost import make_cost_model
    from graphsub.pipeline import load_rule_files
    from graphsub.rules.roles import Role, with_role
    from graphsub.search.normal_form import normal_form

    target = get_target("torch-cpu")
    rows = []
    for kind in args.models.split(","):
        graph = captured_graph(kind, args.hidden, args.layers, args.seq)
        normal, _ = normal_form(graph, with_role(load_rule_files([]).rules, Role.NORMAL_FORM),
                                make_cost_model("analytic", target))
        for name, g in (("original", graph), ("normal form", normal)):
            row: dict[str, Any] = {"model": kind, "graph": name,
                                   "inductor_ms": inductor_seconds(g, target, args.rounds) * 1e3}
            for cost in ("compiled", "measured", "analytic"):
                row[f"{cost}_ms"] = make_cost_model(cost, target).graph_cost(g) * 1e3
            rows.append(row)
            print(json.dumps(row), flush=True)
    print("| model | graph | inductor ms | compiled ms | measured ms | analytic ms |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['graph']} | {r['inductor_ms']:.1f} | {r['compiled_ms']:.1f} | "
              f"{r['measured_ms']:.1f} | {r['analytic_ms']:.1f} |")
    print("\n| model | gain of the normal form: inductor | compiled | measured | analytic |")
    print("|---|---|---|---|---|")
    for before, after in zip(rows[::2], rows[1::2]):
        gains = [before[k] / after[k] for k in ("inductor_ms", "compiled_ms", "measured_ms",
                                                "analytic_ms")]
        print(f"| {before['model']} | " + " | ".join(f"{g:.2f}" for g in gains) + " |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"command": " ".join(sys.argv), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
