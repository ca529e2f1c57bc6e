"""torch.export programs in, torch.export programs out (issue 60): the signature, the dynamic
sizes' constraints and a static cache's buffer writes kept; merged weights new parameters,
the weights they replace gone; outputs equal at several lengths; a program graphsub cannot
read returned unchanged with one warning; the CLI's .pt2 round trip."""

from __future__ import annotations

import json
import warnings

import pytest

torch = pytest.importorskip("torch", reason="torch is an optional extra (pip install graphsub[torch])")

from typer.testing import CliRunner  # noqa: E402
from torch.export.graph_signature import InputKind, OutputKind  # noqa: E402

from graphsub.cli import app  # noqa: E402
from graphsub.frontends.exported import last_report, optimize_exported  # noqa: E402
from graphsub.frontends.torch_compile import GraphsubWarning  # noqa: E402

runner = CliRunner()


@pytest.fixture(autouse=True)
def fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHSUB_CACHE_DIR", str(tmp_path / "cache"))


class CachedProjections(torch.nn.Module):
    """Three projections of one input (a q|k|v merge to find) and a static cache written at
    the positions given, as a decode step writes its keys."""

    def __init__(self) -> None:
        super().__init__()
        self.q = torch.nn.Linear(32, 32, bias=False)
        self.k = torch.nn.Linear(32, 16, bias=False)
        self.v = torch.nn.Linear(32, 16, bias=False)
        self.register_buffer("cache", torch.zeros(1, 64, 16))

    def forward(self, x, positions):
        q, k, v = self.q(x), self.k(x), self.v(x)
        self.cache.index_copy_(1, positions, k)
        scores = q[..., :16] @ self.cache.transpose(1, 2)
        return torch.relu(scores).sum(-1, keepdim=True) + v


def exported(length: int = 6):
    torch.manual_seed(0)
    model = CachedProjections().eval()
    x, positions = torch.randn(1, length, 32), torch.arange(length)
    seq = torch.export.Dim("seq", min=2, max=64)
    return torch.export.export(model, (x, positions), dynamic_shapes=({1: seq}, {0: seq}))


def mutated(program) -> list[str]:
    return [s.target for s in program.run_decompositions({}).graph_signature.output_specs
            if s.kind == OutputKind.BUFFER_MUTATION]


def run(program, length: int, seed: int):
    """The program's outputs and its cache after one call, on a private copy of its state."""
    module = program.module()
    module.cache = module.cache.clone()
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(1, length, 32, generator=generator)
    with torch.no_grad():
        return module(x, torch.arange(length)), module.cache


def test_signature_constraints_and_writes_kept_and_weights_merged():
    ep = exported()
    with warnings.catch_warnings():
        warnings.simplefilter("error", GraphsubWarning)  # nothing falls back
        fast = optimize_exported(ep, time_limit=5, race=False)
    report = last_report()
    assert fast is not ep and not report.fallback, report
    users = [s for s in fast.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    assert len(users) == 2
    # (both programs in torch.export's training dialect write in place: functionalized,
    # the write is the signature's buffer mutation)
    assert mutated(fast) == mutated(ep) == ["cache"], "the static cache's write is kept"
    # the constraint on the sequence length, as exported
    (bounds,) = fast.range_constraints.values()
    assert (int(bounds.lower), int(bounds.upper)) == (2, 64)
    # weights stay weights: the merged projection is a parameter, the ones it replaced left
    merged = [n for n in fast.state_dict if n.startswith("graphsub.")]
    assert merged and all(isinstance(fast.state_dict[n], torch.nn.Parameter) for n in merged)
    assert "cache" in fast.state_dict
    assert not {"q.weight", "k.weight", "v.weight"} <= set(fast.state_dict)
    sizes = {k: tuple(v.shape) for k, v in fast.state_dict.items()}
    assert sum(t.numel() for t in fast.state_dict.values()) <= \
        sum(t.numel() for t in ep.state_dict.values()), sizes
    for length in (2, 6, 37):  # the example's, the smallest and one it was not checked at
        (want, want_cache), (got, got_cache) = run(ep, length, 1), run(fast, length, 1)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(got_cache, want_cache, rtol=1e-4, atol=1e-4)


def test_a_program_graphsub_cannot_read_is_returned_unchanged_with_why():
    class Counting(torch.nn.Module):
        def forward(self, x):
            return torch.cumsum(x, 0).flip(0)

    ep = torch.export.export(Counting(), (torch.randn(5, 3),))
    with pytest.warns(GraphsubWarning, match="returned unchanged") as caught:
        result = optimize_exported(ep, time_limit=2, race=False)
    assert result is ep
    assert len([w for w in caught if issubclass(w.category, GraphsubWarning)]) == 1
    assert "no operator" in last_report().fallback


def test_cli_refuses_a_file_that_is_no_program(tmp_path):
    bad = tmp_path / "model.pt2"
    bad.write_bytes(b"not a zip")
    out = tmp_path / "fast.pt2"
    result = runner.invoke(app, ["optimize", str(bad), "-o", str(out)])
    assert result.exit_code == 2
    assert "not a program saved by torch.export.save" in result.output
    assert "Traceback" not in result.output and not out.exists()


def test_package_is_for_programs(tmp_path):
    result = runner.invoke(app, ["optimize", "mlp", "-o", str(tmp_path / "x.onnx"), "--package"])
    assert result.exit_code == 2 and "--package is for torch.export programs" in result.output


@pytest.mark.slow
def test_cli_round_trip_pt2_to_pt2_and_package(tmp_path):
    """`graphsub optimize model.pt2 -o fast.pt2`: a program torch.export.load reads, equal
    to the original, the HTML report written; `--package` writes what aoti_load_package
    runs."""
    source = tmp_path / "model.pt2"
    torch.export.save(exported(), str(source))
    out, page = tmp_path / "fast.pt2", tmp_path / "report.html"
    result = runner.invoke(app, ["optimize", str(source), "-o", str(out), "--time-limit", "5",
                                 "--report", str(page), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["written"] == "ExportedProgram" and data["race"], data
    loaded = torch.export.load(str(out))
    (want, want_cache), (got, got_cache) = run(exported(), 9, 2), run(loaded, 9, 2)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got_cache, want_cache, rtol=1e-4, atol=1e-4)
    assert "Race under AOTInductor" in page.read_text()
    assert "masks proven causal" in page.read_text() and data["causal_masks"] == []
    package = tmp_path / "fast_package.pt2"
    result = runner.invoke(app, ["optimize", str(source), "-o", str(package), "--time-limit",
                                 "5", "--package"])
    assert result.exit_code == 0, result.output
    compiled = torch._inductor.aoti_load_package(str(package))
    x = torch.randn(1, 9, 32)
    with torch.no_grad():
        want = exported().module()(x, torch.arange(9))
        torch.testing.assert_close(compiled(x, torch.arange(9)), want, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_a_transformers_decoder_with_a_dynamic_length():
    """A Llama-style decoder as transformers writes it (default attention, grouped key/value
    heads, its mask built from positions), exported with a dynamic sequence length: rewritten
    to the hand-written form (every attention causal, without a mask, its key/value heads
    shared; projections merged), every part spliced, equal to the original at three
    lengths."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=512)
    inner = transformers.LlamaModel(config).eval()

    class Hidden(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, ids):
            return self.inner(input_ids=ids, use_cache=False).last_hidden_state

    seq = torch.export.Dim("seq", min=2, max=512)
    ep = torch.export.export(Hidden(), (torch.randint(0, 512, (1, 32)),),
                             dynamic_shapes=({1: seq},))
    fast = optimize_exported(ep, time_limit=10, race=False)
    report = last_report()
    assert fast is not ep and not report.fallback, report
    assert not any(why.startswith("splice") for why in report.dropped.values()), report.dropped
    used = {name for part in report.parts for name in part.rules_used}
    assert "merge-matmuls-shared-input" in used
    assert {"attention-causal-mask", "attention-shared-key-value-heads"} <= used, used
    assert report.causal_masks, report
    assert any(n.startswith("graphsub.") for n in fast.state_dict)
    # the attention a rewrite replaced is gone, not left computing what nothing reads (torch
    # calls attention impure for its dropout, which is 0 here)
    attention = [n for n in fast.graph.nodes if "scaled_dot_product" in str(n.target)]
    assert attention and all(n.users for n in attention)
    named = [dict(zip(("query", "key", "value", "attn_mask", "dropout_p", "is_causal"),
                      node.args), **node.kwargs) for node in attention]
    assert all(a.get("is_causal") and a.get("attn_mask") is None for a in named), named
    assert all(a.get("enable_gqa") for a in named), named
    # the mask built from positions, which nothing reads now, is gone with its checks
    built = {torch.ops.aten.cumsum.default, torch.ops.aten.diff.default, torch.ops.aten.le.Tensor}
    assert not [n for n in fast.graph.nodes if n.target in built]
    for length in (3, 32, 97):
        ids = torch.randint(0, 512, (1, length))
        with torch.no_grad():
            torch.testing.assert_close(fast.module()(ids), ep.module()(ids), rtol=1e-4,
                                       atol=1e-4)
