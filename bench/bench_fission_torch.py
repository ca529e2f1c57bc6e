"""Issue 18's torch-cpu comparison: torch.compile with graphsub's backend (fission and kernel
orchestration included) against inductor, on the fission paper's subgraphs, Segformer and
transformers models, run directly from PyTorch.

    python bench/bench_fission_torch.py [--models softmax,linear_attention,segformer,...]
        [--time-limit 20] [--rounds 15]

Per model, four ways to run it are timed interleaved in one process, round by round (each
round calls every way `--calls` times, in rotating order): eager PyTorch; `torch.compile`
(inductor); `torch.compile(backend="graphsub", options={"inductor": True})`, graphsub's
optimized graph compiled by inductor; and `options={"inductor": False}`, graphsub's own program
(library kernels, and groups of primitives inductor compiles, chosen by Korch's program).
Ratios are medians of per-round ratios against inductor (> 1: faster than inductor); every
compiled output is checked against eager. The races column gives, per captured graph, what the
backend's own final race returned (graphsub's graph compiled by inductor, graphsub's own
module, or the baseline: inductor alone, or eager) and its speedup over the baseline. transformers models are built from their configs
with random weights (no download).
"""

from __future__ import annotations

import argparse
import math
import platform
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

import graphsub.frontends.torch_compile as graphsub_backend


class SoftmaxSubgraph(nn.Module):
    """softmax(Q K^T / sqrt d) V (zoo `softmax_subgraph`)."""

    def forward(self, q, k_t, v):
        return torch.softmax(q @ k_t / math.sqrt(q.shape[-1]), dim=-1) @ v


class LinearAttention(nn.Module):
    """Efficient attention with softmax (zoo `linear_attention`)."""

    def __init__(self, hidden: int = 256, heads: int = 4) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(hidden, hidden) for _ in range(4))
        self.heads = heads

    def forward(self, x):
        s, h = x.shape
        split = lambda t: t.view(s, self.heads, h // self.heads).transpose(0, 1)  # noqa: E731
        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        summary = torch.softmax(k.transpose(1, 2), dim=-1) @ v
        context = torch.softmax(q, dim=-1) @ summary
        return self.o(context.transpose(0, 1).reshape(s, h))


def _randomized(model: nn.Module) -> nn.Module:
    """Every parameter perturbed, so that no norm is the identity and no bias zero."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return model.eval()


def build(name: str, seq: int = 128) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The model and its inputs; `seq` is the text models' sequence length."""
    torch.manual_seed(0)
    if name == "softmax":
        return SoftmaxSubgraph().eval(), (torch.randn(12, 128, 64), torch.randn(12, 64, 128),
                                          torch.randn(12, 128, 64))
    if name == "linear_attention":
        return _randomized(LinearAttention()), (torch.randn(1024, 256),)
    import transformers as tf

    ids = torch.randint(0, 1000, (1, seq))
    if name == "segformer":
        config = tf.SegformerConfig(num_labels=150)
        model = tf.SegformerForSemanticSegmentation(config)
        return _randomized(model), (torch.randn(1, 3, 512, 512),)
    if name == "bert":
        return _randomized(tf.BertModel(tf.BertConfig())), (ids,)
    if name == "llama":  # grouped-query attention: 8 query heads share 2 key/value heads
        config = tf.LlamaConfig(hidden_size=512, intermediate_size=1408, num_hidden_layers=6,
                                num_attention_heads=8, num_key_value_heads=2,
                                vocab_size=1000, use_cache=False)
        return _randomized(tf.LlamaModel(config)), (ids,)
    if name == "vit":
        return _randomized(tf.ViTModel(tf.ViTConfig())), (torch.randn(1, 3, 224, 224),)
    if name == "swin":
        return _randomized(tf.SwinModel(tf.SwinConfig())), (torch.randn(1, 3, 224, 224),)
    raise SystemExit(f"unknown model {name}")


def first_tensor(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    if hasattr(out, "last_hidden_state"):
        return out.last_hidden_state
    if hasattr(out, "logits"):
        return out.logits
    return out[0]


def run(name: str, time_limit: float, rounds: int, calls: int, race: bool = True
        ) -> dict[str, Any]:
    model, inputs = build(name)
    ways: dict[str, Callable[..., Any]] = {"eager": model}
    races: dict[str, list[str]] = {}
    with torch.no_grad():
        want = first_tensor(model(*inputs))
        start = time.perf_counter()
        ways["inductor"] = torch.compile(model)
        ways["inductor"](*inputs)
        compile_s = {"inductor": time.perf_counter() - start}
        for label, options in (("graphsub+inductor", {"inductor": True}),
                               ("graphsub", {"inductor": False})):
            torch._dynamo.reset()
            seen = len(graphsub_backend.reports())
            start = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ways[label] = torch.compile(model, backend="graphsub",
                                            options={**options, "time_limit": time_limit,
                                                     "race": race})
                got = first_tensor(ways[label](*inputs))
            compile_s[label] = time.perf_counter() - start
            scale = float(want.abs().max())
            err = float((got - want).abs().max()) / max(scale, 1e-6)
            if err > 1e-3:
                raise SystemExit(f"{name}: {label} differs from eager (max rel {err:.2e})")
            races[label] = [  # per captured graph: what the backend's final race chose
                "-" if rep.speedup is None else f"{rep.chosen} {rep.speedup:.2f}"
                for rep in graphsub_backend.reports()[seen:]]
        kernels = []  # what graphsub's own program runs (the last compile)
        for report in graphsub_backend.reports()[seen:]:
            for part in report.parts:
                for k in part.fission.get("kernels", []) if part.fission.get("kept") else []:
                    kernels.append(f"{k['count']} {k['kernel']}")
        times: dict[str, list[float]] = {w: [] for w in ways}
        order = list(ways)
        for way in order:  # warm up
            ways[way](*inputs)
        for r in range(rounds):
            for way in order[r % len(order):] + order[:r % len(order)]:
                start = time.perf_counter()
                for _ in range(calls):
                    ways[way](*inputs)
                times[way].append((time.perf_counter() - start) / calls)
    ratios = {w: statistics.median(i / t for i, t in zip(times["inductor"], times[w]))
              for w in ways}
    return {"model": name, "ms": {w: statistics.median(t) * 1e3 for w, t in times.items()},
            "vs_inductor": ratios, "compile_s": compile_s, "kernels": kernels, "races": races}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="softmax,linear_attention,segformer,bert,llama,"
                                            "vit,swin")
    parser.add_argument("--time-limit", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--no-race", dest="race", action="store_false",
                        help="time graphsub's modules themselves, without the backend's race")
    args = parser.parse_args()
    print(f"{platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    print("| model | eager ms | inductor ms | graphsub+inductor ms | graphsub ms | "
          "eager / inductor | graphsub+inductor vs inductor | graphsub vs inductor | "
          "compile s (inductor, g+i, g) | races (g+i; g) | kernels kept |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        r = run(name, args.time_limit, args.rounds, args.calls, args.race)
        ms, vs, cs = r["ms"], r["vs_inductor"], r["compile_s"]
        print(f"| {name} | {ms['eager']:.2f} | {ms['inductor']:.2f} | "
              f"{ms['graphsub+inductor']:.2f} | {ms['graphsub']:.2f} | {vs['eager']:.3f} | "
              f"{vs['graphsub+inductor']:.3f} | {vs['graphsub']:.3f} | "
              f"{cs['inductor']:.0f}, {cs['graphsub+inductor']:.0f}, {cs['graphsub']:.0f} | "
              f"{', '.join(r['races']['graphsub+inductor'])}; {', '.join(r['races']['graphsub'])} | "
              f"{', '.join(r['kernels']) or 'none'} |", flush=True)


if __name__ == "__main__":
    main()
