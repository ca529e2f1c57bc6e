"""Fuzzing torch.compile(backend="graphsub", dynamic=True) with attention programs whose
masks and position ids are built the way transformers builds them
(tests/frontends/masked_attention_programs.py): each program, compiled once over dynamo's
size symbols, must equal eager at every size, padded rows included, must not run whole in
torch for an error of graphsub's, and must not have a part that graphsub's own check at
other sizes found wrong (a rewrite that is wrong somewhere, caught by the safety net, is a
bug all the same)."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch", reason="torch is an optional extra (pip install graphsub[torch])")

from graphsub.frontends import torch_compile  # noqa: E402
from tests.frontends.masked_attention_programs import MASKS, choices, inputs, program  # noqa: E402

SIZES = [(2, 16), (3, 11), (2, 29)]


def check_program(seed: int, mask: str | None = None) -> None:
    torch._dynamo.reset()  # every program is a new `forward` to dynamo, not a recompile
    model = program(seed, mask)
    c = choices(seed, mask)
    before = len(torch_compile.reports())
    compiled = torch.compile(model, backend="graphsub", dynamic=True,
                             options={"time_limit": 1, "cost": "analytic", "race": False,
                                      "inductor": False})
    gen = torch.Generator().manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch_compile.GraphsubWarning)  # asserted below
        with torch.no_grad():
            for batch, seq in SIZES:
                x, attention_mask = inputs(c, batch, seq, gen)
                where = f"{c.text()} at {batch}x{seq}"
                torch.testing.assert_close(compiled(x, attention_mask), model(x, attention_mask),
                                           rtol=1e-4, atol=1e-4,
                                           msg=lambda m, where=where: f"{where}: {m}")
    reports = torch_compile.reports()[before:]
    assert reports, c.text()
    assert not any(r.fallback for r in reports), (c.text(), [r.fallback for r in reports])
    wrong = [p.kept for r in reports for p in r.parts if p.kept.startswith("verification")]
    assert not wrong, (c.text(), wrong)
    assert any(p.nodes and not p.kept for r in reports for p in r.parts), c.text()


@pytest.mark.parametrize("mask", ["bert_extended", "causal_index", "sdpa_bool"])
def test_masked_attention_programs_equal_eager_at_every_size(mask):
    check_program(0, mask)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(1, 15))
def test_random_masked_attention_programs_equal_eager_at_every_size(seed):
    check_program(seed)


def test_the_fuzzed_programs_cover_every_mask_and_padding_side():
    drawn = [choices(seed) for seed in range(1, 15)]
    assert {c.mask for c in drawn} | {"bert_extended", "causal_index", "sdpa_bool"} == set(MASKS)
    assert {c.left_padding for c in drawn} == {True, False}
    assert {c.kv_groups for c in drawn} == {1, 2}
    assert {c.positions for c in drawn} == {"none", "arange", "cumsum", "table"}
