"""The zoo's Llama-style decoder: its structure (the nodes the dynamo exporter writes for
transformers' LlamaModel), its numerics against an independent numpy Llama in float64, and
its ONNX export in onnxruntime."""

from __future__ import annotations

import math

import numpy as np
import pytest

import graphsub
from graphsub import zoo
from graphsub.ir.graph import Graph, Value
from graphsub.runtime import evaluate, graph_input_specs, random_feeds, run
from graphsub.verdicts import compare_models
from graphsub.verdicts.equivalence import Tolerance
from tests.zoo.test_sequence_models import assert_well_conditioned, op_counts

SMALL = dict(layers=2, seq=16, hidden=32, heads=4, kv_heads=2, mlp=48)
SMALL_SPEC = "llama:" + ",".join(f"{k}={v}" for k, v in SMALL.items())

#: The nodes one decoder layer exports to: 2 RMSNorms (pow, reduce_mean, add, sqrt,
#: reciprocal, 2 mul), 7 projections and 2 attention products, rotary embeddings of q and k
#: (2 slices, neg, concat, 2 mul, add each), repeat_kv of k and v (unsqueeze, opaque Expand,
#: reshape; k's transpose through reshapes), the two scalings, the mask's add and the guarded
#: softmax, SwiGLU (sigmoid, 2 mul) and 2 residual adds.
PER_LAYER = {"matmul": 9, "mul": 10, "add": 7, "reshape": 7, "transpose": 5, "slice": 4,
             "neg": 2, "concat": 2, "unsqueeze": 2, "opaque": 2, "smul": 2, "pow": 2,
             "reduce_mean": 2, "sqrt": 2, "reciprocal": 2, "sigmoid": 1, "guarded_softmax": 1}


def build_small(**overrides: int) -> Graph:
    return zoo.parse_spec("llama")[0].build(**{**SMALL, **overrides})


def weights_of(g: Graph, op: str, position: int, rank: int) -> list[np.ndarray]:
    """The float weights read at `position` by `op` nodes, in creation order (builders number
    nodes in creation order): the projections (matmul, 1, rank 2) or the RMSNorm weights (mul,
    0, rank 1)."""
    out = []
    for nid in sorted(g.nodes_by_op(op)):
        src = g[g[nid].inputs[position].node]
        if src.op == "weight" and src.attrs["value"].array.ndim == rank:
            out.append(src.attrs["value"].array.astype(np.float64))
    return out


# ---- an independent numpy Llama (transformers' modeling_llama, float64) ----------------------

def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    return weight * x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)


def rotary(x: np.ndarray) -> np.ndarray:
    """apply_rotary_pos_emb on (heads, seq, d) with positions 0..seq-1 and theta 10000."""
    _, seq, d = x.shape
    inv_freq = 1.0 / 10000.0 ** (np.arange(0, d, 2) / d)
    angles = np.arange(seq)[:, None] * inv_freq[None, :]
    cos, sin = np.cos(np.concatenate([angles] * 2, -1)), np.sin(np.concatenate([angles] * 2, -1))
    rotated = np.concatenate([-x[..., d // 2:], x[..., :d // 2]], axis=-1)
    return x * cos + rotated * sin


def causal_gqa(x: np.ndarray, wq, wk, wv, wo, heads: int, kv_heads: int) -> np.ndarray:
    """Causal grouped-query self-attention of x (seq, hidden), softmax by hand."""
    seq, hidden = x.shape
    d = hidden // heads

    def split(y: np.ndarray, n: int) -> np.ndarray:
        return y.reshape(seq, n, d).transpose(1, 0, 2)

    q, k, v = rotary(split(x @ wq, heads)), rotary(split(x @ wk, kv_heads)), split(x @ wv, kv_heads)
    k, v = np.repeat(k, heads // kv_heads, axis=0), np.repeat(v, heads // kv_heads, axis=0)
    scores = q @ k.transpose(0, 2, 1) / math.sqrt(d)
    scores = np.where(np.tril(np.ones((seq, seq), dtype=bool)), scores, -np.inf)
    p = np.exp(scores - scores.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return (p @ v).transpose(1, 0, 2).reshape(seq, hidden) @ wo


def numpy_llama(g: Graph, x: np.ndarray, layers: int, heads: int, kv_heads: int) -> np.ndarray:
    proj = weights_of(g, "matmul", 1, 2)   # per layer: q, k, v, o, gate, up, down
    norms = weights_of(g, "mul", 0, 1)     # per layer: input, post-attention; then the final
    assert len(proj) == 7 * layers and len(norms) == 2 * layers + 1
    h = x[0].astype(np.float64)
    for i in range(layers):
        wq, wk, wv, wo, wg, wu, wd = proj[7 * i:7 * i + 7]
        h = h + causal_gqa(rms_norm(h, norms[2 * i]), wq, wk, wv, wo, heads, kv_heads)
        m = rms_norm(h, norms[2 * i + 1])
        gate = m @ wg
        h = h + (gate / (1 + np.exp(-gate)) * (m @ wu)) @ wd
    return rms_norm(h, norms[-1])[None]


# ---- registry and structure ----------------------------------------------------------------

def test_registered_with_its_parameters():
    model = {m.name: m for m in zoo.models()}["llama"]
    assert model.params == dict(layers=2, seq=512, hidden=256, heads=8, kv_heads=2, mlp=704)
    g = zoo.build(SMALL_SPEC)
    assert g.input_names == ("inputs_embeds",) and g.output_names == ("last_hidden_state",)
    assert g.type_of(Value(g.inputs[0])).shape == g.type_of(g.outputs[0]).shape == (1, 16, 32)


@pytest.mark.parametrize("layers", [1, 3])
def test_each_layer_is_what_the_exporter_writes(layers):
    ops = op_counts(build_small(layers=layers))
    final_norm = {"pow": 1, "reduce_mean": 1, "add": 1, "sqrt": 1, "reciprocal": 1, "mul": 2}
    # The rotary tables' unsqueezes are written once, for every layer.
    shared = {"unsqueeze": 2}
    for op, n in PER_LAYER.items():
        assert ops[op] == n * layers + final_norm.get(op, 0) + shared.get(op, 0), op
    assert set(ops) == set(PER_LAYER) | {"input", "weight"}


def test_grouped_query_attention_shapes():
    g = build_small(heads=8, kv_heads=2)
    expands = [g[n] for n in g.nodes_by_op("opaque")]
    assert {n.attrs["op_type"] for n in expands} == {"Expand"}
    # Two key/value heads of size 4, each repeated for four query heads.
    assert {n.outputs[0].shape for n in expands} == {(1, 2, 4, 16, 4)}
    assert {n.outputs[0].shape for n in (g[i] for i in g.nodes_by_op("guarded_softmax"))} == {
        (1, 8, 16, 16)}


def test_causal_mask_leaves_every_query_a_key():
    """Row i may read keys 0..i: no row is fully masked, so the softmax's guard changes
    nothing (what lets graphsub drop it)."""
    g = build_small()
    softmax = min(g.nodes_by_op("guarded_softmax"))
    add = g[g[softmax].inputs[0].node]
    mask = g[add.inputs[1].node].attrs["value"].array[0, 0]
    keep = mask == 0
    assert (keep == np.tril(np.ones_like(keep))).all()
    assert (mask[~keep] == np.finfo(np.float32).min).all()


def test_norm_weights_are_perturbed():
    norms = weights_of(build_small(), "mul", 0, 1)
    assert len(norms) == 2 * SMALL["layers"] + 1
    for w in norms:
        assert np.abs(w - 1).min() > 0 and 0.8 <= w.min() and w.max() <= 1.2


def test_rejects_heads_that_do_not_fit():
    with pytest.raises(ValueError, match="multiple"):
        build_small(heads=3)
    with pytest.raises(ValueError, match="multiple"):
        build_small(kv_heads=3)


def test_seed_determines_the_graph():
    a, b, c = zoo.build(SMALL_SPEC), zoo.build(SMALL_SPEC), zoo.build(SMALL_SPEC, seed=1)
    assert a.structural_hash() == b.structural_hash() != c.structural_hash()


# ---- numerics --------------------------------------------------------------------------------

@pytest.mark.parametrize("heads, kv_heads", [(4, 2), (4, 1), (4, 4)])
def test_matches_a_numpy_llama(heads, kv_heads):
    g = build_small(heads=heads, kv_heads=kv_heads)
    feeds = random_feeds(graph_input_specs(g), seed=3)
    got = evaluate(g, feeds)["last_hidden_state"]
    want = numpy_llama(g, feeds["inputs_embeds"], SMALL["layers"], heads, kv_heads)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert_well_conditioned(got)


def test_onnxruntime_agrees_with_the_reference_evaluator_and_the_round_trip():
    g = zoo.build(SMALL_SPEC)
    feeds = random_feeds(graph_input_specs(g), seed=4)
    first = graphsub.to_onnx(g)
    ref = evaluate(g, feeds)["last_hidden_state"]
    got = run(first, feeds)["last_hidden_state"]
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    again = graphsub.to_onnx(graphsub.load(first))
    result = compare_models(first.SerializeToString(), again.SerializeToString(),
                            graph_input_specs(g), Tolerance(1e-4, 1e-5), trials=1)
    assert result.equivalent, [d.describe() for d in result.outputs] + list(result.problems)


@pytest.mark.slow
def test_default_size():
    g = zoo.build("llama")
    ops = op_counts(g)
    assert ops["matmul"] == 9 * 2 and ops["guarded_softmax"] == 2
    assert {g[n].outputs[0].shape for n in g.nodes_by_op("guarded_softmax")} == {(1, 8, 512, 512)}
    floats = sum(n.attrs["value"].array.size for n in g.nodes.values()
                 if n.op == "weight" and n.attrs["value"].array.dtype == np.float32)
    # 2 layers of 4 attention projections (256 x (256 + 64 + 64 + 256)) and 3 of the MLP
    # (256 x 704), 5 norm weights of 256, the rotary tables (2 x 512 x 32) and the mask.
    assert floats == 2 * (256 * 640 + 3 * 256 * 704) + 5 * 256 + 2 * 512 * 32 + 512 * 512 + 3


def test_the_demo_model_holds_the_rewrites_that_pay_on_onnxruntime():
    """`make demo` optimizes this model (Makefile's DEMO_MODEL) because graphsub's rewrites
    pay on it: the exporter's softmax guard goes (onnxruntime's IsNaN and Where cost twice the
    softmax they guard) and the products that share an input merge. Whether they pay is
    measured in bench/RESULTS.md; here, that the search finds them, under a cost model that
    does not depend on this machine."""
    import re
    from pathlib import Path

    from graphsub.cost import AnalyticCostModel

    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    assert re.search(r"^DEMO_MODEL \?= llama$", makefile, re.M)
    result = graphsub.optimize(zoo.build("llama"), cost=AnalyticCostModel("cpu"), budget=100,
                               time_limit=600)
    used = result.rules_used()
    assert used["softmax-guard-unneeded"] == 2  # one guard per layer
    assert result.final_cost < 0.9 * result.initial_cost
