"""The operator-fission paper's workloads (section 2.3): a softmax subgraph, a linear-attention
subgraph and Segformer, built with the graph builder.

    from graphsub import zoo
    graph = zoo.build("segformer:image=256")

The paper does not print its subgraphs; these are the computations its text describes.
"""

from __future__ import annotations

import math

import numpy as np

from graphsub.ir.builder import GraphBuilder
from graphsub.ir.graph import Graph, Value
from graphsub.zoo import register
from graphsub.zoo.blocks import dense, layer_norm, normal_weight, scalar, split_heads


@register("softmax_subgraph", "softmax(Q K^T / sqrt d) V per head: the fission paper's softmax "
          "subgraph with the MatMul after it (figures 2-3)", "operator-fission", heads=12,
          seq=128, head_dim=64)
def softmax_subgraph(heads: int = 12, seq: int = 128, head_dim: int = 64, seed: int = 0) -> Graph:
    """The attention core: inputs q, k_t and v (heads-first), scores scaled, a softmax along the
    keys, and the MatMul with v that the paper's figure 2 fuses horizontally with the softmax's
    reduction once the reduction is a matmul (section 2.1.2)."""
    b = GraphBuilder(seed)
    q = b.input("q", (heads, seq, head_dim))
    k_t = b.input("k_t", (heads, head_dim, seq))
    v = b.input("v", (heads, seq, head_dim))
    scores = b.smul(b.matmul(q, k_t), scalar(b, 1.0 / math.sqrt(head_dim)))
    b.output(b.matmul(b.softmax(scores, axis=-1), v), "output")
    return b.build()


@register("linear_attention", "efficient (linear) attention with softmax: QKV projections, "
          "softmax(Q) (softmax(K)^T V): the fission paper's linear-attention sub-block",
          "operator-fission", seq=1024, hidden=256, heads=4)
def linear_attention(seq: int = 1024, hidden: int = 256, heads: int = 4, seed: int = 0) -> Graph:
    """The QKV linear-attention sub-block with softmax (Shen et al., "Efficient Attention",
    2021): per head, queries normalized by a softmax over their features, keys by a softmax
    over the sequence, and the keys' summary K^T V (head_dim x head_dim) computed before the
    queries read it, so the cost grows linearly with the sequence. Projections have biases;
    an output projection follows."""
    b = GraphBuilder(seed)
    x = b.input("input", (seq, hidden))
    q = split_heads(b, dense(b, x, hidden, bias=True), heads, (1, 0, 2))    # (h, s, d)
    k_t = split_heads(b, dense(b, x, hidden, bias=True), heads, (1, 2, 0))  # (h, d, s)
    v = split_heads(b, dense(b, x, hidden, bias=True), heads, (1, 0, 2))    # (h, s, d)
    summary = b.matmul(b.softmax(k_t, axis=-1), v)                             # (h, d, d)
    context = b.matmul(b.softmax(q, axis=-1), summary)                         # (h, s, d)
    merged = b.reshape(b.transpose(context, perm=(1, 0, 2)), shape=(seq, hidden))
    b.output(dense(b, merged, hidden, bias=True), "output")
    return b.build()


# ---- Segformer ------------------------------------------------------------------------------

#: MiT-B0, Segformer's smallest encoder: per stage, channels, blocks, heads, the spatial
#: reduction of keys and values, and the patch embedding's kernel and stride.
_MIT_B0 = ((32, 2, 1, 8, 7, 4), (64, 2, 2, 4, 3, 2), (160, 2, 5, 2, 3, 2), (256, 2, 8, 1, 3, 2))


def _tokens(b: GraphBuilder, image: Value) -> Value:
    """(1, C, H, W) -> (H*W, C)."""
    _, c, h, w = b.shape(image)
    tokens: Value = b.transpose(b.reshape(image, shape=(c, h * w)), perm=(1, 0))
    return tokens


def _image(b: GraphBuilder, tokens: Value, h: int, w: int) -> Value:
    """(H*W, C) -> (1, C, H, W)."""
    c = b.shape(tokens)[-1]
    image: Value = b.reshape(b.transpose(tokens, perm=(1, 0)), shape=(1, c, h, w))
    return image


def _conv(b: GraphBuilder, x: Value, out: int, kernel: int, stride: int, groups: int = 1
          ) -> Value:
    """A convolution with bias and symmetric padding kernel // 2, as Segformer's are."""
    c = b.shape(x)[1]
    fan_in = (c // groups) * kernel * kernel
    pad = kernel // 2
    y: Value = b.conv2d(x, normal_weight(b, (out, c // groups, kernel, kernel), fan_in),
                        b.uniform_weight((out,), -0.1, 0.1), stride=stride,
                        padding=(pad, pad, pad, pad))
    return y


def _efficient_attention(b: GraphBuilder, x: Value, h: int, w: int, heads: int,
                         reduction: int) -> Value:
    """Segformer's efficient self-attention: keys and values from the tokens reduced by a
    reduction x reduction convolution of that stride (and a layer norm), so that the score
    matrix is (H*W) x (H*W / reduction^2)."""
    n, c = b.shape(x)
    head_dim = c // heads
    q = split_heads(b, dense(b, x, c, bias=True), heads, (1, 0, 2))
    kv = x
    if reduction > 1:
        reduced = b.conv2d(_image(b, x, h, w),
                           normal_weight(b, (c, c, reduction, reduction), c * reduction ** 2),
                           b.uniform_weight((c,), -0.1, 0.1), stride=reduction,
                           padding="valid")
        kv = layer_norm(b, _tokens(b, reduced), 1e-5)
    k_t = split_heads(b, dense(b, kv, c, bias=True), heads, (1, 2, 0))
    v = split_heads(b, dense(b, kv, c, bias=True), heads, (1, 0, 2))
    scores = b.smul(b.matmul(q, k_t), scalar(b, 1.0 / math.sqrt(head_dim)))
    context = b.matmul(b.softmax(scores, axis=-1), v)
    merged = b.reshape(b.transpose(context, perm=(1, 0, 2)), shape=(n, c))
    return dense(b, merged, c, bias=True)


def _mix_ffn(b: GraphBuilder, x: Value, h: int, w: int) -> Value:
    """Segformer's Mix-FFN: dense to 4C, a 3x3 depthwise convolution (the positional
    information), GELU, dense back to C."""
    c = b.shape(x)[-1]
    inner = dense(b, x, 4 * c, bias=True)
    mixed = _tokens(b, _conv(b, _image(b, inner, h, w), 4 * c, 3, 1, groups=4 * c))
    return dense(b, b.gelu(mixed), c, bias=True)


def _upsample(b: GraphBuilder, image: Value, factor: int) -> Value:
    """Nearest-neighbour upsampling by an integer factor, as a broadcast: (1, C, H, W) ->
    (C, H, 1, W, 1) times ones (1, 1, f, 1, f) -> (1, C, H f, W f)."""
    if factor == 1:
        return image
    _, c, h, w = b.shape(image)
    spread = b.mul(b.reshape(image, shape=(c, h, 1, w, 1)),
                   b.weight(np.ones((1, 1, factor, 1, factor), np.float32)))
    upsampled: Value = b.reshape(spread, shape=(1, c, h * factor, w * factor))
    return upsampled


@register("segformer", "Segformer (MiT-B0 encoder, all-MLP decoder), 512x512, 150 classes: "
          "the fission paper's end-to-end model", "operator-fission", image=512)
def segformer(image: int = 512, seed: int = 0) -> Graph:
    """Segformer-B0 (Xie et al., 2021) for one RGB image, as the fission paper runs it (512 x
    512, ADE20K's 150 classes).

    Encoder (MiT-B0): four stages of overlapping patch embeddings (7x7/4, then 3x3/2
    convolutions with bias, then a layer norm) and two transformer blocks each (pre-norm
    efficient self-attention with spatial reduction 8, 4, 2, 1; pre-norm Mix-FFN with ratio
    4), and a layer norm at each stage's end; widths 32, 64, 160, 256, heads 1, 2, 5, 8.
    Decoder: each stage's tokens projected to 256 (dense with bias), upsampled to a quarter of
    the input size, concatenated, fused by a 1x1 convolution with batch norm and ReLU, and
    classified by a 1x1 convolution. One departure: the upsampling is nearest-neighbour (a
    broadcast), where Segformer's is bilinear; graphsub has no Resize operator yet. The output
    is (1, 150, image / 4, image / 4).
    """
    if image % 32:
        raise ValueError(f"segformer: the image size must be a multiple of 32, got {image}")
    b = GraphBuilder(seed)
    x = b.input("input", (1, 3, image, image))
    features = []
    for width, blocks, heads, reduction, kernel, stride in _MIT_B0:
        x = _conv(b, x, width, kernel, stride)
        _, _, h, w = b.shape(x)
        tokens = layer_norm(b, _tokens(b, x), 1e-5)
        for _ in range(blocks):
            tokens = b.add(tokens, _efficient_attention(b, layer_norm(b, tokens, 1e-6), h, w,
                                                        heads, reduction))
            tokens = b.add(tokens, _mix_ffn(b, layer_norm(b, tokens, 1e-6), h, w))
        tokens = layer_norm(b, tokens, 1e-6)
        x = _image(b, tokens, h, w)
        features.append((tokens, h))
    decoder, quarter = 256, image // 4
    projected = [_upsample(b, _image(b, dense(b, t, decoder, bias=True), h, h), quarter // h)
                 for t, h in features]
    fused = b.conv2d(b.concat(*reversed(projected), axis=1),
                     normal_weight(b, (decoder, 4 * decoder, 1, 1), 4 * decoder),
                     padding="valid")
    fused = b.relu(b.batch_norm(fused, b.uniform_weight((decoder,), 0.8, 1.2),
                                b.uniform_weight((decoder,), -0.1, 0.1),
                                b.uniform_weight((decoder,), -0.1, 0.1),
                                b.uniform_weight((decoder,), 0.5, 1.5)))
    logits = b.conv2d(fused, normal_weight(b, (150, decoder, 1, 1), decoder),
                      b.uniform_weight((150,), -0.1, 0.1), padding="valid")
    b.output(logits, "output")
    return b.build()
