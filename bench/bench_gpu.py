"""graphsub against inductor in each of its modes, through torch.compile, over a grid of
models, workloads, modes and precisions (issues 37 and 50).

    python bench/bench_gpu.py [--models llama,qwen2,bert,vit,resnet,convnext]
        [--attn default|eager] [--dtypes bfloat16,float16]
        [--shapes 1x128,16x512,1x2048,1x8192,decode2048,decode8192]
        [--modes eager,default,reduce-overhead,max-autotune] [--layers 4] [--hidden 1024]
        [--time-limit 10] [--rounds 15] [--block-seconds 0.05] [--budget 480]
        [--device cuda|cpu] [--no-ideal]
        [--out out/bench/gpu.json]

Hugging Face architectures with random weights, as their owners write them (transformers'
own modules, no export), in transformers' default attention (SDPA; `--attn eager` for the
eager form): grouped-query decoders (Llama: 16 query / 8 key-value heads at hidden 1024;
Qwen2: biases on the projections, 4 query heads per key-value head), GPT-2 (a causal
decoder, one key/value head per query head: its prefill), an encoder (BERT), a vision
transformer (ViT; a shape's sequence is its number of patches), CNNs (ResNet-50's and
ConvNeXt-T's layouts; batch from the shape). A shape is a prefill or a whole-sequence pass,
`BxS`, or for the decoders one decode step over a StaticCache of L positions, `decodeL`
(filled by an eager prefill; each contender writes its own cache, put back to L positions
before each block of timed calls).

The contenders, for each model, precision, shape and mode: the module eager; inductor alone
(`torch.compile(model, mode=M)`); graphsub in the same mode (`torch.compile(model,
backend="graphsub", options={"mode": M, "time_limit": T})`); and, for the attention models,
the *ideal form* under inductor in the mode: the same weights with attention called by hand
as scaled_dot_product_attention with the causal flag and grouped key/value heads, no mask
tensor and no copies (the decode step keeps the cache's mask, with grouped heads): what a
perfect rewrite of the attention reaches; and for the decoders the *merged form* under
inductor: the ideal form written by hand once more as serving libraries write it, q|k|v
and gate|up each one product, each RMSNorm's scale folded into the weights that read it
(`merged_form`). graphsub's bar is the best of inductor and the two hand-written forms.

Every output is checked against the module computed in float32 (its error may be at most 4x
the eager module's own, plus 1e-3 of its scale); timing is by CUDA events (wall clock on the
CPU) around blocks of calls, contenders interleaved in rotating order, `--rounds` blocks
each, under torch.no_grad() (not inference mode: graphsub's result must work outside it);
figures are medians per call and ratios of medians measured side by side. Each contender's
compilation seconds are recorded (inductor's autotuning results are cached in the process,
so later contenders reuse them). Results are written after each configuration (`--out`), so
a run cut short keeps what it measured; `--budget` seconds stops starting new
configurations. The last lines printed are a table and, per mode, the geometric means over
the grid of graphsub against inductor and against the best of inductor and the ideal form.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
import traceback
import warnings
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tables import markdown, save_rows  # noqa: E402

MODES = ("eager", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
DECODERS = ("llama", "qwen2")
ATTENTION_MODELS = DECODERS + ("gpt2", "bert", "vit")
#: Positions a decode step's cache holds beyond the prefill: room for a block of timed calls.
DECODE_ROOM = 256


def register_ideal_attention() -> None:
    """transformers' attention interface gains "graphsub_ideal": scaled_dot_product_attention
    called as a person would by hand, with the causal flag (a decoder's prefill) and grouped
    key/value heads, without a mask tensor or copies of the heads; the decode step, whose
    cache holds positions not yet written, keeps its mask."""
    import torch
    import transformers as tf

    def ideal(module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
              dropout: float = 0.0, scaling: float | None = None, is_causal: bool | None = None,
              **kwargs: Any) -> tuple[Any, None]:
        causal = bool(getattr(module, "is_causal", False)) and query.shape[2] > 1
        mask = attention_mask if query.shape[2] == 1 else None
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, is_causal=causal, scale=scaling,
            enable_gqa=key.shape[1] != query.shape[1])
        return out.transpose(1, 2).contiguous(), None

    tf.AttentionInterface.register("graphsub_ideal", ideal)
    # the masks SDPA takes (a boolean mask, left out where it is only causal)
    tf.AttentionMaskInterface.register("graphsub_ideal", tf.masking_utils.sdpa_mask)


def merged_form(model: Any) -> Any:
    """A decoder (from `build_model`, with the ideal attention) written by hand once more,
    as serving libraries write it: the products that share an input merged (q|k|v into one
    product, gate|up into one: TASO's merge of matmuls that read one input) and each
    RMSNorm's scale folded into the weights of the products that read it (the norm then
    has none), computed once here. The same function as the model's, up to rounding."""
    import torch

    def merged(linears: list[Any], scale: Any) -> Any:
        weight = torch.cat([m.weight for m in linears]) * scale[None, :]
        bias = None if linears[0].bias is None else torch.cat([m.bias for m in linears])
        out = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
        with torch.no_grad():
            out.weight.copy_(weight)
            if bias is not None:
                out.bias.copy_(bias)
        return out

    def unscaled_norm(norm: Any) -> None:
        def forward(x: Any) -> Any:
            wide = x.to(torch.float32)
            wide = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
            return wide.to(x.dtype)

        norm.forward = forward

    with torch.no_grad():
        for layer in model.inner.layers:
            attn, mlp = layer.self_attn, layer.mlp
            attn.qkv = merged([attn.q_proj, attn.k_proj, attn.v_proj],
                              layer.input_layernorm.weight)
            attn.forward = _merged_attention(attn)
            mlp.gate_up = merged([mlp.gate_proj, mlp.up_proj],
                                 layer.post_attention_layernorm.weight)
            mlp.forward = _merged_mlp(mlp)
            for name in ("q_proj", "k_proj", "v_proj"):
                delattr(attn, name)
            del mlp.gate_proj, mlp.up_proj
            unscaled_norm(layer.input_layernorm)
            unscaled_norm(layer.post_attention_layernorm)
    return model


def _merged_attention(attn: Any) -> Callable[..., Any]:
    """transformers' Llama/Qwen2 attention forward over one merged q|k|v product."""
    modeling = sys.modules[type(attn).__module__]  # the model's own functions
    config = attn.config
    sizes = [config.num_attention_heads * attn.head_dim,
             config.num_key_value_heads * attn.head_dim,
             config.num_key_value_heads * attn.head_dim]

    def forward(hidden_states: Any, position_embeddings: Any = None, attention_mask: Any = None,
                cache: Any = None, past_key_values: Any = None, **kwargs: Any) -> Any:
        cache = cache if cache is not None else past_key_values
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, attn.head_dim)
        q, k, v = attn.qkv(hidden_states).split(sizes, dim=-1)
        q, k, v = (t.view(hidden_shape).transpose(1, 2) for t in (q, k, v))
        cos, sin = position_embeddings
        q, k = modeling.apply_rotary_pos_emb(q, k, cos, sin)
        if cache is not None:
            k, v = cache.update(k, v, attn.layer_idx, kwargs=kwargs)
        interface = modeling.ALL_ATTENTION_FUNCTIONS.get_interface(
            config._attn_implementation, modeling.eager_attention_forward)
        extra = {"sliding_window": attn.sliding_window} if hasattr(attn, "sliding_window") \
            else {}
        out, weights = interface(attn, q, k, v, attention_mask, dropout=0.0,
                                 scaling=attn.scaling, **extra, **kwargs)
        return attn.o_proj(out.reshape(*input_shape, -1).contiguous()), weights

    return forward


def _merged_mlp(mlp: Any) -> Callable[..., Any]:
    """SwiGLU over one merged gate|up product."""
    def forward(x: Any) -> Any:
        gate, up = mlp.gate_up(x).chunk(2, dim=-1)
        return mlp.down_proj(mlp.act_fn(gate) * up)

    return forward


def build_model(kind: str, hidden: int, layers: int, attn: str = "sdpa") -> Any:
    """A transformers model with random weights (norms and biases perturbed, so that nothing
    is trivially one or zero), returning one tensor; `attn` is transformers' attention
    implementation ("sdpa", its default; "eager"; "graphsub_ideal"). Decoders also take a
    StaticCache and a position: one decode step."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    heads = max(hidden // 64, 1)
    decoders = {"llama": (tf.LlamaModel, tf.LlamaConfig, 2),  # query heads per kv head
                "qwen2": (tf.Qwen2Model, tf.Qwen2Config, 4)}
    if kind in decoders:
        model_class, config_class, group = decoders[kind]
        inner = model_class(config_class(
            vocab_size=1000, hidden_size=hidden, num_hidden_layers=layers,
            num_attention_heads=heads, num_key_value_heads=max(heads // group, 1),
            intermediate_size=int(2.75 * hidden), max_position_embeddings=16384,
            attn_implementation=attn))
    elif kind == "gpt2":
        inner = tf.GPT2Model(tf.GPT2Config(
            vocab_size=1000, n_embd=hidden, n_layer=layers, n_head=heads, n_positions=8192,
            attn_implementation=attn))
    elif kind == "bert":
        inner = tf.BertModel(tf.BertConfig(
            vocab_size=1000, hidden_size=hidden, num_hidden_layers=layers,
            num_attention_heads=heads, intermediate_size=4 * hidden,
            max_position_embeddings=8192, attn_implementation=attn), add_pooling_layer=False)
    elif kind == "vit":
        inner = tf.ViTModel(tf.ViTConfig(
            image_size=224, patch_size=16, hidden_size=hidden, num_hidden_layers=layers,
            num_attention_heads=heads, intermediate_size=4 * hidden,
            attn_implementation=attn), add_pooling_layer=False)
    elif kind == "resnet":
        inner = tf.ResNetModel(tf.ResNetConfig(layer_type="bottleneck", depths=[3, 4, 6, 3],
                                               hidden_sizes=[256, 512, 1024, 2048]))
    elif kind == "convnext":
        inner = tf.ConvNextModel(tf.ConvNextConfig(depths=[3, 3, 9, 3],
                                                   hidden_sizes=[96, 192, 384, 768]))
    else:
        raise SystemExit(f"unknown model {kind!r} (llama, qwen2, gpt2, bert, vit, resnet, "
                         f"convnext)")
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in inner.parameters():
            if p.dim() == 1:
                p.add_(torch.randn(p.shape, generator=gen) * 0.02)

    class Output(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: Any, cache: Any = None, position: Any = None) -> Any:
            if kind in decoders:
                if cache is not None:
                    return self.inner(input_ids=x, past_key_values=cache,
                                      cache_position=position).last_hidden_state
                return self.inner(input_ids=x, use_cache=False).last_hidden_state
            if kind in ("bert", "gpt2"):
                return self.inner(input_ids=x).last_hidden_state
            if kind == "vit":
                return self.inner(pixel_values=x, interpolate_pos_encoding=True).last_hidden_state
            return self.inner(pixel_values=x).pooler_output

    return Output().eval()


def make_input(kind: str, batch: int, seq: int, dtype: Any, device: str) -> Any:
    import torch

    gen = torch.Generator().manual_seed(2)
    if kind in ("llama", "qwen2", "gpt2", "bert"):
        return torch.randint(0, 1000, (batch, seq), generator=gen).to(device)
    side = 224 if kind in ("resnet", "convnext") else 16 * max(1, round(math.sqrt(seq)))
    return torch.randn(batch, 3, side, side, generator=gen).to(device=device, dtype=dtype)


@dataclass(frozen=True)
class Workload:
    """A shape of the grid: a pass over `batch` x `seq` tokens (or images), or one decode step
    over a cache of `seq` positions (`decode`)."""

    batch: int
    seq: int
    decode: bool = False

    @classmethod
    def parse(cls, text: str) -> Workload:
        if text.startswith("decode"):
            return cls(1, int(text.removeprefix("decode")), decode=True)
        batch, seq = (int(v) for v in text.split("x"))
        return cls(batch, seq)

    @property
    def text(self) -> str:
        return f"decode{self.seq}" if self.decode else f"{self.batch}x{self.seq}"

    def caller(self, kind: str, fn: Any, model: Any, dtype: Any, device: str
               ) -> tuple[Callable[[], Any], Callable[[], None] | None]:
        """A call of `fn` (the model or a compilation of it) on this workload, and what puts
        the state a call writes back (None: nothing written). A decode step gets a cache of
        its own, filled by an eager prefill of `seq` tokens."""
        import torch
        import transformers as tf

        if not self.decode:
            x = make_input(kind, self.batch, self.seq, dtype, device)
            return (lambda: fn(x)), None
        cache = tf.StaticCache(config=model.inner.config, max_cache_len=self.seq + DECODE_ROOM)
        prompt = make_input(kind, 1, self.seq, dtype, device)
        with torch.no_grad():
            model(prompt, cache, torch.arange(self.seq, device=device))
        token = make_input(kind, 1, 1, dtype, device)
        position = torch.tensor([self.seq], device=device)

        def reset() -> None:
            for layer in cache.layers:
                layer.cumulative_length.fill_(self.seq)

        return (lambda: fn(token, cache, position)), reset


def time_blocks(fns: dict[str, Callable[[], Any]], rounds: int, device: str,
                resets: dict[str, Callable[[], None] | None] | None = None,
                block_seconds: float = 0.05) -> dict[str, float]:
    """Median seconds per call of each function: blocks of calls in rotating order, the
    state a function writes put back before each block (untimed)."""
    import torch

    cuda = device == "cuda"
    resets = resets or {}
    per_call: dict[str, list[float]] = {name: [] for name in fns}

    def reset(name: str) -> None:
        if resets.get(name) is not None:
            resets[name]()

    with torch.no_grad():
        sizes = {}
        for name, fn in fns.items():  # warm, then size each block to ~block_seconds
            reset(name)
            for _ in range(3):
                fn()
            reset(name)
            t = _elapsed(fn, 3, cuda) / 3
            sizes[name] = max(1, min(200, DECODE_ROOM - 8, int(block_seconds / max(t, 1e-6))))
        names = list(fns)
        for r in range(rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                n = sizes[name]
                reset(name)
                per_call[name].append(_elapsed(fns[name], n, cuda) / n)
    return {name: statistics.median(v) for name, v in per_call.items()}


def _elapsed(fn: Callable[[], Any], n: int, cuda: bool) -> float:
    import torch

    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(n):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return time.perf_counter() - t


def error(out: Any, truth: Any) -> float:
    return float((out.float() - truth.float()).abs().max())


def run_config(kind: str, dtype_name: str, work: Workload, args: argparse.Namespace
               ) -> list[dict[str, Any]]:
    import torch
    import torch._dynamo

    import graphsub.frontends.torch_compile as tc

    dtype = getattr(torch, dtype_name)
    device = args.device
    torch._dynamo.reset()
    attn = "sdpa" if args.attn == "default" else args.attn
    model = build_model(kind, args.hidden, args.layers, attn).to(device=device, dtype=dtype)
    with torch.no_grad():
        wide = build_model(kind, args.hidden, args.layers, attn).to(device=device)
        call, _ = work.caller(kind, wide, wide, torch.float32, device)
        truth = call()
        del wide
        call, reset = work.caller(kind, model, model, dtype, device)
        eager_out = call()
    noise = error(eager_out, truth)
    allowed = 4 * noise + 1e-3 * float(truth.abs().max())
    contenders: dict[str, Callable[[], Any]] = {"eager": call}
    resets: dict[str, Callable[[], None] | None] = {"eager": reset}
    info: dict[str, dict[str, Any]] = {"eager": {"error": noise}}
    ideal_model = merged_model = None
    if args.ideal and kind in ATTENTION_MODELS:
        ideal_model = build_model(kind, args.hidden, args.layers, "graphsub_ideal").to(
            device=device, dtype=dtype)
    if args.ideal and kind in DECODERS:
        merged_model = merged_form(build_model(kind, args.hidden, args.layers,
                                               "graphsub_ideal")).to(device=device, dtype=dtype)
    for mode in [m for m in args.modes if m != "eager"]:
        entries = [(f"inductor {mode}", model, lambda m=mode: torch.compile(model, mode=m))]
        entries.append((f"graphsub {mode}", model, lambda m=mode: torch.compile(
            model, backend="graphsub", options={"mode": m, "time_limit": args.time_limit})))
        if ideal_model is not None:
            entries.append((f"ideal+inductor {mode}", ideal_model,
                            lambda m=mode: torch.compile(ideal_model, mode=m)))
        if merged_model is not None:
            entries.append((f"merged+inductor {mode}", merged_model,
                            lambda m=mode: torch.compile(merged_model, mode=m)))
        for name, owner, make in entries:
            start = time.perf_counter()
            before = len(tc.reports())
            try:
                compiled = make()
                fn, fn_reset = work.caller(kind, compiled, owner, dtype, device)
                with warnings.catch_warnings(record=True) as caught, torch.no_grad():
                    warnings.simplefilter("always")
                    out = fn()
                    if fn_reset is not None:
                        fn_reset()
                    out = fn()  # a second call (CUDA-graph trees replay here)
            except Exception as exc:  # noqa: BLE001 - a contender that fails is a result
                info[name] = {"failed": f"{type(exc).__name__}: {exc}"[:500]}
                traceback.print_exc()
                print(json.dumps({"compiled": name, **info[name]}), flush=True)
                continue
            entry: dict[str, Any] = {"compile_s": round(time.perf_counter() - start, 1),
                                     "error": error(out, truth)}
            entry["correct"] = entry["error"] <= allowed
            reports = tc.reports()[before:]
            if name.startswith("graphsub"):
                entry["chosen"] = [r.chosen or ("fallback: " + r.fallback if r.fallback else "")
                                   for r in reports]
                entry["race"] = [r.race for r in reports]
                entry["dropped"] = [r.dropped for r in reports if r.dropped]
                entry["rules"] = [p.rules_used for r in reports for p in r.parts]
                entry["writes"] = sum(len(r.writes) for r in reports)
                entry["predicted_ms"] = [(round(p.predicted_before * 1e3, 3),
                                          round(p.predicted_after * 1e3, 3))
                                         for r in reports for p in r.parts]
                # where a part's search went nowhere: its seconds, why it was kept, notes
                entry["parts"] = [{"search_s": round(p.search_seconds, 2), "kept": p.kept,
                                   "notes": [n[:160] for n in p.notes]}
                                  for r in reports for p in r.parts]
                entry["warnings"] = sorted({str(w.message)[:200] for w in caught})[:5]
            info[name] = entry
            print(json.dumps({"compiled": name, **entry}, default=str), flush=True)
            contenders[name], resets[name] = fn, fn_reset
    times = time_blocks(contenders, args.rounds, device, resets, args.block_seconds)
    rows = []
    for name, t in times.items():
        mode = name.split(" ")[-1] if name != "eager" else "eager"
        base = times.get(f"inductor {mode}")
        best = min(v for v in (base, times.get(f"ideal+inductor {mode}"),
                               times.get(f"merged+inductor {mode}")) if v is not None) \
            if base else None
        rows.append({"model": kind, "dtype": dtype_name, "shape": work.text,
                     "attn": args.attn, "contender": name, "ms": round(t * 1e3, 4),
                     "vs_eager": round(times["eager"] / t, 3),
                     "vs_inductor_same_mode": round(base / t, 3) if base else None,
                     "vs_best_same_mode": round(best / t, 3) if best else None,
                     **info.get(name, {})})
    return rows


def geometric_means(rows: list[dict[str, Any]]) -> list[list[str]]:
    """Per mode: how many configurations, and the geometric means of graphsub's ratios to
    inductor and to the best of inductor and the hand-written forms (ideal, merged)."""
    out = []
    for mode in MODES[1:]:
        mine = [r for r in rows if r.get("contender") == f"graphsub {mode}"
                and r.get("vs_inductor_same_mode")]
        if not mine:
            continue

        def mean(key: str) -> str:
            return f"{math.exp(statistics.fmean(math.log(r[key]) for r in mine)):.3f}"

        worst = min(mine, key=lambda r: r["vs_inductor_same_mode"])
        out.append([mode, str(len(mine)), mean("vs_inductor_same_mode"),
                    mean("vs_best_same_mode"),
                    f"{worst['vs_inductor_same_mode']} ({worst['model']} {worst['shape']})"])
    return out


def cli_optimize(models: list[str], target: str, out_dir: Path) -> list[dict[str, Any]]:
    """`graphsub optimize MODEL --target T` at the default time limit: what is kept."""
    import subprocess

    rows = []
    for model in models:
        report = out_dir / f"{model}.report.json"
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", "from graphsub.cli import main; main()",
                               "optimize", model, "-o",
                               str(out_dir / f"{model}.onnx"), "--target", target,
                               "--report", str(report)], capture_output=True, text=True)
        row: dict[str, Any] = {"model": model, "target": target, "exit": proc.returncode,
                               "seconds": round(time.perf_counter() - start, 1)}
        if report.exists():
            data = json.loads(report.read_text())
            row.update({k: data.get(k) for k in ("outcome", "speedup", "kept_original", "seconds",
                                                 "rules_used", "verdict")})
        else:
            row["stderr"] = proc.stderr[-500:]
        rows.append(row)
        print(json.dumps(row, default=str), flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="llama,bert")
    p.add_argument("--attn", default="default", choices=["default", "eager"],
                   help="transformers' attention: its default (SDPA) or eager")
    p.add_argument("--dtypes", default="bfloat16")
    p.add_argument("--shapes", default="1x2048")
    p.add_argument("--modes", default="eager,reduce-overhead,max-autotune")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--time-limit", type=float, default=10.0)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--block-seconds", type=float, default=0.05,
                   help="about how long each timed block of calls runs (a model slower than "
                        "this gets one call a block: give more for a steadier median)")
    p.add_argument("--budget", type=float, default=float("inf"),
                   help="seconds after which no new configuration starts")
    p.add_argument("--device", default=None)
    p.add_argument("--no-ideal", dest="ideal", action="store_false",
                   help="leave out the hand-written forms (the ideal attention; the merged "
                        "decoder) under inductor")
    p.add_argument("--cli", default="", help="zoo models for `graphsub optimize --target`")
    p.add_argument("--out", default="out/bench/gpu.json")
    args = p.parse_args()
    import torch

    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    args.modes = args.modes.split(",")
    unknown = set(args.modes) - set(MODES)
    if unknown:
        raise SystemExit(f"unknown modes {sorted(unknown)} (known: {', '.join(MODES)})")
    register_ideal_attention()
    torch._dynamo.config.cache_size_limit = 64
    if hasattr(torch._dynamo.config, "recompile_limit"):
        torch._dynamo.config.recompile_limit = 64
    if args.device == "cuda":
        device_name = torch.cuda.get_device_name()
    else:
        from graphsub.targets.ort import cpu_model

        device_name = f"{cpu_model()}, {torch.get_num_threads()} threads"
    meta = {"date": date.today().isoformat(), "device": device_name,
            "torch": torch.__version__, "command": " ".join(sys.argv)}
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    for kind in args.models.split(","):
        for dtype_name in args.dtypes.split(","):
            for shape in args.shapes.split(","):
                work = Workload.parse(shape)
                if work.decode and kind not in DECODERS:
                    continue
                if time.perf_counter() - started > args.budget:
                    print(f"budget spent: {kind} {dtype_name} {shape} not run", flush=True)
                    continue
                try:
                    new = run_config(kind, dtype_name, work, args)
                except Exception as exc:  # noqa: BLE001 - one configuration, not the run
                    traceback.print_exc()
                    new = [{"model": kind, "dtype": dtype_name, "shape": work.text,
                            "failed": f"{type(exc).__name__}: {exc}"[:500]}]
                rows += new
                for row in new:
                    print(json.dumps(row, default=str), flush=True)
                save_rows(args.out, meta, rows)
    if args.cli and time.perf_counter() - started <= args.budget:
        out_dir = Path(args.out).parent / "cli"
        out_dir.mkdir(parents=True, exist_ok=True)
        rows += cli_optimize(args.cli.split(","), "torch-cuda" if args.device == "cuda"
                             else "torch-cpu", out_dir)
        save_rows(args.out, meta, rows)
    print(f"\n{meta}")
    print(markdown(["model", "dtype", "shape", "contender", "ms", "vs inductor (same mode)",
                    "vs best of inductor, ideal, merged", "vs eager", "correct",
                    "graphsub chose"],
                   [[r["model"], r["dtype"], r["shape"], r.get("contender", "-"),
                     str(r.get("ms", "-")), str(r.get("vs_inductor_same_mode") or "-"),
                     str(r.get("vs_best_same_mode") or "-"),
                     str(r.get("vs_eager", "-")), str(r.get("correct", "-")),
                     ",".join(r.get("chosen", [])) or r.get("failed", "")[:60]]
                    for r in rows if "contender" in r or "failed" in r]))
    print()
    print(markdown(["mode", "configurations", "graphsub / inductor (geometric mean)",
                    "graphsub / best of inductor, ideal, merged", "lowest graphsub / inductor"],
                   geometric_means(rows)))


if __name__ == "__main__":
    main()
