"""torch.compile(dynamic=True) on transformers' encoders and decoders as users call them
(issue 51): with and without an attention mask, at batch 1 (which dynamo specializes) and 2.
A part that slices a constant table by a size no tensor input carries reads the size from
its SymInt argument (fx_import's size carriers); a part whose optimization fails anywhere
stays in torch alone, and the graph's other parts are still optimized."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch", reason="torch is an optional extra (pip install graphsub[torch])")
transformers = pytest.importorskip("transformers")

from graphsub.frontends import torch_compile  # noqa: E402

QUICK = {"time_limit": 1, "cost": "analytic", "race": False, "inductor": False}


@pytest.fixture(autouse=True)
def fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHSUB_CACHE_DIR", str(tmp_path / "cache"))
    torch._dynamo.reset()


def encoder_or_decoder(kind: str, attn: str = "sdpa"):
    torch.manual_seed(0)
    common = dict(vocab_size=100, hidden_size=64, num_attention_heads=4,
                  attn_implementation=attn)
    if kind == "bert":
        return transformers.BertModel(transformers.BertConfig(
            num_hidden_layers=1, intermediate_size=128, **common), add_pooling_layer=False)
    if kind == "distilbert":
        return transformers.DistilBertModel(transformers.DistilBertConfig(
            vocab_size=100, dim=64, n_layers=1, n_heads=4, hidden_dim=128,
            attn_implementation=attn))
    return transformers.LlamaModel(transformers.LlamaConfig(
        num_hidden_layers=1, intermediate_size=128, num_key_value_heads=2, **common))


def check(kind: str, batch: int, masked: bool, attn: str = "sdpa") -> list:
    model = encoder_or_decoder(kind, attn).eval()
    extra = {"use_cache": False} if kind == "llama" else {}
    before = len(torch_compile.reports())
    compiled = torch.compile(model, backend="graphsub", dynamic=True, options=QUICK)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", torch_compile.GraphsubWarning)
        for seq in (9, 16):
            ids = torch.randint(0, 100, (batch, seq), generator=gen)
            kwargs = dict(extra)
            if masked:
                mask = torch.ones(batch, seq, dtype=torch.long)
                mask[-1, :3] = 0
                kwargs["attention_mask"] = mask
            torch.testing.assert_close(compiled(ids, **kwargs).last_hidden_state,
                                       model(ids, **kwargs).last_hidden_state,
                                       rtol=1e-4, atol=1e-4)
    reports = torch_compile.reports()[before:]
    assert reports and not any(r.fallback for r in reports), [r.fallback for r in reports]
    assert all(not p.kept for r in reports for p in r.parts), \
        [(p.nodes, p.kept) for r in reports for p in r.parts]
    return reports


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_bert_called_with_input_ids_alone_at_batch_one_is_optimized_part_by_part(attn):
    """The position ids are a slice of a constant table by the sequence length, which only
    a SymInt argument carries: the part reads it from there (it fell back whole before)."""
    check("bert", 1, False, attn)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["bert", "distilbert", "llama"])
@pytest.mark.parametrize("batch,masked", [(1, False), (1, True), (2, False), (2, True)])
def test_encoders_and_decoders_with_dynamic_sizes_are_optimized_part_by_part(kind, batch,
                                                                             masked):
    check(kind, batch, masked)


def test_a_part_that_fails_stays_in_torch_alone(monkeypatch):
    """The first part's program cannot be built: that part stays as captured, with the reason
    in its report; the others are optimized and the graph is right."""
    from graphsub.targets.torch.target import TorchTarget

    built = TorchTarget.program
    calls = []

    def fails_first(self, graph, *args, **kwargs):
        calls.append(graph)
        if len(calls) == 1:
            raise RuntimeError("a lowering that fails")
        return built(self, graph, *args, **kwargs)

    monkeypatch.setattr(TorchTarget, "program", fails_first)
    model = encoder_or_decoder("bert").eval()
    compiled = torch.compile(model, backend="graphsub", dynamic=True, options=QUICK)
    ids = torch.randint(0, 100, (2, 12))
    with torch.no_grad(), pytest.warns(torch_compile.GraphsubWarning, match="a lowering"):
        torch.testing.assert_close(compiled(ids).last_hidden_state,
                                   model(ids).last_hidden_state, rtol=1e-4, atol=1e-4)
    report = torch_compile.reports()[-1]
    assert not report.fallback
    kept = [p.kept for p in report.parts if p.kept]
    assert len(kept) == 1 and "a lowering that fails" in kept[0]
    assert any(p.nodes and not p.kept for p in report.parts)


def test_graphsubs_own_kernel_compilations_leave_dynamos_shape_environment_alone():
    """A group of primitives compiled by inductor for graphsub's cost model or program, while
    the torch.compile backend runs: inductor made its fake tensors in dynamo's shape
    environment and left guards over symbols of its own there, on which dynamo failed when
    it built the graph's guards (an IndexError ending the user's call on the recompile after
    a size changed)."""
    import numpy as np

    from graphsub.targets.torch.lowering import LowerContext
    from graphsub.tensors.types import TensorType
    from torch._guards import TracingContext

    seen = []

    def backend(gm, example_inputs):
        env = TracingContext.get().fake_mode.shape_env
        before = list(env.guards)
        ctx = LowerContext(torch.device("cpu"))
        kernel = ctx.generated(lambda x: (torch.relu(x).reshape(8, -1).sum(0) * 2,),
                               (TensorType((4, 8)),), (TensorType((4,)),))
        out = kernel(torch.ones(4, 8))[0]
        seen.append((env.guards == before, float(out.sum())))
        return gm.forward

    fn = torch.compile(lambda x: x + 1, backend=backend)
    with torch.no_grad():
        fn(torch.randn(3))
        fn(torch.randn(5))  # the recompile with a dynamic size
    assert seen and all(unchanged for unchanged, _ in seen)
    assert all(np.isclose(total, 64.0) for _, total in seen)


@pytest.mark.slow
def test_a_recompile_after_a_size_changed_runs_with_graphsubs_defaults():
    """transformers' BERT compiled with no options (inductor, the compiled cost model), called
    at batch 1 and then 16: the second call recompiles over a batch symbol and must run."""
    model = encoder_or_decoder("bert").eval()
    compiled = torch.compile(model, backend="graphsub", options={"time_limit": 4})
    before = len(torch_compile.reports())
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", torch_compile.GraphsubWarning)
        for batch in (1, 16):
            ids = torch.randint(0, 100, (batch, 32))
            torch.testing.assert_close(compiled(ids).last_hidden_state,
                                       model(ids).last_hidden_state, rtol=1e-4, atol=1e-4)
    reports = torch_compile.reports()[before:]
    assert len(reports) == 2 and reports[1].sizes and not any(r.fallback for r in reports)
