"""The graph matcher's speed: every built-in rule's `find_matches` on a few zoo models,
median of repeats. Run it with two source trees to compare them:

    PYTHONPATH=<src> python bench/bench_matcher.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

from graphsub import zoo
from graphsub.rules import builtin_rules, find_matches

MODELS = ("bert", "resnext50", "nasrnn", "squeezenet")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    rules = builtin_rules(check=False)
    graphs = [zoo.build(name) for name in MODELS]
    seconds = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        for graph in graphs:
            for rule in rules:
                find_matches(graph, rule)
        seconds.append(time.perf_counter() - start)
    median = statistics.median(seconds)
    print(f"{len(rules)} rules on {', '.join(MODELS)}: median {median:.3f} s, least "
          f"{min(seconds):.3f} s over {args.repeats} repeats")


if __name__ == "__main__":
    main()
