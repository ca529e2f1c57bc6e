"""The operator-fission paper's workloads in the zoo: the softmax and linear-attention
subgraphs against numpy, and Segformer's structure, shapes and numerics."""

from __future__ import annotations

import numpy as np
from scipy import special

from graphsub import zoo
from graphsub.fission import fission
from graphsub.runtime import evaluate
from tests.zoo.test_sequence_models import assert_well_conditioned, op_counts, run_reference


def test_softmax_subgraph_is_scaled_dot_product_attention():
    g = zoo.build("softmax_subgraph:heads=2,seq=8,head_dim=4")
    feeds, out = run_reference(g)
    q, k_t, v = (feeds[n].astype(np.float64) for n in ("q", "k_t", "v"))
    expected = special.softmax(q @ k_t / 2.0, axis=-1) @ v
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


def test_linear_attention_normalizes_queries_by_feature_and_keys_by_position():
    g = zoo.build("linear_attention:seq=16,hidden=8,heads=2")
    assert op_counts(g)["softmax"] == 2 and op_counts(g)["matmul"] == 6
    _, out = run_reference(g)
    assert out.shape == (16, 8)
    assert_well_conditioned(out)
    # The keys' softmax runs along the sequence: the (h, d, s) tensor's last axis.
    softmaxes = [n for n in g.nodes.values() if n.op == "softmax"]
    assert sorted(g.type_of(n.inputs[0]).shape for n in softmaxes) == [(2, 4, 16), (2, 16, 4)]


def test_segformer_structure_and_numerics():
    g = zoo.build("segformer:image=64")
    ops = op_counts(g)
    # 4 stages x 2 blocks of attention; layer norms: per stage the patch embedding's, two per
    # block, one per block on reduced keys (stages 1-3) and the stage's last.
    assert ops["softmax"] == 8 and ops["gelu"] == 8 and ops["layer_norm"] == 30
    # 4 patch embeddings, 8 depthwise 3x3, 6 spatial reductions, the decoder's 2.
    assert ops["conv2d"] == 20 and ops["batch_norm"] == 1
    feeds, out = run_reference(g)
    assert out.shape == (1, 150, 16, 16)
    assert_well_conditioned(out)
    # Fission keeps the function.
    split = evaluate(fission(g), feeds)["output"]
    np.testing.assert_allclose(split, out, rtol=1e-3, atol=1e-3 * float(np.abs(out).max()))
