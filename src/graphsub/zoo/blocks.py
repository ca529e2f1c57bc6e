"""The layers the zoo's sequence models are built from (BERT, ViT, the fission paper's
models, the Llama-style decoder): weights scaled so that activations keep about unit variance,
a dense layer, layer normalization, and the reshape-and-transpose that splits heads."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from graphsub.ir.builder import GraphBuilder
from graphsub.ir.graph import Value


def normal_weight(b: GraphBuilder, shape: Sequence[int], fan_in: int) -> Value:
    """A weight with variance 1/fan_in (LeCun normal).

    Unlike He initialization (variance 2/fan_in, right before a ReLU), this keeps a linear
    map's output at the variance of its input, which is what attention logits, sigmoid and
    tanh gates and the residual streams below need to stay in their useful range.
    """
    data = b.rng.standard_normal(tuple(shape), dtype=np.float32)
    return b.weight(data * np.float32(1.0 / math.sqrt(fan_in)))


def scalar(b: GraphBuilder, value: float) -> Value:
    """A 0-d float32 weight: the operand of `smul`, and the 1 in 1 - gate (it broadcasts)."""
    return b.weight(np.array(value, dtype=np.float32))


def dense(b: GraphBuilder, x: Value, units: int, bias: bool = False) -> Value:
    """x @ W (+ b) for x of shape (..., fan_in): one `matmul` node, plus one `add` for a bias.

    Biases are small (uniform in +-0.1) but non-zero, so that a rewrite which drops or
    misplaces one changes the output measurably.
    """
    fan_in = b.shape(x)[-1]
    y: Value = b.matmul(x, normal_weight(b, (fan_in, units), fan_in))
    if bias:
        y = b.add(y, b.uniform_weight((units,), -0.1, 0.1))
    return y


def layer_norm(b: GraphBuilder, x: Value, epsilon: float) -> Value:
    """Layer normalization over the last axis, with a scale near 1 and a small shift (random
    rather than 1 and 0, so that scale and shift are visibly part of the computation)."""
    width = b.shape(x)[-1]
    normed: Value = b.layer_norm(x, b.uniform_weight((width,), 0.8, 1.2),
                                 b.uniform_weight((width,), -0.1, 0.1), axis=-1, epsilon=epsilon)
    return normed


def split_heads(b: GraphBuilder, x: Value, heads: int, perm: tuple[int, int, int]) -> Value:
    """(seq, hidden) -> (seq, heads, head_dim) -> transposed by `perm`.

    perm (1, 0, 2) gives heads-first (heads, seq, head_dim) for queries and values; perm
    (1, 2, 0) gives (heads, head_dim, seq), the transposed keys, in one transpose node.
    """
    seq, hidden = b.shape(x)
    heads_x: Value = b.transpose(b.reshape(x, shape=(seq, heads, hidden // heads)), perm=perm)
    return heads_x
