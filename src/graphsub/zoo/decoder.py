"""A Llama-style decoder as the dynamo exporter writes transformers' LlamaModel.

This is the kind of model people deploy, and the one where graphsub's rewrites pay on
onnxruntime's CPU provider (bench/RESULTS.md, "llama seq 512"). It is written node for node
as graphsub imports `torch.onnx.export(LlamaModel(...), dynamo=True)` (transformers 5.24,
torch 2.13: opset 20; no attention-mask input, `use_cache=False`), so that the zoo shows what
graphsub does with such an export without needing torch or transformers to make one:

- RMSNorm as primitives: Pow 2, ReduceMean, Add eps, Sqrt, Reciprocal, Mul, Mul by the weight;
- rotary position embeddings: q * cos + concat(-q[..., d/2:], q[..., :d/2]) * sin;
- grouped-query attention: key/value heads repeated by repeat_kv's Unsqueeze, Expand, Reshape
  (Expand is an ONNX op graphsub does not model: an opaque node, as in an import);
- scaled dot-product attention decomposed as the exporter does it: both operands scaled by the
  square root of the scale, keys transposed through a rank-3 reshape, the constant causal mask
  added, and the softmax guarded against fully masked rows (`guarded_softmax`);
- a SwiGLU MLP (gate and up projections, x * sigmoid(x), product, down projection);
- pre-norm residual blocks and a final RMSNorm.

    from graphsub import zoo
    graph = zoo.build("llama:layers=1,seq=64")
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx

from graphsub.ir.builder import GraphBuilder
from graphsub.ir.graph import Graph, Value
from graphsub.tensors.types import TensorType
from graphsub.onnx_io import DEFAULT_OPSET
from graphsub.zoo import register
from graphsub.zoo.blocks import dense, scalar

#: Llama's defaults: RMSNorm epsilon and the rotary base (rope_theta).
EPSILON = 1e-6
ROPE_THETA = 10000.0


@dataclass(frozen=True)
class _Shared:
    """The constants every layer reads: the exporter writes each once (one initializer, or one
    chain of nodes, read by every layer), and so does the zoo."""

    two: Value  # the exponent of RMSNorm's Pow
    eps: Value
    cos: Value  # rotary tables, (1, 1, seq, head_dim)
    sin: Value
    mask: Value  # the additive causal mask, (1, 1, seq, seq)
    root_scale: Value  # sqrt(1 / sqrt(head_dim)): the exporter scales q and k by it each
    repeat_shape: Value  # Expand's target shape in repeat_kv, int64 (1, kv, groups, seq, d)


def _rms_norm(b: GraphBuilder, x: Value, c: _Shared) -> Value:
    """transformers' LlamaRMSNorm as exported: x * rsqrt(mean(x^2) + eps), times the weight.

    The weight is drawn near 1 rather than set to 1, so that a rewrite which drops or
    misplaces it changes the output measurably.
    """
    width = b.shape(x)[-1]
    last = len(b.shape(x)) - 1
    mean = b.reduce_mean(b.pow(x, c.two), axes=(last,), keepdims=True)
    normed = b.mul(x, b.reciprocal(b.sqrt(b.add(mean, c.eps))))
    y: Value = b.mul(b.uniform_weight((width,), 0.8, 1.2), normed)
    return y


def _heads(b: GraphBuilder, x: Value, heads: int) -> Value:
    """(1, seq, heads * d) -> (1, heads, seq, d): view, then transpose(1, 2)."""
    _, seq, width = b.shape(x)
    y: Value = b.transpose(b.reshape(x, shape=(1, seq, heads, width // heads)), perm=(0, 2, 1, 3))
    return y


def _rotate(b: GraphBuilder, x: Value, c: _Shared) -> Value:
    """apply_rotary_pos_emb for one of q, k: x * cos + rotate_half(x) * sin, where
    rotate_half(x) = concat(-x[..., d/2:], x[..., :d/2])."""
    d = b.shape(x)[-1]
    first = b.slice(x, starts=(0,), ends=(d // 2,), axes=(3,), steps=(1,))
    second = b.slice(x, starts=(d // 2,), ends=(d,), axes=(3,), steps=(1,))
    rotated = b.concat(b.neg(second), first, axis=3)
    y: Value = b.add(b.mul(x, c.cos), b.mul(rotated, c.sin))
    return y


def _repeat_kv(b: GraphBuilder, x: Value, c: _Shared) -> Value:
    """transformers' repeat_kv: (1, kv, seq, d) -> (1, kv, groups, seq, d) by Unsqueeze and
    Expand, each key/value head read by `groups` query heads. Expand is an ONNX op graphsub
    does not model: an opaque node, exactly what importing the export gives (kept, evaluated
    by onnxruntime, exported unchanged)."""
    shape = tuple(b.node(c.repeat_shape.node).attrs["value"].array.tolist())
    expanded = TensorType(shape, b.type_of(x).dtype)
    node = onnx.helper.make_node("Expand", ["input", "shape"], ["output"], name="repeat_kv")
    y: Value = b.opaque(b.unsqueeze(x, axes=(2,)), c.repeat_shape,
                        onnx_node=node.SerializeToString(), opsets=(("", DEFAULT_OPSET),),
                        output_types=(expanded,), input_slots=(0, 1), op_type="Expand")
    return y


def _attention(b: GraphBuilder, x: Value, heads: int, kv_heads: int, c: _Shared) -> Value:
    """Grouped-query self-attention of x (1, seq, hidden), with the exporter's decomposition
    of scaled_dot_product_attention (see the module docstring)."""
    _, seq, hidden = b.shape(x)
    d = hidden // heads
    q = _rotate(b, _heads(b, dense(b, x, hidden), heads), c)
    k = _rotate(b, _heads(b, dense(b, x, kv_heads * d), kv_heads), c)
    v = _heads(b, dense(b, x, kv_heads * d), kv_heads)
    keys = b.reshape(_repeat_kv(b, k, c), shape=(heads, seq, d))
    k_t = b.reshape(b.transpose(keys, perm=(0, 2, 1)), shape=(1, heads, d, seq))
    values = b.reshape(_repeat_kv(b, v, c), shape=(1, heads, seq, d))
    scores = b.matmul(b.smul(q, c.root_scale), b.smul(k_t, c.root_scale))
    probs = b.guarded_softmax(b.add(scores, c.mask), axis=3)
    context = b.transpose(b.matmul(probs, values), perm=(0, 2, 1, 3))
    return dense(b, b.reshape(context, shape=(1, seq, hidden)), hidden)


def _mlp(b: GraphBuilder, x: Value, inner: int) -> Value:
    """LlamaMLP: down(silu(gate(x)) * up(x)), silu exported as x * Sigmoid(x)."""
    gate = dense(b, x, inner)
    up = dense(b, x, inner)
    return dense(b, b.mul(b.mul(gate, b.sigmoid(gate)), up), b.shape(x)[-1])


def _rotary_tables(seq: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    """LlamaRotaryEmbedding's cos and sin for positions 0..seq-1, (1, seq, d): frequencies
    theta^(-2i/d), each used for two channels (the halves rotate_half pairs)."""
    inv_freq = ROPE_THETA ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    angles = np.outer(np.arange(seq, dtype=np.float64), inv_freq)
    emb = np.concatenate([angles, angles], axis=-1)[None]
    return np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32)


def _causal_mask(seq: int) -> np.ndarray:
    """The exporter's additive mask (1, 1, seq, seq): 0 where query i may read key j <= i,
    float32's lowest value elsewhere (transformers' min_dtype, not -inf)."""
    lowest = np.finfo(np.float32).min
    return np.triu(np.full((seq, seq), lowest, dtype=np.float32), k=1)[None, None]


def _shared(b: GraphBuilder, seq: int, heads: int, kv_heads: int, d: int) -> _Shared:
    cos, sin = _rotary_tables(seq, d)
    return _Shared(two=scalar(b, 2.0), eps=scalar(b, EPSILON),
                   cos=b.unsqueeze(b.weight(cos), axes=(1,)),
                   sin=b.unsqueeze(b.weight(sin), axes=(1,)),
                   mask=b.weight(_causal_mask(seq)),
                   root_scale=scalar(b, math.sqrt(1.0 / math.sqrt(d))),
                   repeat_shape=b.weight(np.array((1, kv_heads, heads // kv_heads, seq, d),
                                                  dtype=np.int64)))


@register("llama", "Llama-style decoder as transformers exports it: 2 layers, seq 512, hidden "
          "256, grouped-query attention (8 query, 2 key/value heads), rotary, causal mask, "
          "SwiGLU", "transformers LlamaModel (dynamo export)",
          layers=2, seq=512, hidden=256, heads=8, kv_heads=2, mlp=704)
def llama(layers: int = 2, seq: int = 512, hidden: int = 256, heads: int = 8, kv_heads: int = 2,
          mlp: int = 704, seed: int = 0) -> Graph:
    """A LlamaModel without its embedding: the input is the embedded tokens (inputs_embeds,
    (1, seq, hidden)), the output the final normalized hidden states (last_hidden_state).

    The defaults make a small model at a long sequence (MLP width 2.75 x hidden, as Llama's
    11008 / 4096): there attention's seq x seq score passes are a large share of the time.
    """
    if hidden % heads or heads % kv_heads:
        raise ValueError(f"llama: hidden {hidden} must be a multiple of heads {heads}, and "
                         f"heads a multiple of kv_heads {kv_heads}")
    b = GraphBuilder(seed)
    x = b.input("inputs_embeds", (1, seq, hidden))
    c = _shared(b, seq, heads, kv_heads, hidden // heads)
    for _ in range(layers):
        x = b.add(x, _attention(b, _rms_norm(b, x, c), heads, kv_heads, c))
        x = b.add(x, _mlp(b, _rms_norm(b, x, c), mlp))
    b.output(_rms_norm(b, x, c), "last_hidden_state")
    return b.build()
