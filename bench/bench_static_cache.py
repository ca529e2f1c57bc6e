"""The decode step over transformers' StaticCache, compiled as transformers teaches compiled
generation (issues 49 and 50).

    python bench/bench_static_cache.py [--family llama|qwen2] [--prefill 1024] [--cache 1056]
        [--steps 16] [--hidden 256] [--layers 4] [--batch 1] [--padding]
        [--grad no_grad|inference_mode] [--modes none,default] [--time-limit 10]
        [--device cpu|cuda] [--dtype float32]

A decoder in its default (SDPA) attention with random weights; its cache filled by an eager
prefill of `--prefill` tokens; then `--steps` decode steps of one token each, run by every
contender on a cache of its own (each filled by the same prefill): eager; inductor alone
(`torch.compile(model)`, in each mode); graphsub (`torch.compile(model, backend="graphsub")`
with no options for mode "none", else `options={"mode": M}`). Contenders take each step in
rotating order. After every step each contender's output and every tensor of its cache are
compared with eager's (the largest absolute difference over the steps is printed); the first
step's time (the compilation) is reported apart; the step's latency is the median over the
other steps, and tokens per second is batch / that median.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def build(family: str, hidden: int, layers: int, device: str, dtype: Any) -> tuple[Any, Any]:
    import torch
    import transformers as tf

    torch.manual_seed(0)
    config_class, model_class, groups = {"llama": (tf.LlamaConfig, tf.LlamaModel, 2),
                                         "qwen2": (tf.Qwen2Config, tf.Qwen2Model, 4)}[family]
    heads = max(hidden // 64, 2)
    config = config_class(vocab_size=1000, hidden_size=hidden, intermediate_size=hidden * 8 // 3,
                          num_hidden_layers=layers, num_attention_heads=heads,
                          num_key_value_heads=max(heads // groups, 1),
                          max_position_embeddings=4096)
    model = model_class(config).eval()
    with torch.no_grad():  # norms away from one, so nothing is trivially the identity
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model.to(device, dtype), config


def cache_tensors(cache: Any) -> list[Any]:
    return [t for layer in cache.layers for t in (layer.keys, layer.values,
                                                  layer.cumulative_length)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="llama", choices=["llama", "qwen2"])
    parser.add_argument("--prefill", type=int, default=1024)
    parser.add_argument("--cache", type=int, default=1056)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--padding", action="store_true", help="left-pad the batch's last row")
    parser.add_argument("--grad", default="no_grad", choices=["no_grad", "inference_mode"])
    parser.add_argument("--modes", default="none,default")
    parser.add_argument("--time-limit", type=float, default=10.0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()

    import torch
    import transformers as tf

    import graphsub.frontends.torch_compile as tc

    dtype = getattr(torch, args.dtype)
    grad = getattr(torch, args.grad)
    model, config = build(args.family, args.hidden, args.layers, args.device, dtype)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 1000, (args.batch, args.prefill), generator=gen).to(args.device)
    mask = torch.ones(args.batch, args.cache, dtype=torch.long, device=args.device)
    if args.padding:
        mask[-1, :args.prefill // 4] = 0
    contenders: dict[str, Any] = {"eager": model}
    for mode in args.modes.split(","):
        inductor_mode = None if mode == "none" else mode
        contenders[f"inductor {mode}"] = torch.compile(model, mode=inductor_mode)
        options = {"time_limit": args.time_limit}
        if inductor_mode:
            options["mode"] = inductor_mode
        contenders[f"graphsub {mode}"] = torch.compile(model, backend="graphsub",
                                                       options=options)
    caches = {}
    for name in contenders:
        cache = tf.StaticCache(config=config, max_cache_len=args.cache)
        with grad():
            model(ids, attention_mask=mask[:, :args.prefill] if args.padding else None,
                  past_key_values=cache,
                  cache_position=torch.arange(args.prefill, device=args.device))
        caches[name] = cache
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    tokens = torch.randint(0, 1000, (args.batch, args.steps), generator=gen).to(args.device)
    times: dict[str, list[float]] = {name: [] for name in contenders}
    worst: dict[str, list[float]] = {name: [0.0, 0.0] for name in contenders}
    names = list(contenders)
    before = len(tc.reports())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for step in range(args.steps):
            position = torch.tensor([args.prefill + step], device=args.device)
            kwargs = {"cache_position": position,
                      "attention_mask": mask if args.padding else None}
            outputs = {}
            for name in names[step % len(names):] + names[:step % len(names)]:
                with grad():
                    sync()
                    t0 = time.perf_counter()
                    out = contenders[name](tokens[:, step:step + 1],
                                           past_key_values=caches[name], **kwargs)
                    sync()
                    times[name].append(time.perf_counter() - t0)
                outputs[name] = out.last_hidden_state.float()
            for name in names:
                worst[name][0] = max(worst[name][0], float(
                    (outputs[name] - outputs["eager"]).abs().max()))
                worst[name][1] = max(worst[name][1], max(
                    float((a.float() - b.float()).abs().max()) for a, b in
                    zip(cache_tensors(caches[name]), cache_tensors(caches["eager"]))))
    eager_step = statistics.median(times["eager"][1:])
    print(f"{args.family} hidden {args.hidden} x {args.layers} layers, {args.dtype}, batch "
          f"{args.batch}{' left-padded' if args.padding else ''}, prefill {args.prefill}, "
          f"cache {args.cache}, {args.steps} steps under {args.grad} on {args.device}")
    print("| contender | first call s | step ms | tokens/s | vs eager | max output diff | "
          "max cache diff |")
    print("|---|---|---|---|---|---|---|")
    for name in names:
        step_time = statistics.median(times[name][1:])
        print(f"| {name} | {times[name][0]:.2f} | {step_time * 1e3:.3f} | "
              f"{args.batch / step_time:.0f} | {eager_step / step_time:.3f} | "
              f"{worst[name][0]:.2e} | {worst[name][1]:.2e} |")
    for report in tc.reports()[before:]:
        print(f"graphsub: writes {len(report.writes)} inputs, chose {report.chosen or '-'}, "
              f"race {report.race}, fallback {report.fallback or '-'}")


if __name__ == "__main__":
    main()
