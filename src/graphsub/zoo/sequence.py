"""Sequence models of the papers: BERT and NasRNN (TASO), SRU (OCGGS) and a ViT encoder.

All four are built from a few shared pieces: a dense layer, layer normalization, a working
multi-head attention and a feed-forward block (the transformers share the last two). Weights are
random from the seed and scaled so that a standard-normal input gives activations of about
unit variance at every layer: gate and softmax inputs are neither saturated nor flat, and the
outputs are neither constant nor blown up.

    from graphsub import zoo
    graph = zoo.build("bert:layers=2")
"""

from __future__ import annotations

import math

import numpy as np

from graphsub.ir.builder import GraphBuilder
from graphsub.ir.graph import Graph, Value
from graphsub.zoo import register
from graphsub.zoo.blocks import dense, layer_norm, normal_weight, scalar, split_heads

def _attention(b: GraphBuilder, x: Value, heads: int, bias: bool) -> Value:
    """Multi-head self-attention of x (seq, hidden): softmax(Q K^T / sqrt(d)) V per head,
    heads concatenated, then the output projection.

    TASO's examples/bert.py multiplies Q by K without the transpose, has no scaling or softmax,
    and projects the *input* instead of the attention result (so the attention is dead code);
    this is the computation it meant. The four projections and the two batched matmuls are
    the six `matmul` nodes of the block.
    """
    seq, hidden = b.shape(x)
    if hidden % heads:
        raise ValueError(f"attention: hidden size {hidden} is not divisible by {heads} heads")
    head_dim = hidden // heads
    q = split_heads(b, dense(b, x, hidden, bias), heads, (1, 0, 2))    # (h, s, d)
    k_t = split_heads(b, dense(b, x, hidden, bias), heads, (1, 2, 0))  # (h, d, s)
    v = split_heads(b, dense(b, x, hidden, bias), heads, (1, 0, 2))    # (h, s, d)
    logits = b.smul(b.matmul(q, k_t), scalar(b, 1.0 / math.sqrt(head_dim)))  # (h, s, s)
    context = b.matmul(b.softmax(logits, axis=-1), v)                         # (h, s, d)
    merged = b.reshape(b.transpose(context, perm=(1, 0, 2)), shape=(seq, hidden))
    return dense(b, merged, hidden, bias)


def _feed_forward(b: GraphBuilder, x: Value, inner: int, bias: bool) -> Value:
    """The position-wise MLP: hidden -> inner with (exact, erf) GELU -> hidden; two matmuls."""
    hidden = b.shape(x)[-1]
    return dense(b, b.gelu(dense(b, x, inner, bias)), hidden, bias)


def _post_norm_layer(b: GraphBuilder, x: Value, heads: int, epsilon: float) -> Value:
    """A BERT encoder layer: LN(x + attention(x)), then LN(x + FFN(x)), FFN inner 4 * hidden.
    No projection biases, as in TASO's example (its graph has weights only in matmuls)."""
    hidden = b.shape(x)[-1]
    x = layer_norm(b, b.add(x, _attention(b, x, heads, bias=False)), epsilon)
    return layer_norm(b, b.add(x, _feed_forward(b, x, 4 * hidden, bias=False)), epsilon)


def _pre_norm_layer(b: GraphBuilder, x: Value, heads: int, mlp: int, epsilon: float) -> Value:
    """A ViT encoder block: x + attention(LN(x)), then x + MLP(LN(x)), with biases as in ViT."""
    x = b.add(x, _attention(b, layer_norm(b, x, epsilon), heads, bias=True))
    x = b.add(x, _feed_forward(b, layer_norm(b, x, epsilon), mlp, bias=True))
    return x


@register("bert", "BERT encoder (TASO): 8 post-norm layers, seq 64, hidden 1024, 16 heads",
          "taso-sosp19", layers=8, seq=64, hidden=1024, heads=16)
def bert(layers: int = 8, seq: int = 64, hidden: int = 1024, heads: int = 16,
         seed: int = 0) -> Graph:
    """TASO's BERT benchmark (examples/bert.py): a (seq, hidden) input, no embedding, no batch.

    Each layer is a working multi-head attention (see `_attention`; TASO's example computes
    no real attention) followed by the residual add + layer norm and a 4 * hidden GELU
    feed-forward with its own residual add + layer norm: 8 matmuls a layer. Layer norm epsilon
    is BERT's 1e-12.
    """
    b = GraphBuilder(seed)
    x = b.input("input", (seq, hidden))
    for _ in range(layers):
        x = _post_norm_layer(b, x, heads, epsilon=1e-12)
    b.output(x, "output")
    return b.build()


@register("vit", "ViT-B/16 encoder on 224x224, no class token (mean-pooled), 1000 classes",
          "vit-iclr21", layers=12)
def vit(layers: int = 12, seed: int = 0) -> Graph:
    """A ViT-B/16 image classifier (Dosovitskiy et al., 2021) for one 224x224 RGB image.

    Patch embedding is a 16x16 stride-16 convolution (with bias) to 768 channels, flattened
    and transposed to 196 tokens of width 768. There is no class token (nothing is
    prepended): the classifier reads the mean of the final tokens instead. A learned position
    embedding is added, then `layers` pre-norm blocks (12 heads, MLP 3072 with GELU, biases
    everywhere), a final layer norm (epsilon 1e-6 as in ViT), the mean over tokens
    (reduce_mean) and a 768 -> 1000 classifier with bias.
    """
    image, patch, hidden, heads, mlp, classes = 224, 16, 768, 12, 3072, 1000
    b = GraphBuilder(seed)
    x = b.input("input", (1, 3, image, image))
    fan_in = 3 * patch * patch
    x = b.conv2d(x, normal_weight(b, (hidden, 3, patch, patch), fan_in),
                 b.uniform_weight((hidden,), -0.1, 0.1), stride=patch, padding="valid")
    tokens = (image // patch) ** 2
    x = b.transpose(b.reshape(x, shape=(hidden, tokens)), perm=(1, 0))  # (196, 768)
    # ViT initializes position embeddings with std 0.02; at that size they vanish next to
    # the unit-variance patch embeddings, so use std 0.5 to keep them part of the result.
    x = b.add(x, b.weight(b.rng.standard_normal((tokens, hidden), dtype=np.float32)
                          * np.float32(0.5)))
    for _ in range(layers):
        x = _pre_norm_layer(b, x, heads, mlp, epsilon=1e-6)
    x = b.reduce_mean(layer_norm(b, x, 1e-6), axes=(0,), keepdims=True)  # (1, 768)
    b.output(dense(b, x, classes, bias=True), "output")
    return b.build()


# ---- recurrent cells -----------------------------------------------------------------------


def _step_inputs(b: GraphBuilder, steps: int, width: int) -> list[Value]:
    """One (1, width) graph input per time step, x0 .. x{steps-1}, as TASO's RNN examples
    declare them (a separate input per step, batch 1)."""
    return [b.input(f"x{t}", (1, width)) for t in range(steps)]


def _nas_combine(b: GraphBuilder, x: Value, h: Value, hidden: int) -> Value:
    """x @ W + h @ U: one gate pre-activation, two matmuls with fresh weights (TASO's
    combine())."""
    y: Value = b.add(dense(b, x, hidden), dense(b, h, hidden))
    return y


def _nas_cell(b: GraphBuilder, x: Value, h: Value, hidden: int) -> Value:
    """One NasRNN cell exactly as TASO's nas_node(): 8 gate pre-activations, then the
    relu/sigmoid/tanh tree of adds and muls; 46 operators."""
    t = [_nas_combine(b, x, h, hidden) for _ in range(8)]
    m0 = b.add(b.relu(t[0]), b.sigmoid(t[3]))
    m1 = b.add(b.sigmoid(t[1]), b.tanh(t[2]))
    m2 = b.mul(b.sigmoid(t[4]), b.tanh(t[5]))
    m3 = b.mul(b.sigmoid(t[6]), b.relu(t[7]))
    m4 = b.add(b.sigmoid(m1), b.tanh(m2))
    m5 = b.mul(b.tanh(m0), b.tanh(m3))
    m6 = b.mul(b.tanh(m4), b.tanh(m5))
    y: Value = b.tanh(m6)
    return y


@register("nasrnn", "NasRNN, hidden 512, 5 steps, batch 1 (TASO)", "taso-sosp19",
          hidden=512, steps=5)
def nasrnn(hidden: int = 512, steps: int = 5, seed: int = 0) -> Graph:
    """TASO's NasRNN benchmark (examples/nasrnn.py): `steps` cells over inputs x0.. of shape
    (1, hidden); the output is the final state.

    As in TASO, every cell has its own weights (16 matrices of hidden x hidden; nothing is
    shared across steps) and the initial state is a weight, not an input, so the first
    cell's 8 state matmuls are weight-only (folded into constants at export). At the default
    size the graph has 230 operators, the count the OCGGS paper's Table 2 gives.
    """
    b = GraphBuilder(seed)
    xs = _step_inputs(b, steps, hidden)
    h = b.uniform_weight((1, hidden), -1.0, 1.0)  # like a tanh output
    for x in xs:
        h = _nas_cell(b, x, h, hidden)
    b.output(h, "output")
    return b.build()


def _sru_cell(b: GraphBuilder, x: Value, c: Value, one: Value) -> tuple[Value, Value]:
    """One SRU step (Lei et al. 2017), 16 operators; returns (h, c):

        x~ = x W,  f = sigmoid(x W_f + b_f),  r = sigmoid(x W_r + b_r)
        c  = f * c_prev + (1 - f) * x~
        h  = r * tanh(c) + (1 - r) * x

    The three matmuls read only x, which is what makes SRU parallel (and mergeable).
    """
    hidden = b.shape(c)[-1]
    x_tilde = dense(b, x, hidden)
    f = b.sigmoid(dense(b, x, hidden, bias=True))
    r = b.sigmoid(dense(b, x, hidden, bias=True))
    c = b.add(b.mul(f, c), b.mul(b.sub(one, f), x_tilde))
    h = b.add(b.mul(r, b.tanh(c)), b.mul(b.sub(one, r), x))
    return h, c


@register("sru", "SRU, hidden 1024, 1 step, batch 1 (OCGGS; steps=20 for its script)",
          "ocggs-pvldb20", hidden=1024, steps=1)
def sru(hidden: int = 1024, steps: int = 1, seed: int = 0) -> Graph:
    """The SRU benchmark of the OCGGS paper (PVLDB 2020), with the full SRU cell.

    The paper gives no sizes in its text; its Table 2 lists SRU as "1 block of 1 type, 11
    operators", i.e. one cell, and the authors' script (OCGGS examples/sru.py) uses width
    (EMBED_SIZE) 1024, batch 1 and a --length option defaulting to 20. Hence the defaults
    hidden 1024 and steps 1; `sru:steps=20` is that script's default graph. Their 11-operator
    cell is a simplification (no biases, f * x~ for (1 - f) * x~, r * c for r * tanh(c),
    r * x for (1 - r) * x); this is the real SRU cell (see `_sru_cell`), 16 operators.

    Inputs: x0 .. x{steps-1} of shape (1, hidden) and the initial cell state c0 (an input, as
    in that script). As there, every step has its own weights. The output is the hidden
    state of every step, concatenated: (steps, hidden).
    """
    b = GraphBuilder(seed)
    xs = _step_inputs(b, steps, hidden)
    c = b.input("c0", (1, hidden))
    one = scalar(b, 1.0)
    hs = []
    for x in xs:
        h, c = _sru_cell(b, x, c, one)
        hs.append(h)
    b.output(hs[0] if steps == 1 else b.concat(*hs, axis=0), "output")
    return b.build()
