"""What a rewrite buys on this machine: apply rules everywhere they match (repeatedly, until no
match is left), then compare predicted cost and measured latency with the original.

    python bench/probe_rewrites.py MODEL RULE[,RULE...] [MODEL RULES ...]

With no arguments it runs the probes quoted in bench/RESULTS.md. Latencies are head to head
(`compare_speed`: onnxruntime defaults, paired per-round ratios).
"""

from __future__ import annotations

import sys

from graphsub import zoo
from graphsub.targets import get_target
from graphsub.cost import MeasuredCostModel
from graphsub.ir.graph import Graph
from graphsub.onnx_io import to_onnx_bytes
from graphsub.rules import apply_match, builtin_rules, find_matches
from graphsub.rules.applier import Rejection
from graphsub.runtime import compare_speed, graph_input_specs, random_feeds

PROBES = [
    ("nasrnn", "merge-matmuls-shared-input"),
    ("bert", "merge-matmuls-shared-input"),
    ("inception_v3", "merge-convs-shared-input"),
    ("resnext50", "split-grouped-conv"),
    ("nasnet_a", "avgpool-as-depthwise-conv,add-convs-shared-input,merge-convs-shared-input"),
]


def rewrite_everywhere(graph: Graph, rule_names: list[str], limit: int = 2000) -> tuple[Graph, int]:
    rules = {r.name: r for r in builtin_rules()}
    current, applied = graph, 0
    while applied < limit:
        for name in rule_names:
            new = next((g for m in find_matches(current, rules[name])
                        if not isinstance(g := apply_match(current, m), Rejection)), None)
            if new is not None:
                current, applied = new, applied + 1
                break
        else:
            break
    return current, applied


def probe(model: str, rule_names: list[str], cost: MeasuredCostModel) -> None:
    graph = zoo.build(model)
    rewritten, applied = rewrite_everywhere(graph, rule_names)
    feeds = random_feeds(graph_input_specs(graph))
    paired = compare_speed(to_onnx_bytes(graph), to_onnx_bytes(rewritten), feeds)
    print(f"| {model} | {', '.join(rule_names)} | {applied} | {cost.graph_cost(graph) * 1e3:.2f} | "
          f"{cost.graph_cost(rewritten) * 1e3:.2f} | {paired.before.median * 1e3:.2f} | "
          f"{paired.after.median * 1e3:.2f} | {paired.speedup:.3f} | {paired.wins:.0%} |", flush=True)


def main() -> None:
    args = sys.argv[1:]
    probes = [(args[i], args[i + 1]) for i in range(0, len(args) - 1, 2)] if args else PROBES
    cost = MeasuredCostModel(get_target("ort-cpu"))
    print("| model | rules | applied | predicted before ms | predicted after ms | measured before ms"
          " | measured after ms | speedup (paired) | rounds faster |")
    print("|---|---|---|---|---|---|---|---|---|")
    for model, rules in probes:
        probe(model, rules.split(","), cost)


if __name__ == "__main__":
    main()
