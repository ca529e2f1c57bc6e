"""Structure and numerics of the sequence models of the zoo: bert, nasrnn, sru and vit.

Structure is checked at small sizes (op counts, shapes, names); numerics by evaluating small
configurations with graphsub's reference evaluator against plain numpy implementations of
multi-head attention, a BERT layer and the SRU recurrence. ONNX round trips of every zoo
model live in another test file.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
from scipy import special

from graphsub import zoo
from graphsub.ir.graph import Graph, Node, Value
from graphsub.runtime import evaluate, graph_input_specs, random_feeds

SMALL_BERT = dict(layers=1, seq=8, hidden=32, heads=4)


def op_counts(g: Graph) -> Counter[str]:
    return Counter(n.op for n in g.nodes.values())


def compute_ops(g: Graph) -> int:
    """Operator nodes: everything but graph inputs and weights."""
    return sum(1 for n in g.nodes.values() if n.op not in ("input", "weight"))


def run_reference(g: Graph, seed: int = 0) -> tuple[dict[str, np.ndarray], np.ndarray]:
    feeds = random_feeds(graph_input_specs(g), seed)
    return feeds, evaluate(g, feeds)["output"]


def assert_well_conditioned(out: np.ndarray) -> None:
    assert np.isfinite(out).all()
    assert out.std() > 0.01, f"output is (nearly) constant: std {out.std()}"


# ---- reading a graph's structure -----------------------------------------------------------

def producer(g: Graph, v: Value, op: str) -> Node:
    node = g[v.node]
    assert node.op == op, f"expected {op} to produce {v!r}, found {node.op}"
    return node


def weight_array(g: Graph, v: Value) -> np.ndarray:
    return producer(g, v, "weight").attrs["value"].array


def only_user(g: Graph, node_id: int, op: str) -> int:
    users = [nid for nid, _ in g.users()[node_id] if g[nid].op == op]
    assert len(users) == 1, f"node {node_id} has {len(users)} {op} users"
    return users[0]


def projection_weight(g: Graph, head_value: Value, x: Value) -> tuple[np.ndarray, tuple[int, ...]]:
    """Follow transpose <- reshape <- matmul(x, W) back from a per-head tensor: (W, perm)."""
    t = producer(g, head_value, "transpose")
    r = producer(g, t.inputs[0], "reshape")
    m = producer(g, r.inputs[0], "matmul")
    assert m.inputs[0] == x
    return weight_array(g, m.inputs[1]), t.attrs["perm"]


# ---- numpy references ------------------------------------------------------------------------

def numpy_mha(x: np.ndarray, wq: np.ndarray, wk: np.ndarray, wv: np.ndarray, wo: np.ndarray,
              heads: int) -> np.ndarray:
    """Multi-head self-attention, one head at a time, in float64."""
    x = x.astype(np.float64)
    q, k, v = x @ wq, x @ wk, x @ wv
    d = x.shape[1] // heads
    out = np.zeros_like(q)
    for i in range(heads):
        cols = slice(i * d, (i + 1) * d)
        scores = q[:, cols] @ k[:, cols].T / math.sqrt(d)
        p = np.exp(scores - scores.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        out[:, cols] = p @ v[:, cols]
    return out @ wo


def numpy_layer_norm(x: np.ndarray, scale: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * scale + bias


def numpy_gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + special.erf(x / math.sqrt(2)))


# ---- registry --------------------------------------------------------------------------------

def test_models_are_registered_with_their_parameters():
    models = {m.name: m for m in zoo.models()}
    assert models["bert"].params == dict(layers=8, seq=64, hidden=1024, heads=16)
    assert models["nasrnn"].params == dict(hidden=512, steps=5)
    assert models["sru"].params == dict(hidden=1024, steps=1)
    assert models["vit"].params == dict(layers=12)


def test_spec_parameters_reach_the_builder():
    g = zoo.build("nasrnn:hidden=16,steps=2")
    assert g.input_names == ("x0", "x1")
    assert g.type_of(g.outputs[0]).shape == (1, 16)


# ---- bert --------------------------------------------------------------------------------

@pytest.mark.parametrize("layers", [1, 3])
def test_bert_structure(layers):
    g = zoo.parse_spec("bert")[0].build(layers=layers, seq=8, hidden=48, heads=4)
    ops = op_counts(g)
    # Q, K, V, O projections, Q @ K^T, P @ V, two FFN matmuls.
    assert ops["matmul"] == 8 * layers
    assert ops["softmax"] == ops["smul"] == ops["gelu"] == layers
    assert ops["layer_norm"] == 2 * layers
    assert ops["reshape"] == ops["transpose"] == 4 * layers
    assert ops["add"] == 2 * layers  # the residuals; TASO-style projections have no bias
    assert g.input_names == ("input",) and g.output_names == ("output",)
    assert g.type_of(g.outputs[0]).shape == (8, 48)
    # The two batched matmuls of each layer: (heads, seq, seq) scores and (heads, seq, d).
    batched = [g.type_of(Value(n)).shape for n in g.nodes_by_op("matmul")
               if g.type_of(Value(n)).rank == 3]
    assert batched == [(4, 8, 8), (4, 8, 12)] * layers


def test_bert_attention_matches_numpy_multi_head_attention():
    g = zoo.parse_spec("bert")[0].build(**SMALL_BERT)
    x_in = Value(g.inputs[0])
    (softmax_id,) = g.nodes_by_op("softmax")
    smul = producer(g, g[softmax_id].inputs[0], "smul")
    assert float(weight_array(g, smul.inputs[1])) == pytest.approx(1 / math.sqrt(8))
    qk = producer(g, smul.inputs[0], "matmul")
    wq, perm_q = projection_weight(g, qk.inputs[0], x_in)
    wk, perm_k = projection_weight(g, qk.inputs[1], x_in)
    assert perm_q == (1, 0, 2) and perm_k == (1, 2, 0)  # K arrives transposed: (heads, d, seq)
    pv_id = only_user(g, softmax_id, "matmul")
    wv, perm_v = projection_weight(g, g[pv_id].inputs[1], x_in)
    assert perm_v == (1, 0, 2)
    back = only_user(g, pv_id, "transpose")
    merged = only_user(g, back, "reshape")
    wo_id = only_user(g, merged, "matmul")
    wo = weight_array(g, g[wo_id].inputs[1])

    attn = Graph(g.nodes, g.inputs, [Value(wo_id)], ["attention"])
    feeds = random_feeds(graph_input_specs(g), seed=3)
    got = evaluate(attn, feeds)["attention"]
    want = numpy_mha(feeds["input"], wq, wk, wv, wo, heads=4)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert want.std() > 0.1

    # The rest of the layer: LN(x + attn), then LN(h + W2 gelu(W1 h)).
    add1 = only_user(g, wo_id, "add")
    ln1 = only_user(g, add1, "layer_norm")
    w1_id = only_user(g, ln1, "matmul")
    w2_id = only_user(g, only_user(g, w1_id, "gelu"), "matmul")
    ln2 = g[g.outputs[0].node]
    assert ln2.op == "layer_norm"
    eps = g[ln1].attrs["epsilon"]
    x = feeds["input"].astype(np.float64)
    h = numpy_layer_norm(x + want, weight_array(g, g[ln1].inputs[1]),
                         weight_array(g, g[ln1].inputs[2]), eps)
    ffn = numpy_gelu(h @ weight_array(g, g[w1_id].inputs[1])) @ weight_array(g, g[w2_id].inputs[1])
    layer = numpy_layer_norm(h + ffn, weight_array(g, ln2.inputs[1]),
                             weight_array(g, ln2.inputs[2]), eps)
    np.testing.assert_allclose(evaluate(g, feeds)["output"], layer, rtol=1e-4, atol=1e-4)


def test_bert_output_is_well_conditioned():
    g = zoo.parse_spec("bert")[0].build(layers=2, seq=8, hidden=32, heads=4)
    _, out = run_reference(g)
    assert_well_conditioned(out)
    assert abs(out.std() - 1) < 0.3  # post-norm: the output is layer-normalized


def test_bert_rejects_heads_that_do_not_divide_hidden():
    with pytest.raises(ValueError, match="divisible"):
        zoo.parse_spec("bert")[0].build(layers=1, seq=8, hidden=30, heads=4)


# ---- nasrnn ------------------------------------------------------------------------------

def test_nasrnn_node_count_grows_linearly_with_steps():
    build = zoo.parse_spec("nasrnn")[0].build
    sizes = [len(build(hidden=8, steps=s)) for s in (1, 2, 3, 4)]
    per_step = {b - a for a, b in zip(sizes, sizes[1:])}
    # Per step: one input, 16 weight matrices and 46 operators (16 matmuls, 8 gate adds, the
    # 22-op relu/sigmoid/tanh tree); the initial state is one more weight.
    assert per_step == {1 + 16 + 46}
    assert sizes[0] == 1 + 1 + 16 + 46


def test_nasrnn_structure():
    g = zoo.parse_spec("nasrnn")[0].build(hidden=8, steps=5)
    ops = op_counts(g)
    assert compute_ops(g) == 230  # the operator count of the OCGGS paper's Table 2
    assert ops["matmul"] == 16 * 5
    assert dict(ops) == {"input": 5, "weight": 81, "matmul": 80, "add": 55, "mul": 20,
                         "relu": 10, "sigmoid": 25, "tanh": 40}
    assert g.input_names == tuple(f"x{t}" for t in range(5))
    assert g.type_of(g.outputs[0]).shape == (1, 8)
    assert g[g.outputs[0].node].op == "tanh"


def test_nasrnn_output_depends_on_every_step():
    g = zoo.parse_spec("nasrnn")[0].build(hidden=32, steps=3)
    feeds, out = run_reference(g)
    assert_well_conditioned(out)
    for name in g.input_names:
        changed = dict(feeds, **{name: feeds[name] + 1})
        assert np.abs(evaluate(g, changed)["output"] - out).max() > 1e-3, name


# ---- sru ---------------------------------------------------------------------------------

def test_sru_structure():
    build = zoo.parse_spec("sru")[0].build
    for steps in (1, 4):
        g = build(hidden=16, steps=steps)
        ops = op_counts(g)
        assert ops["matmul"] == 3 * steps and ops["sigmoid"] == 2 * steps
        assert ops["tanh"] == steps and ops["sub"] == 2 * steps
        assert compute_ops(g) == 16 * steps + (steps > 1)  # + the concat of the outputs
        assert g.input_names == tuple(f"x{t}" for t in range(steps)) + ("c0",)
        assert g.type_of(g.outputs[0]).shape == (steps, 16)


def test_sru_matches_numpy_recurrence():
    steps, hidden = 3, 16
    g = zoo.parse_spec("sru")[0].build(hidden=hidden, steps=steps)
    # Builders number nodes in creation order: per step the matmuls for x~, f and r, and the
    # bias adds for f and r.
    matmuls = sorted(g.nodes_by_op("matmul"))
    bias_adds = sorted(n for n in g.nodes_by_op("add") if g[g[n].inputs[1].node].op == "weight")
    assert len(matmuls) == 3 * steps and len(bias_adds) == 2 * steps
    feeds, out = run_reference(g)
    assert_well_conditioned(out)

    def sig(z):
        return 1 / (1 + np.exp(-z))

    c = feeds["c0"].astype(np.float64)
    hs = []
    for t in range(steps):
        w, wf, wr = (weight_array(g, g[m].inputs[1]) for m in matmuls[3 * t:3 * t + 3])
        bf, br = (weight_array(g, g[a].inputs[1]) for a in bias_adds[2 * t:2 * t + 2])
        x = feeds[f"x{t}"].astype(np.float64)
        f, r = sig(x @ wf + bf), sig(x @ wr + br)
        c = f * c + (1 - f) * (x @ w)
        hs.append(r * np.tanh(c) + (1 - r) * x)
    np.testing.assert_allclose(out, np.concatenate(hs), rtol=1e-4, atol=1e-5)


# ---- vit ---------------------------------------------------------------------------------

def test_vit_structure():
    g = zoo.parse_spec("vit")[0].build(layers=2)
    ops = op_counts(g)
    assert ops["conv2d"] == 1 and ops["reduce_mean"] == 1
    assert ops["matmul"] == 8 * 2 + 1  # 8 per block and the classifier
    assert ops["layer_norm"] == 2 * 2 + 1
    assert ops["softmax"] == ops["gelu"] == ops["smul"] == 2
    assert g.input_names == ("input",)
    assert g.type_of(Value(g.inputs[0])).shape == (1, 3, 224, 224)
    assert g.type_of(g.outputs[0]).shape == (1, 1000)
    (conv,) = g.nodes_by_op("conv2d")
    assert g[conv].attrs["stride"] == (16, 16) and g[conv].type.shape == (1, 768, 14, 14)
    # 196 tokens of width 768, 12 heads of 64.
    (attention,) = {g.type_of(Value(n)).shape for n in g.nodes_by_op("softmax")}
    assert attention == (12, 196, 196)


def test_vit_output_is_well_conditioned():
    g = zoo.parse_spec("vit")[0].build(layers=1)
    _, out = run_reference(g)
    assert_well_conditioned(out)


# ---- all models --------------------------------------------------------------------------

SMALL_SPECS = ["bert:layers=1,seq=8,hidden=32,heads=4", "nasrnn:hidden=16,steps=2",
               "sru:hidden=16,steps=2", "vit:layers=1"]


@pytest.mark.parametrize("spec", SMALL_SPECS)
def test_seed_determines_the_graph(spec):
    a, b, c = zoo.build(spec, seed=0), zoo.build(spec, seed=0), zoo.build(spec, seed=1)
    assert a.structural_hash() == b.structural_hash()
    assert a.structural_hash() != c.structural_hash()


@pytest.mark.slow
@pytest.mark.parametrize("name, matmuls, ops, params", [
    ("bert", 64, 184, 100_696_072),
    ("nasrnn", 80, 230, 20_972_032),
    ("sru", 3, 16, 3_147_777),
    ("vit", 97, 356, 86_566_132),
])
def test_default_sizes(name, matmuls, ops, params):
    g = zoo.build(name)
    assert op_counts(g)["matmul"] == matmuls
    assert compute_ops(g) == ops
    assert sum(n.attrs["value"].array.size for n in g.nodes.values() if n.op == "weight") == params
