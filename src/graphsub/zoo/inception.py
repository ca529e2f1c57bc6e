"""Inception-v3 as TASO's example builds it (examples/inceptionv3.py).

No batch normalization and no auxiliary head; every convolution carries a fused ReLU. Padding
follows TASO's rule: a convolution or pool without explicit padding and a kernel larger than
1x1 is VALID, everything else SAME. TASO's average pools exclude the padding from the count
(cuDNN's COUNT_EXCLUDE_PADDING), which is graphsub's default too. TASO ends with a 1x1
"global" average pool (a no-op); here the real global average pool and the 2048 -> 1000
classifier close the model.
"""

from __future__ import annotations

from graphsub.ir.builder import GraphBuilder
from graphsub.ir.graph import Graph, Value
from graphsub.zoo import register
from graphsub.zoo.cnn import classifier, conv, finish, inception_e


def stem(b: GraphBuilder, x: Value) -> Value:
    """3x299x299 -> 192x35x35: five convolutions and two 3x3/2 max pools (all VALID but one)."""
    x = conv(b, x, 32, 3, stride=2, padding="valid")   # 32 x 149 x 149
    x = conv(b, x, 32, 3, padding="valid")             # 32 x 147 x 147
    x = conv(b, x, 64, 3)                              # 64 x 147 x 147
    x = b.max_pool2d(x, kernel=3, stride=2)            # 64 x 73 x 73
    x = conv(b, x, 80, 1)                              # 80 x 73 x 73
    x = conv(b, x, 192, 3, padding="valid")            # 192 x 71 x 71
    x = b.max_pool2d(x, kernel=3, stride=2)            # 192 x 35 x 35
    return x


def avg_pool_same(b: GraphBuilder, x: Value) -> Value:
    """The 3x3/1 SAME average pool of the pooled branches."""
    pooled: Value = b.avg_pool2d(x, kernel=3, stride=1, padding="same")
    return pooled


def inception_a(b: GraphBuilder, x: Value, pool_features: int) -> Value:
    """35x35 block: 1x1, 1x1 -> 5x5, 1x1 -> 3x3 -> 3x3 and pooled 1x1 branches."""
    b1 = conv(b, x, 64, 1)
    b5 = conv(b, conv(b, x, 48, 1), 64, 5)
    b3 = conv(b, conv(b, conv(b, x, 64, 1), 96, 3), 96, 3)
    bp = conv(b, avg_pool_same(b, x), pool_features, 1)
    y: Value = b.concat(b1, b5, b3, bp, axis=1)
    return y


def inception_b(b: GraphBuilder, x: Value) -> Value:
    """Grid reduction 35x35 -> 17x17: strided 3x3, 1x1 -> 3x3 -> strided 3x3, and max pool."""
    b3 = conv(b, x, 384, 3, stride=2, padding="valid")
    bd = conv(b, conv(b, conv(b, x, 64, 1), 96, 3), 96, 3, stride=2, padding="valid")
    bp = b.max_pool2d(x, kernel=3, stride=2)
    y: Value = b.concat(b3, bd, bp, axis=1)
    return y


def inception_c(b: GraphBuilder, x: Value, c7: int) -> Value:
    """17x17 block with factorized 7x7 convolutions (1x7 and 7x1) of c7 channels."""
    b1 = conv(b, x, 192, 1)
    b7 = conv(b, x, c7, 1)
    b7 = conv(b, b7, c7, (1, 7))
    b7 = conv(b, b7, 192, (7, 1))
    bd = conv(b, x, c7, 1)
    for kernel in ((7, 1), (1, 7), (7, 1)):
        bd = conv(b, bd, c7, kernel)
    bd = conv(b, bd, 192, (1, 7))
    bp = conv(b, avg_pool_same(b, x), 192, 1)
    y: Value = b.concat(b1, b7, bd, bp, axis=1)
    return y


def inception_d(b: GraphBuilder, x: Value) -> Value:
    """Grid reduction 17x17 -> 8x8: 1x1 -> strided 3x3, 1x1 -> 1x7 -> 7x1 -> strided 3x3, and
    max pool."""
    b3 = conv(b, conv(b, x, 192, 1), 320, 3, stride=2, padding="valid")
    b7 = conv(b, x, 192, 1)
    b7 = conv(b, b7, 192, (1, 7))
    b7 = conv(b, b7, 192, (7, 1))
    b7 = conv(b, b7, 192, 3, stride=2, padding="valid")
    bp = b.max_pool2d(x, kernel=3, stride=2)
    y: Value = b.concat(b3, b7, bp, axis=1)
    return y


@register("inception_v3", "Inception-v3 as in TASO (no BN, fused ReLU), 299x299, 1000 classes",
          "taso-sosp19")
def inception_v3(seed: int = 0) -> Graph:
    """Inception-v3: stem, 3 InceptionA, InceptionB, 4 InceptionC, InceptionD, 2 InceptionE
    (11 blocks of 5 types, as OCGGS counts them), then the classifier."""
    b = GraphBuilder(seed)
    x = stem(b, b.input("input", (1, 3, 299, 299)))
    for pool_features in (32, 64, 64):
        x = inception_a(b, x, pool_features)
    x = inception_b(b, x)
    for c7 in (128, 160, 160, 192):
        x = inception_c(b, x, c7)
    x = inception_d(b, x)
    for _ in range(2):
        x = inception_e(b, x)
    return finish(b, classifier(b, x))
