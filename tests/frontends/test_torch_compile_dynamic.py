"""torch.compile(model, backend="graphsub") with dynamic sizes (`dynamic=True`, and the
automatic dynamic shapes of the recompile after a size changed): one graphsub compilation
over dynamo's size symbols serves every size, equals eager at each, and is checked at sizes
other than the example's before it is used."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch", reason="torch is an optional extra (pip install graphsub[torch])")

from graphsub.frontends import torch_compile  # noqa: E402
from tests.frontends.test_torch_compile import (REWRITES_THAT_CHANGE_LAYOUT,  # noqa: E402,F401
                                                TransformerBlock, force_rewrites, fresh,
                                                keep_attention_in_torch, layouts_changed)


def new_reports(before: int) -> list:
    return torch_compile.reports()[before:]


def text_inputs(batch: int, seq: int, gen: torch.Generator):
    ids = torch.randint(0, 1000, (batch, seq), generator=gen)
    mask = torch.ones(batch, seq, dtype=torch.int64)
    mask[0, seq // 2:] = 0  # padding in the first sequence
    return ids, mask


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["bert", "llama"])
def test_one_compilation_serves_three_sequence_lengths(kind):
    from tests.dynamic_models import text_module

    model = text_module(kind)
    before = len(torch_compile.reports())
    compiled = torch.compile(model, backend="graphsub", dynamic=True,
                             options={"time_limit": 3, "race": False, "inductor": False})
    gen = torch.Generator().manual_seed(1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", torch_compile.GraphsubWarning)
        with torch.no_grad():
            for batch, seq in [(2, 24), (2, 41), (3, 9)]:
                ids, mask = text_inputs(batch, seq, gen)
                torch.testing.assert_close(compiled(ids, mask), model(ids, mask),
                                           rtol=1e-4, atol=1e-4)
    reports = new_reports(before)
    assert len(reports) == 1, "one compilation for every size"
    report = reports[0]
    assert not report.fallback
    assert len(report.sizes["symbols"]) == 2  # batch and sequence
    assert len(report.sizes["checked_at"]) >= 2
    replaced = [p for p in report.parts if not p.kept]
    assert replaced and any(p.rules_used for p in replaced), [(p.nodes, p.rules_used, p.kept)
                                                             for p in report.parts]


def test_automatic_dynamic_sizes_compile_once_more_with_symbols():
    model = TransformerBlock().eval()
    before = len(torch_compile.reports())
    compiled = torch.compile(model, backend="graphsub",
                             options={"time_limit": 1, "race": False, "cost": "analytic",
                                      "inductor": False})
    with torch.no_grad():
        for seq in (8, 12, 20, 7):
            x = torch.randn(2, seq, 64)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    reports = new_reports(before)
    # The first size compiles statically; the second makes the sequence dynamic and is
    # compiled once for all the sizes after it.
    assert len(reports) == 2
    assert not reports[0].sizes and not reports[0].fallback
    assert list(reports[1].sizes["example"].values()) == [12]
    assert not reports[1].fallback and any(not p.kept for p in reports[1].parts)


def test_rewritten_layouts_are_restored_at_every_size(monkeypatch):
    # With dynamic sizes the original's output strides are expressions over the symbols:
    # merged projections and transposed products must be re-laid out at each size.
    keep_attention_in_torch(monkeypatch)
    applied = force_rewrites(monkeypatch, REWRITES_THAT_CHANGE_LAYOUT)
    model = TransformerBlock().eval()
    compiled = torch.compile(model, backend="graphsub", dynamic=True,
                             options={"time_limit": 1, "algorithm": "forced",
                                      "cost": "analytic", "race": False, "inductor": False})
    with warnings.catch_warnings():
        warnings.simplefilter("error", torch_compile.GraphsubWarning)
        with torch.no_grad():
            for batch, seq in [(2, 16), (3, 5), (2, 33)]:
                x = torch.randn(batch, seq, 64)
                torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    assert layouts_changed(applied)
    assert all(not p.kept for p in torch_compile.reports()[-1].parts)


def test_parts_checked_at_other_sizes_catch_a_size_specific_error(monkeypatch):
    # A part that is right at the example's size and wrong at others must be kept as it
    # was: the check runs the optimized graph at sizes other than the example's.
    real_splice = torch_compile.splice

    def wrong_elsewhere(*args, **kwargs):
        spliced = real_splice(*args, **kwargs)
        inner, first = spliced.module, []

        class Off(torch.nn.Module):
            def forward(self, *xs):
                shapes = [tuple(x.shape) for x in xs if isinstance(x, torch.Tensor)]
                first.append(shapes) if not first else None
                outs = inner(*xs)
                return outs if shapes == first[0] else tuple(o + 1 for o in outs)

        spliced.module = Off()
        return spliced

    monkeypatch.setattr(torch_compile, "splice", wrong_elsewhere)
    model = TransformerBlock().eval()
    compiled = torch.compile(model, backend="graphsub", dynamic=True,
                             options={"time_limit": 1, "cost": "analytic", "race": False,
                                      "inductor": False})
    with pytest.warns(torch_compile.GraphsubWarning, match="kept a part"):
        with torch.no_grad():
            x = torch.randn(2, 16, 64)
            want, got = model(x), compiled(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert all(p.kept.startswith("end-to-end verification")
               for p in torch_compile.reports()[-1].parts if p.nodes)


def test_in_place_writes_with_dynamic_sizes_run_unoptimized_with_a_reason():
    class Writes(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(16, 16)

        def forward(self, x):
            y = self.lin(x)
            y[:, 0] = 0.0
            return torch.relu(y)

    model = Writes().eval()
    compiled = torch.compile(model, backend="graphsub", dynamic=True,
                             options={"time_limit": 1, "inductor": False})
    with pytest.warns(torch_compile.GraphsubWarning, match="in place"):
        with torch.no_grad():
            x = torch.randn(5, 16)
            torch.testing.assert_close(compiled(x), model(x))
    with torch.no_grad():
        x = torch.randn(9, 16)
        torch.testing.assert_close(compiled(x), model(x))


@pytest.mark.slow
def test_with_inductor_the_optimized_graph_is_compiled_once_over_the_symbols():
    # graphsub's parts are one program for every size, so inductor traces the optimized
    # graph with dynamo's symbols: one compilation, right at every size.
    model = TransformerBlock().eval()
    before = len(torch_compile.reports())
    compiled = torch.compile(model, backend="graphsub", dynamic=True,
                             options={"time_limit": 1, "cost": "analytic", "inductor": True})
    with torch.no_grad():
        for batch, seq in [(2, 16), (3, 5), (2, 33)]:
            x = torch.randn(batch, seq, 64)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    reports = new_reports(before)
    assert len(reports) == 1 and not reports[0].fallback
    assert "graphsub+inductor" in reports[0].race  # composed, then raced against inductor


@pytest.mark.slow
def test_transformers_bert_with_dynamic_sizes_is_optimized_not_left_whole():
    """transformers' own BertModel (eager attention, its padding mask built the way it builds
    it) under dynamic=True once ran unoptimized ("argument of type: Symbol"): a captured part
    computed from constants alone (the position ids sliced to the sequence length) has a size
    symbol no input of it carries, and its program could not read it. Such a part stays in
    torch with that reason; the others are optimized, and the model equals eager at every
    size."""
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=128, vocab_size=1000,
                                     max_position_embeddings=128)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.BertModel(config).eval()
    before = len(torch_compile.reports())
    compiled = torch.compile(model, backend="graphsub", dynamic=True,
                             options={"time_limit": 3, "race": False, "inductor": False})
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for batch, seq in [(2, 16), (2, 37), (3, 9)]:
            ids, mask = text_inputs(batch, seq, gen)
            torch.testing.assert_close(compiled(ids, attention_mask=mask).last_hidden_state,
                                       model(ids, attention_mask=mask).last_hidden_state,
                                       rtol=1e-4, atol=1e-4)
    reports = new_reports(before)
    assert reports and not any(r.fallback for r in reports), [r.fallback for r in reports]
    parts = [p for r in reports for p in r.parts]
    assert any(not p.kept and p.rules_used for p in parts), [(p.nodes, p.kept) for p in parts]
    kept = [p.kept for p in parts if p.kept]
    assert all("not a dimension of any input" in k for k in kept), kept
