"""Where a first torch.compile through graphsub spends a part's time limit (issue 39's GPU
session): the run's set-up (start_run: target, cost model, rules) against its stages.

    GRAPHSUB_CACHE_DIR=$(mktemp -d) PYTHONPATH=src python bench/first_compile.py \\
        [--dtype float16] [--device cpu|cuda] [--time-limit 10]

A 2-layer transformers Llama (hidden 256, eager attention, sequence 128). With a fresh cache
the built-in rules are checked numerically on first use: that must not come out of the
search's time.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch
import transformers

from graphsub.frontends import torch_compile


def timed(name: str, fn: Any) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        result = fn(*args, **kwargs)
        print(f"{name}: {time.perf_counter() - start:.2f} s", flush=True)
        return result
    return wrapper


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", default="float16")
    p.add_argument("--device", default="cpu")
    p.add_argument("--time-limit", type=float, default=10.0)
    args = p.parse_args()
    torch_compile.start_run = timed("start_run", torch_compile.start_run)
    torch_compile.run_stage = timed("stage", torch_compile.run_stage)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=256, intermediate_size=512,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=1000,
                                      attn_implementation="eager")
    model = transformers.LlamaModel(config).to(args.device, getattr(torch, args.dtype)).eval()
    ids = torch.randint(0, 1000, (1, 128), device=args.device)
    start = time.perf_counter()
    compiled = torch.compile(model, backend="graphsub",
                             options={"mode": "default", "time_limit": args.time_limit})
    with torch.no_grad():
        compiled(input_ids=ids)
    report = torch_compile.reports()[-1]
    print(f"compiled in {time.perf_counter() - start:.1f} s, returned {report.chosen}")
    for part in report.parts:
        print(f"part: search {part.search_seconds:.2f} s, rules {sum(part.rules_used.values())},"
              f" notes {part.notes[:1]}")


if __name__ == "__main__":
    main()
