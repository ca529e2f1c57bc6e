"""NASNet-A as TASO's example builds it (examples/nasnet_a.py).

TASO's stem (7x7/2 convolution, 3x3/2 max pool) brings 224x224 down to 64x56x56; then three
stages of five normal cells and one reduction cell, with 128, 256 and 512 cell channels in the
normal cells (each reduction cell doubles them), so the body ends at 5120x7x7. Separable
convolutions are a depthwise convolution followed by a 1x1, neither with an activation; the
1x1 "squeeze" and "fit" convolutions that adapt a cell's two inputs carry a fused ReLU. As in
every full-size model of the zoo, a global average pool and a fully connected layer to 1000
logits close the model.
"""

from __future__ import annotations

from graphsub.ir.builder import GraphBuilder
from graphsub.ir.graph import Graph, Value
from graphsub.zoo import register
from graphsub.zoo.cnn import IMAGENET_INPUT, KernelSize, classifier, conv, finish, taso_stem

#: Variance damping of the convolutions that feed a cell (see `squeeze`).
CELL_DAMPING = 2


def separable(b: GraphBuilder, x: Value, channels: int, kernel: KernelSize,
              stride: int = 1) -> Value:
    """Depthwise kxk convolution (groups = channels) then a 1x1 pointwise one, both linear.
    The pointwise weight is variance-damped by 2 because every separable branch is added to
    another path."""
    assert b.shape(x)[1] == channels, "TASO's separable convolutions keep the channel count"
    t = conv(b, x, channels, kernel, stride=stride, groups=channels, activation="none")
    return conv(b, t, channels, 1, activation="none", damping=2)


def squeeze(b: GraphBuilder, x: Value, channels: int) -> Value:
    """The 1x1 convolution with ReLU that adapts a cell input to the cell's channel count.
    A cell's output sums two paths per branch, about doubling the variance of its input, so
    these convolutions halve it back (damping 2) to keep a deep stack of cells at unit scale."""
    return conv(b, x, channels, 1, damping=CELL_DAMPING)


def fit(b: GraphBuilder, cur: Value, prev: Value) -> Value:
    """Adapt the previous cell's output to the current one's channels (and size, with a
    strided 3x3 convolution when the spatial sizes differ)."""
    channels = b.shape(cur)[1]
    if b.shape(prev)[2] == b.shape(cur)[2]:
        return squeeze(b, prev, channels)
    return conv(b, prev, channels, 3, stride=2, damping=CELL_DAMPING)


def avg3(b: GraphBuilder, x: Value, stride: int = 1) -> Value:
    """TASO's 3x3 SAME average pool (padding excluded from the count, as in cuDNN's mode)."""
    pooled: Value = b.avg_pool2d(x, kernel=3, stride=stride, padding="same")
    return pooled


def max3(b: GraphBuilder, x: Value, stride: int = 1) -> Value:
    """TASO's 3x3 SAME max pool."""
    pooled: Value = b.max_pool2d(x, kernel=3, stride=stride, padding="same")
    return pooled


def normal_cell(b: GraphBuilder, prev: Value, cur: Value, channels: int) -> Value:
    """Five pairwise sums of separable convolutions, pools and identities of the two inputs,
    concatenated: 5 * channels output channels at the same size."""
    cur = squeeze(b, cur, channels)
    prev = fit(b, cur, prev)
    pairs = ((separable(b, cur, channels, 3), cur),
             (separable(b, prev, channels, 3), separable(b, cur, channels, 3)),
             (avg3(b, cur), prev),
             (avg3(b, prev), avg3(b, prev)),
             (separable(b, prev, channels, 3), separable(b, prev, channels, 3)))
    y: Value = b.concat(*(b.add(left, right) for left, right in pairs), axis=1)
    return y


def reduction_cell(b: GraphBuilder, prev: Value, cur: Value, channels: int) -> Value:
    """Halve the spatial size: strided 7x7/5x5 separable convolutions and pools of the two
    inputs, two further combinations of the first results; 5 * channels output channels."""
    cur = squeeze(b, cur, channels)
    prev = fit(b, cur, prev)
    o0 = b.add(separable(b, prev, channels, 7, 2), separable(b, cur, channels, 5, 2))
    o1 = b.add(max3(b, cur, 2), separable(b, prev, channels, 7, 2))
    o2 = b.add(avg3(b, cur, 2), separable(b, prev, channels, 5, 2))
    o3 = b.add(max3(b, cur, 2), separable(b, o0, channels, 3))
    o4 = b.add(avg3(b, o0), o1)
    y: Value = b.concat(o0, o1, o2, o3, o4, axis=1)
    return y


NORMAL_CELLS = 5
STAGES = 3


@register("nasnet_a", "NASNet-A as in TASO: 3 x (5 normal + 1 reduction) cells, 224x224",
          "taso-sosp19")
def nasnet_a(seed: int = 0) -> Graph:
    """NASNet-A: TASO's stem, 3 stages of 5 normal cells and a reduction cell (18 cells of 2
    types, as OCGGS counts them), then the classifier."""
    b = GraphBuilder(seed)
    x = taso_stem(b, b.input("input", IMAGENET_INPUT))
    channels = 128
    for _ in range(STAGES):
        prev = cur = x
        for _ in range(NORMAL_CELLS):
            prev, cur = cur, normal_cell(b, prev, cur, channels)
        channels *= 2
        x = reduction_cell(b, prev, cur, channels)
    return finish(b, classifier(b, x))
