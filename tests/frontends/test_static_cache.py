"""transformers' decode step over a StaticCache, compiled with graphsub as transformers teaches
compiled generation (issue 49): the cache is filled by a prefill, then each step writes its
keys and values at the next position (`index_copy_`) and advances the layer's counter
(`cumulative_length.add_`). Step by step, over 16 steps, the compiled model must equal eager
in its output and in every cache tensor, under `no_grad` and `inference_mode`, with and
without a padding mask, for Llama and Qwen2 in their default (SDPA) attention."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch", reason="torch is an optional extra (pip install graphsub[torch])")
transformers = pytest.importorskip("transformers")

from graphsub.frontends import torch_compile  # noqa: E402

PREFILL = 12
CACHE = 32
STEPS = 16
CUDA = torch.cuda.is_available()


@pytest.fixture(autouse=True)
def fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHSUB_CACHE_DIR", str(tmp_path / "cache"))
    torch._dynamo.reset()


def decoder(family: str, device: str = "cpu"):
    torch.manual_seed(0)
    config_class, model_class = {"llama": (transformers.LlamaConfig, transformers.LlamaModel),
                                 "qwen2": (transformers.Qwen2Config, transformers.Qwen2Model)
                                 }[family]
    config = config_class(vocab_size=100, hidden_size=64, intermediate_size=128,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          max_position_embeddings=64)
    return model_class(config).eval().to(device), config


def cache_tensors(cache) -> dict[str, torch.Tensor]:
    out = {}
    for k, layer in enumerate(cache.layers):
        out[f"layer {k} keys"] = layer.keys
        out[f"layer {k} values"] = layer.values
        out[f"layer {k} length"] = layer.cumulative_length
    return out


def decode_loop(family: str, padding: bool, grad_mode, options, device: str = "cpu") -> list:
    """Prefill two equal caches eagerly, then decode STEPS tokens eagerly on one and through
    the compiled model on the other, comparing after every step; returns the reports."""
    model, config = decoder(family, device)
    batch = 2 if padding else 1
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 100, (batch, PREFILL), generator=gen).to(device)
    mask = torch.ones(batch, CACHE, dtype=torch.long, device=device)
    if padding:
        mask[1, :4] = 0  # the second row left-padded by four tokens
    caches = []
    for _ in range(2):
        cache = transformers.StaticCache(config=config, max_cache_len=CACHE)
        with grad_mode():
            model(ids, attention_mask=mask[:, :PREFILL] if padding else None,
                  past_key_values=cache, cache_position=torch.arange(PREFILL, device=device))
        caches.append(cache)
    eager_cache, compiled_cache = caches
    before = len(torch_compile.reports())
    compiled = torch.compile(model, backend="graphsub", options=options)
    tokens = torch.randint(0, 100, (batch, STEPS), generator=gen).to(device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch_compile.GraphsubWarning)  # reports asserted below
        for step in range(STEPS):
            position = torch.tensor([PREFILL + step], device=device)
            kwargs = {"cache_position": position, "attention_mask": mask if padding else None}
            with grad_mode():
                want = model(tokens[:, step:step + 1], past_key_values=eager_cache,
                             **kwargs).last_hidden_state
                got = compiled(tokens[:, step:step + 1], past_key_values=compiled_cache,
                               **kwargs).last_hidden_state
            where = f"{family} padding={padding} step {step}"
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4,
                                       msg=lambda m, where=where: f"{where}: output: {m}")
            mine = cache_tensors(compiled_cache)
            for name, value in cache_tensors(eager_cache).items():
                torch.testing.assert_close(mine[name], value, rtol=1e-4, atol=1e-5,
                                           msg=lambda m, w=where, n=name: f"{w}: {n}: {m}")
    reports = torch_compile.reports()[before:]
    assert reports and not any(r.fallback for r in reports), [r.fallback for r in reports]
    assert all(len(r.writes) == 3 * config.num_hidden_layers for r in reports)
    assert any(p.nodes and not p.kept for r in reports for p in r.parts)
    return reports


QUICK = {"time_limit": 2, "cost": "analytic", "inductor": False}


def test_llama_decodes_over_a_static_cache_as_eager_does():
    decode_loop("llama", padding=False, grad_mode=torch.no_grad, options=QUICK)


@pytest.mark.slow
def test_qwen2_decodes_a_left_padded_batch_in_inference_mode_as_eager_does():
    decode_loop("qwen2", padding=True, grad_mode=torch.inference_mode, options=QUICK)


@pytest.mark.slow
@pytest.mark.parametrize("family,padding,grad_mode", [
    ("llama", True, torch.inference_mode), ("qwen2", False, torch.no_grad)])
def test_a_decoder_compiled_with_no_options_decodes_as_eager_does(family, padding, grad_mode):
    """As a user writes it: `torch.compile(model, backend="graphsub")`: the default time
    limit, the graph handed on to inductor and raced against inductor alone, every contender
    compiled and run on private copies of the cache."""
    reports = decode_loop(family, padding, grad_mode, options=None)
    assert all(r.mode == "default" and "graphsub+inductor" in r.race for r in reports)


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device (inductor's CUDA graphs)")
@pytest.mark.parametrize("grad_mode", [torch.no_grad, torch.inference_mode])
def test_a_decoder_in_reduce_overhead_mode_decodes_as_eager_does_on_the_gpu(grad_mode):
    decode_loop("llama", padding=True, grad_mode=grad_mode,
                options={"mode": "reduce-overhead", "time_limit": 4}, device="cuda")


def greedy(model, ids, mask, **kwargs):
    return model.generate(ids, attention_mask=mask, max_new_tokens=STEPS, do_sample=False,
                          cache_implementation="static", pad_token_id=0, **kwargs)


def causal_lm():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # logits with clear margins: no near-tie decides a token
        model.lm_head.weight.mul_(10)
    return model


@pytest.mark.parametrize("options", [
    pytest.param({"mode": None, "options": {**QUICK, "time_limit": 2}}, id="own-program"),
    pytest.param({}, id="as-transformers-configures-it", marks=pytest.mark.slow)])
def test_greedy_generation_with_a_static_cache_gives_eagers_tokens(options):
    """transformers' generate() compiles the decode step itself when the cache is static
    (`CompileConfig`: by default `mode="reduce-overhead"`; on the CPU only when asked); with
    graphsub as the backend it must give the tokens eager generation gives."""
    model = causal_lm()
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(1, 100, (2, PREFILL), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding
    want = greedy(model, ids, mask, disable_compile=True)
    config = transformers.CompileConfig(backend="graphsub", **options)
    config._compile_all_devices = True  # transformers compiles on GPUs unless told
    before = len(torch_compile.reports())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch_compile.GraphsubWarning)
        got = greedy(model, ids, mask, compile_config=config)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    reports = torch_compile.reports()[before:]
    assert reports and all(r.writes and not r.fallback for r in reports)
