"""The torch.compile backend in inductor's modes and in half precision, on the CPU (the GPU
figures are bench/bench_gpu.py's): modes accepted and checked, the result usable outside
inference mode, bfloat16 and float16 models optimized rather than left as they were, their
outputs judged against the model computed in float32."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from graphsub.errors import GraphsubError  # noqa: E402
from graphsub.frontends import torch_compile as tc  # noqa: E402
from graphsub.frontends.cuda_graphs import CudaGraphed  # noqa: E402
from graphsub.frontends.fx_equivalence import compared, widened  # noqa: E402
from graphsub.frontends.fx_fold import fold_constants  # noqa: E402


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    """A cache of its own, and dynamo's memory of earlier compilations in this process
    forgotten: a LlamaModel compiled at other sizes by another test would make dynamo capture
    this one with a size symbol (automatic dynamic shapes), and its causal mask with it."""
    monkeypatch.setenv("GRAPHSUB_CACHE_DIR", str(tmp_path / "cache"))
    torch._dynamo.reset()


def decoder(dtype):
    torch.manual_seed(0)
    model = transformers.LlamaModel(transformers.LlamaConfig(
        vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, attn_implementation="eager"))
    return model.eval().to(dtype)


def test_modes_are_inductors_and_imply_it():
    for mode in tc.INDUCTOR_MODES:
        opts = tc.BackendOptions.parse({"mode": mode})
        assert opts.inductor and opts.mode == mode
        assert opts.cuda_graphs == (mode in ("reduce-overhead", "max-autotune"))
        assert tc.BackendOptions.parse(None, mode) == opts  # torch.compile(..., mode=mode)
    with pytest.raises(GraphsubError, match="reduce-overhead"):
        tc.BackendOptions.parse({"mode": "fastest"})
    with pytest.raises(GraphsubError, match="inductor=False"):
        tc.BackendOptions.parse({"inductor": False}, "reduce-overhead")


def test_by_default_the_graph_goes_to_inductor_priced_as_inductor_compiles_it():
    assert tc.BackendOptions.parse({}).inductor
    assert tc.BackendOptions.parse({}).cost_model == "compiled"
    assert tc.BackendOptions.parse({"inductor": False}).cost_model == "measured"
    for options in ({"inductor": True}, {"mode": "default"}):
        assert tc.BackendOptions.parse(options).cost_model == "compiled"
    assert tc.BackendOptions.parse({"mode": "default", "cost": "measured"}).cost_model == \
        "measured"
    with pytest.raises(GraphsubError, match="unknown cost model"):
        tc.BackendOptions.parse({"cost": "fastest"})


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(32, 64), torch.nn.Linear(64, 32)

    def forward(self, x):
        return self.b(torch.relu(self.a(x))) * 2


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_the_mode_as_torch_compile_users_write_it_is_inductors(mode):
    """`torch.compile(model, backend="graphsub", mode=M)` compiles and races in inductor's
    mode M, as `options={"mode": M}` does; with no mode, in inductor's default mode: a
    user who swaps backend="inductor" for backend="graphsub" keeps inductor's fusions."""
    model = Mlp().eval()
    x = torch.randn(8, 32)
    compiled = torch.compile(model, backend="graphsub", mode=mode,
                             **({} if mode else {"options": {"time_limit": 1,
                                                             "cost": "analytic"}}))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", tc.GraphsubWarning)
        torch.testing.assert_close(compiled(x), model(x))
    report = tc.reports()[-1]
    assert report.mode == (mode or "default") and not report.fallback
    assert report.chosen in ("inductor", "graphsub+inductor", "graphsub", "normal form",
                             "normal form+inductor")
    assert "graphsub+inductor" in report.race  # raced against inductor alone


def test_where_inductor_cannot_compile_graphsub_races_eager_saying_why(monkeypatch):
    def no_compiler(*args, **kwargs):
        raise RuntimeError("no C++ compiler found")

    monkeypatch.setattr(tc, "_inductor", no_compiler)
    model = Mlp().eval()
    x = torch.randn(8, 32)
    compiled = torch.compile(model, backend="graphsub", options={"time_limit": 1,
                                                                 "cost": "analytic"})
    with torch.no_grad(), pytest.warns(tc.GraphsubWarning, match="no C\\+\\+ compiler"):
        torch.testing.assert_close(compiled(x), model(x))
    report = tc.reports()[-1]
    assert "no C++ compiler" in report.dropped["inductor"] and report.mode == ""
    assert report.chosen in ("eager", "graphsub", "normal form") and not report.fallback


@pytest.mark.slow
def test_a_decoder_handed_to_inductor_is_searched_under_the_compiled_cost():
    """The default for a graph inductor compiles: kernels priced as inductor builds them
    (graphsub.cost.compiled), the result correct and reported."""
    model = decoder(torch.float32)
    ids = torch.randint(0, 100, (1, 48))
    before = len(tc.reports())
    compiled = torch.compile(model, backend="graphsub", options={"inductor": True,
                                                                 "time_limit": 4})
    with torch.no_grad():
        want = model(ids, use_cache=False).last_hidden_state
        with warnings.catch_warnings():
            warnings.simplefilter("error", tc.GraphsubWarning)
            got = compiled(ids, use_cache=False).last_hidden_state
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    report = tc.reports()[before]
    assert report.cost == "compiled" and not report.fallback
    assert all(p.predicted_before > 0 for p in report.parts)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_decoder_in_a_mode_is_optimized_and_works_outside_inference_mode(dtype):
    """inductor's reduce-overhead mode (its CUDA graphs are the GPU's; on the CPU the mode's
    compilation is inductor's): the decoder's attention is fused, nothing falls back for
    its precision, and the result, called under no_grad only, returns ordinary tensors."""
    model = decoder(dtype)
    ids = torch.randint(0, 100, (1, 48))
    before = len(tc.reports())
    # the analytic cost: what is fused must not depend on how busy this machine is
    compiled = torch.compile(model, backend="graphsub",
                             options={"mode": "reduce-overhead", "time_limit": 4,
                                      "cost": "analytic"})
    with torch.no_grad():
        want = model(ids, use_cache=False).last_hidden_state
        with warnings.catch_warnings():
            warnings.simplefilter("error", tc.GraphsubWarning)
            got = compiled(ids, use_cache=False).last_hidden_state
        again = compiled(ids, use_cache=False).last_hidden_state
    assert not got.is_inference() and got.dtype == dtype
    wide = decoder(torch.float32)(ids, use_cache=False).last_hidden_state.detach()
    own = (want.float() - wide).abs().max()
    assert (got.float() - wide).abs().max() <= 4 * own + 1e-3 * wide.abs().max()
    torch.testing.assert_close(again, got)
    report = tc.reports()[before]
    assert not report.fallback
    rules = {r for p in report.parts for r in p.rules_used}
    assert {"attention-masked-scaled-scores", "attention-causal-mask",
            "attention-shared-key-value-heads"} <= rules
    assert report.chosen in ("inductor", "graphsub+inductor", "graphsub",
                             "normal form+inductor", "normal form")


def test_half_precision_is_judged_against_float32():
    """An output as far from the float32 computation as the original's own rounding passes;
    one further off fails, with both distances in the message."""
    class Sum(torch.nn.Module):
        def forward(self, x):
            return (x * 3.0).sum(-1)

    gm = torch.fx.symbolic_trace(Sum())
    x = torch.randn(4, 256, dtype=torch.bfloat16)
    assert widened(gm)(x.float()).dtype == torch.float32
    exact = (x.float() * 3.0).sum(-1)
    assert compared(gm, lambda x: exact.to(torch.bfloat16), [x], 1e-3) is None
    problem = compared(gm, lambda x: (exact * 1.05).to(torch.bfloat16), [x], 1e-3)
    assert problem is not None and "float32 computation" in problem


def test_constants_fold_and_random_draws_do_not():
    class Masked(torch.nn.Module):
        def forward(self, x):
            n = x.shape[-1]
            keep = torch.arange(n)[None, :] <= torch.arange(n)[:, None]
            mask = torch.where(keep, 0.0, torch.finfo(torch.float32).min)
            noise = torch.rand(n)
            return x + mask + noise * 0

    from torch.fx.experimental.proxy_tensor import make_fx

    x = torch.randn(6, 6)
    gm = make_fx(Masked())(x)
    assert fold_constants(gm, {}) >= 1
    targets = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    assert "aten.arange.default" not in targets and "aten.where.self" not in targets
    assert any("rand" in t for t in targets)  # a random draw is never a constant
    torch.testing.assert_close(gm(x), Masked()(x))


def test_cuda_graphed_runs_a_cpu_module_as_it_is():
    calls = []

    def fn(x):
        calls.append(x)
        return x + 1

    wrapped = CudaGraphed(fn)
    assert torch.equal(wrapped(torch.zeros(3)), torch.ones(3)) and len(calls) == 1
