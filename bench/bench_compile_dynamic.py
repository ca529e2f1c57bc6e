"""torch.compile with dynamic sizes (issue 27): one graphsub compilation over dynamo's size
symbols serving several sequence lengths, against inductor with `dynamic=True`.

    python bench/bench_compile_dynamic.py [--models bert,llama] [--seqs 32 128 384]
        [--batch 2] [--time-limit 20] [--rounds 30] [--out out/bench/compile_dynamic.json]

Needs torch and transformers (the test extra). Per model (transformers' BertModel and
LlamaModel with grouped-query attention and rotary embeddings, random weights, an
attention_mask with padding in the first sequence), four ways of running it:
- eager: the module as it is;
- inductor: `torch.compile(model, dynamic=True)`;
- graphsub: `torch.compile(model, backend="graphsub", dynamic=True, options={"inductor":
  False})` (what the backend returns: graphsub's module, or eager where its race found
  graphsub's module not faster);
- graphsub+inductor: the same with `options={"inductor": True}` (graphsub's parts traced
  by inductor over the symbols, or inductor alone where the race found that faster).
Each is compiled on the first sequence length and then called at every length; the number
of compilations each made is counted (graphsub's reports; inductor's through a counting
backend around it), every output is compared with eager's, and at each length the four are
timed in rounds of one call each, in rotating order; ratios are medians of per-round ratios
(eager / other: above 1 is faster).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tables import cpu_meta, markdown, save_rows  # noqa: E402


def text_module(kind: str, hidden: int, layers: int) -> Any:
    """A transformers encoder (bert) or decoder (llama), returning the last hidden state."""
    import torch
    from transformers import BertConfig, BertModel, LlamaConfig, LlamaModel

    torch.manual_seed(0)
    heads = hidden // 64
    if kind == "bert":
        inner = BertModel(BertConfig(vocab_size=30522, hidden_size=hidden,
                                     num_hidden_layers=layers, num_attention_heads=heads,
                                     intermediate_size=4 * hidden,
                                     max_position_embeddings=512), add_pooling_layer=False)
    else:
        inner = LlamaModel(LlamaConfig(vocab_size=32000, hidden_size=hidden,
                                       num_hidden_layers=layers, num_attention_heads=heads,
                                       num_key_value_heads=max(1, heads // 3),
                                       intermediate_size=int(2.75 * hidden),
                                       max_position_embeddings=2048))

    class LastHiddenState(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            extra = {"use_cache": False} if kind == "llama" else {}
            return self.inner(input_ids=input_ids, attention_mask=attention_mask,
                              **extra).last_hidden_state

    return LastHiddenState().eval()


def inputs(batch: int, seq: int, seed: int) -> tuple[Any, Any]:
    import torch

    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 1000, (batch, seq), generator=gen)
    mask = torch.ones(batch, seq, dtype=torch.int64)
    mask[0, seq // 2:] = 0
    return ids, mask


def contenders(model: Any, time_limit: float) -> tuple[dict[str, Callable], dict[str, list]]:
    """The compiled models, and what each compiled (a list per contender, filled as they
    compile)."""
    import torch
    from torch._inductor.compile_fx import compile_fx

    compiled: dict[str, list] = {"inductor": [], "graphsub": [], "graphsub+inductor": []}

    def counting_inductor(gm: Any, example_inputs: Any) -> Any:
        compiled["inductor"].append(gm)
        return compile_fx(gm, example_inputs)

    out = {
        "eager": model,
        "inductor": torch.compile(model, backend=counting_inductor, dynamic=True),
        "graphsub": torch.compile(model, backend="graphsub", dynamic=True,
                                  options={"time_limit": time_limit, "inductor": False}),
        "graphsub+inductor": torch.compile(model, backend="graphsub", dynamic=True,
                                           options={"time_limit": time_limit,
                                                    "inductor": True}),
    }
    return out, compiled


def paired_times(fns: dict[str, Callable], args: tuple, rounds: int) -> dict[str, list[float]]:
    import torch

    names = list(fns)
    times: dict[str, list[float]] = {n: [] for n in names}
    with torch.no_grad():
        for name in names:  # warm: allocations, first-call work
            fns[name](*args)
        for r in range(rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                start = time.perf_counter()
                fns[name](*args)
                times[name].append(time.perf_counter() - start)
    return times


def measure(kind: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    import torch

    from graphsub.frontends import torch_compile

    model = text_module(kind, args.hidden, args.layers)
    fns, compiled = contenders(model, args.time_limit)
    first = len(torch_compile.reports())
    compile_seconds: dict[str, float] = {}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        example = inputs(args.batch, args.seqs[0], 0)
        for name, fn in fns.items():
            start = time.perf_counter()
            fn(*example)
            compile_seconds[name] = time.perf_counter() - start
    at_first = {"graphsub (both)": len(torch_compile.reports()) - first,
                "inductor": len(compiled["inductor"])}
    rows = []
    for seq in args.seqs:
        call = inputs(args.batch, seq, seq)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            want = model(*call)
            errors = {name: float((fn(*call) - want).abs().max()) for name, fn in fns.items()
                      if name != "eager"}
            times = paired_times(fns, call, args.rounds)
        ratios = {name: statistics.median(e / t for e, t in zip(times["eager"], times[name]))
                  for name in fns if name != "eager"}
        rows.append({"model": kind, "batch": args.batch, "seq": seq,
                     "eager_ms": 1e3 * statistics.median(times["eager"]),
                     "ms": {n: 1e3 * statistics.median(t) for n, t in times.items()},
                     "speedup_vs_eager": ratios, "max_abs_error": errors})
    new_reports = torch_compile.reports()[first:]
    # Graphs compiled on the first call, and compiled again at the other lengths (a
    # recompile would mean a size was not kept symbolic).
    rows[0]["compilations"] = {
        name: {"first call": n, "later": (len(new_reports) if name != "inductor"
                                          else len(compiled["inductor"])) - n}
        for name, n in at_first.items()}
    rows[0]["compile_seconds"] = compile_seconds
    rows[0]["graphsub_reports"] = [
        {"chosen": r.chosen, "race": r.race, "sizes": r.sizes, "fallback": r.fallback,
         "rules": [p.rules_used for p in r.parts if not p.kept]} for r in new_reports]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="bert,llama")
    ap.add_argument("--seqs", type=int, nargs="+", default=[32, 128, 384])
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=384)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--time-limit", type=float, default=20.0)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--out", default="out/bench/compile_dynamic.json")
    args = ap.parse_args()
    import torch
    import transformers

    rows = []
    for kind in args.models.split(","):
        rows += measure(kind, args)
    meta = {**cpu_meta(), "torch": torch.__version__, "transformers": transformers.__version__,
            "threads": torch.get_num_threads()}
    save_rows(args.out, meta, rows)
    names = ["inductor", "graphsub", "graphsub+inductor"]
    print(markdown(["model", "batch x seq", "eager ms"] + [f"{n} / eager" for n in names]
                   + ["worst abs error"],
                   [[r["model"], f"{r['batch']}x{r['seq']}", f"{r['eager_ms']:.2f}"]
                    + [f"{r['speedup_vs_eager'][n]:.3f}" for n in names]
                    + [f"{max(r['max_abs_error'].values()):.1e}"] for r in rows]))
    for r in rows:
        if "compilations" in r:
            print(r["model"], "compilations:", r["compilations"], "compile s:",
                  {k: round(v, 1) for k, v in r["compile_seconds"].items()})
            for rep in r["graphsub_reports"]:
                print("  graphsub:", rep)


if __name__ == "__main__":
    main()
