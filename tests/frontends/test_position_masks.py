"""Masks built from positions at a symbolic length (frontends.fx_position_masks): proven
causal by z3 where they are, at every size in the symbols' ranges, and nothing proven where
they are not (a strict mask, one shifted by one, a sliding window, one causal only at some
lengths); the proven ones read as graphsub's `causal_mask`, which the library's
`attention-causal-mask` turns into the attention's causal flag."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is an optional extra (pip install graphsub[torch])")

from graphsub.frontends.fx_import import symbol_ranges  # noqa: E402
from graphsub.frontends.fx_position_masks import causal_masks  # noqa: E402
from graphsub.ir.binding import bind_graph  # noqa: E402
from graphsub.ir.builder import GraphBuilder  # noqa: E402
from graphsub.ops import get_op  # noqa: E402
from graphsub.rules import builtin_rules  # noqa: E402
from graphsub.rules.check import RuleCheckError, check_rule  # noqa: E402
from graphsub.rules.parser import parse_rules  # noqa: E402
from graphsub.runtime.reference import evaluate  # noqa: E402
from graphsub.search.normal_form import first_normal_form  # noqa: E402
from graphsub.tensors.symbolic import size_symbol  # noqa: E402


class Masked(torch.nn.Module):
    """Attention over x with a mask `build(n)` makes from the length alone."""

    def __init__(self, build) -> None:
        super().__init__()
        self.build = build

    def forward(self, x):
        mask = self.build(x.shape[2], x.device)
        return torch.nn.functional.scaled_dot_product_attention(x, x, x, attn_mask=mask)


def positions(n, device):
    return torch.arange(n, device=device)


def lower_triangle(n, device):
    p = positions(n, device)
    return (p[None, :] <= p[:, None])[None, None]


def as_transformers_writes_it(n, device):
    """transformers' sdpa mask at a symbolic length: a check for packed sequences (diff,
    cumsum), each query's and key's position picked by index with aranges, le, and."""
    p = positions(n, device)[None]
    jumps = torch.diff(p, dim=-1, prepend=p[:, :1] - 1) != 1
    sequence = jumps.cumsum(-1)
    batch = torch.arange(1, device=device)[:, None, None, None]
    q = torch.arange(n, device=device)[None, None, :, None]
    k = torch.arange(n, device=device)[None, None, None, :]
    keep = p[batch, k] <= p[batch, q]
    same = sequence[batch, q] == sequence[batch, k]
    return (keep.new_ones(()) & keep & same).expand(1, -1, n, n)


def additive(n, device):
    keep = lower_triangle(n, device)
    return torch.where(keep, 0.0, torch.finfo(torch.float32).min)


def strict(n, device):
    p = positions(n, device)
    return (p[None, :] < p[:, None])[None, None]


def shifted(n, device):
    p = positions(n, device)
    return (p[None, :] <= p[:, None] + 1)[None, None]


def sliding_window(n, device):
    p = positions(n, device)
    return ((p[None, :] <= p[:, None]) & (p[:, None] - p[None, :] < 8))[None, None]


def traced(build, high: int = 64):
    """The function's graph at the ATen level, its length symbolic in 2..high."""
    model = Masked(build)
    seq = torch.export.Dim("seq", min=2, max=high)
    program = torch.export.export(model, (torch.randn(1, 2, 12, 8),),
                                  dynamic_shapes=({2: seq},))
    return program.run_decompositions({}).graph_module.graph


def proven(build, high: int = 64):
    """What is proven of the mask the attention reads (None: nothing)."""
    graph = traced(build, high)
    (attention,) = [n for n in graph.nodes if "attention" in str(n.target)]
    return causal_masks(graph, symbol_ranges(graph)).get(attention.args[3])


@pytest.mark.parametrize("build", [lower_triangle, as_transformers_writes_it])
def test_a_boolean_causal_mask_is_proven(build):
    mask = proven(build)
    assert mask is not None and mask.dtype == "bool"
    assert len(mask.shape) == 4 and not isinstance(mask.shape[-1], int)  # symbolic


def test_an_additive_causal_mask_is_proven_with_its_fill():
    mask = proven(additive)
    assert mask is not None and mask.dtype == "float32"
    assert mask.fill == float(torch.finfo(torch.float32).min)


@pytest.mark.parametrize("build", [strict, shifted, sliding_window])
def test_a_mask_that_is_not_causal_is_not_proven(build):
    assert proven(build) is None


def test_a_mask_causal_only_at_some_lengths_is_proven_only_within_them():
    """Causal up to 40 positions, everything visible beyond: proven where the length's range
    stops at 40, not where it reaches 64."""
    def causal_below_41(n, device):
        p = positions(n, device)
        return ((p[None, :] <= p[:, None]) | (p[:, None] >= 40))[None, None]

    assert proven(causal_below_41, high=64) is None
    assert proven(causal_below_41, high=40) is not None


def test_a_wrong_rule_about_causal_masks_is_refuted():
    """A rule that drops a causal mask without the flag: the check draws the mask in each of
    its forms (additive, boolean, a `causal_mask`) and finds the sides differ."""
    (rule,) = parse_rules("""
rule drop-the-causal-mask:
  (attention ?q ?k ?v ?m :scale ?s :causal false) => (attention ?q ?k ?v :scale ?s :causal false)
  where (causal ?m), (eq (dim ?m -2) (dim ?q -2)), (eq (dim ?m -1) (dim ?k -2))
""")
    with pytest.raises(RuleCheckError):
        check_rule(rule, examples=6)


def causal_attention(dtype: str = "bool", symbolic: bool = True):
    n = size_symbol("seq") if symbolic else 6
    b = GraphBuilder(seed=0)
    q = b.input("q", (1, 2, n, 8), "float32")
    mask = b.causal_mask(q, shape=(1, 1, n, n), dtype=dtype, fill=-3.0e38,
                         sources=(("seq", 0, 2),) if symbolic else ())
    b.output(b.attention(q, q, q, mask, scale=0.25, causal=False))
    return b.build()


@pytest.mark.parametrize("dtype", ["bool", "float32"])
def test_the_library_reads_a_causal_mask_as_the_flag(dtype):
    graph = causal_attention(dtype)
    rules = [r for r in builtin_rules() if r.name == "attention-causal-mask"]
    normal, steps = first_normal_form(graph, rules)
    attention = [n for n in normal.nodes.values() if n.op == "attention"]
    assert any(step.rule == "attention-causal-mask" for step in steps), steps
    assert attention[0].attrs["causal"] and len(attention[0].inputs) == 3
    q = np.random.default_rng(0).standard_normal((1, 2, 6, 8)).astype(np.float32)
    before = evaluate(bind_graph(graph, {"seq": 6}), {"q": q})
    after = evaluate(bind_graph(normal, {"seq": 6}), {"q": q})
    np.testing.assert_allclose(after["output_0"], before["output_0"], rtol=1e-5, atol=1e-6)


def test_causal_mask_values_at_every_size():
    """The operator's values (reference, torch lowering through a bound graph) are the lower
    triangle, boolean or additive, at the sizes its input carries."""
    graph = causal_attention("bool")
    q = np.zeros((1, 2, 5, 8), dtype=np.float32)
    node = next(n for n in graph.nodes.values() if n.op == "causal_mask")
    (keep,) = get_op("causal_mask").evaluate(node.attrs, [q])
    np.testing.assert_array_equal(keep[0, 0], np.tril(np.ones((5, 5), dtype=bool)))
    attrs = dict(node.attrs, dtype="float32", fill=float("-inf"))
    (added,) = get_op("causal_mask").evaluate(attrs, [q])
    assert added.dtype == np.float32 and added[0, 0, 0, 1] == -np.inf and added[0, 0, 1, 0] == 0


def _variants():
    """Masks written many ways, causal or not: (name, builder, causal as written)."""
    def p(n, d):
        return torch.arange(n, device=d)

    yield "difference", lambda n, d: ((p(n, d)[:, None] - p(n, d)[None, :]) >= 0)[None, None], True
    yield "not-after", lambda n, d: (~(p(n, d)[None, :] > p(n, d)[:, None]))[None, None], True
    yield "transposed", lambda n, d: (p(n, d)[:, None] <= p(n, d)[None, :]).T[None, None], True
    yield "upper", lambda n, d: (p(n, d)[:, None] <= p(n, d)[None, :])[None, None], False
    yield "offset-positions", lambda n, d: ((p(n, d) + 3)[None, :] <= (p(n, d) + 3)[:, None]
                                            )[None, None], True
    yield "mixed-offsets", lambda n, d: ((p(n, d) + 1)[None, :] <= p(n, d)[:, None])[None, None], False
    yield "first-row-open", lambda n, d: ((p(n, d)[None, :] <= p(n, d)[:, None])
                                          | (p(n, d)[:, None] == 0))[None, None], False
    yield "additive-inf", lambda n, d: torch.where(
        (p(n, d)[None, :] <= p(n, d)[:, None])[None, None], 0.0, float("-inf")), True
    yield "additive-small", lambda n, d: torch.where(
        (p(n, d)[None, :] <= p(n, d)[:, None])[None, None], 0.0, -1.0), False
    yield "masked-fill", lambda n, d: torch.zeros(1, 1, n, n, device=d).masked_fill(
        p(n, d)[None, :] > p(n, d)[:, None], float("-inf")), True


@pytest.mark.parametrize("name,build,causal", list(_variants()),
                         ids=[v[0] for v in _variants()])
def test_what_is_proven_is_true_at_every_length_tried(name, build, causal):
    """Proven only where the mask is causal as written (checked by running it), and the
    plainly causal ways of writing it are proven."""
    mask = proven(build)
    for n in (2, 3, 17, 64):
        value = build(n, "cpu")
        keep = value if value.dtype == torch.bool else value == 0
        truly = bool(torch.equal(keep[0, 0], torch.ones(n, n, dtype=torch.bool).tril()))
        if value.dtype != torch.bool:
            truly = truly and bool((value[0, 0][~keep[0, 0]] <= -1e30).all())
        assert truly == causal, (name, n)  # the variant is what it says, run
    assert (mask is not None) == causal, name
