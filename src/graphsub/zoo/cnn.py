"""Convolutional benchmark models: ResNet-50, ResNeXt-50, VGG-19, SqueezeNet 1.1, MobileNetV2
and the two block families of the OCGGS scaling experiment (ResNet blocks, InceptionE blocks).

ResNet-50 and ResNeXt-50 follow TASO's examples (examples/resnet50.py, examples/resnext50.py):
no batch normalization, ReLU fused into the convolutions, SAME padding everywhere, and ReLU
also on the projection shortcuts. An ImageNet classifier (global average pool, fully
connected layer to 1000 logits) closes every full-size model, so all of them answer 1x1000.
The OCGGS block families follow that paper's experiment scripts (Experiment-code/OCGGS,
examples/resnet.py and examples/inceptionv3E.py).

This module also holds the layer helpers that inception.py and nasnet.py share.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from graphsub.ir.builder import GraphBuilder
from graphsub.ir.graph import Graph, Value
from graphsub.zoo import register

KernelSize = int | tuple[int, int]
Padding = str | int | tuple[int, int, int, int]

IMAGENET_INPUT = (1, 3, 224, 224)
IMAGENET_CLASSES = 1000

#: Residual-branch tails are scaled down by this factor (in variance) so that a deep stack of
#: un-normalized residual additions keeps its activations near unit scale.
RESIDUAL_DAMPING = 8


# ---- layer helpers ----------------------------------------------------------------------------

def _pair(k: KernelSize) -> tuple[int, int]:
    return (k, k) if isinstance(k, int) else (int(k[0]), int(k[1]))


def init_weight(b: GraphBuilder, shape: Sequence[int], fan_in: int, relu: bool,
                damping: int = 1) -> Value:
    """A random weight whose scale keeps activations near unit variance: He scaling when a
    ReLU follows, half of its variance (LeCun) before anything linear; `damping` divides the
    variance further (residual branches, where several paths add up)."""
    return b.he_weight(shape, fan_in=fan_in * (1 if relu else 2) * damping)


def conv(b: GraphBuilder, x: Value, cout: int, kernel: KernelSize = 1, stride: int = 1,
         padding: Padding = "same", activation: str = "relu", groups: int = 1,
         bias: bool = False, damping: int = 1, relu_follows: bool | None = None) -> Value:
    """One convolution with a fresh weight (and bias): the building block of every model here.
    The group count goes into the weight shape (Cout, Cin/groups, kh, kw), as graphsub infers it.
    `relu_follows` picks the weight scale when a ReLU-like op comes later as a separate node."""
    cin = b.shape(x)[1]
    kh, kw = _pair(kernel)
    fan_in = cin // groups * kh * kw
    relu = activation == "relu" if relu_follows is None else relu_follows
    w = init_weight(b, (cout, cin // groups, kh, kw), fan_in, relu, damping)
    inputs = [x, w] + ([b.uniform_weight((cout,))] if bias else [])
    y: Value = b.conv2d(*inputs, stride=stride, padding=padding, activation=activation)
    return y


def sym_pad(kernel: KernelSize) -> tuple[int, int, int, int]:
    """Symmetric padding of k//2 on each side, as PyTorch writes the standard models (SAME
    padding would put the odd pixel at the end on strided layers)."""
    kh, kw = _pair(kernel)
    return (kh // 2, kw // 2, kh // 2, kw // 2)


def batch_norm(b: GraphBuilder, x: Value) -> Value:
    """Inference batch normalization with random but well-conditioned statistics (scale near 1,
    variance in [0.5, 1.5]) so it changes the scale of activations only mildly."""
    c = b.shape(x)[1]
    scale = b.uniform_weight((c,), 0.8, 1.2)
    shift = b.uniform_weight((c,), -0.1, 0.1)
    mean = b.uniform_weight((c,), -0.1, 0.1)
    var = b.uniform_weight((c,), 0.5, 1.5)
    y: Value = b.batch_norm(x, scale, shift, mean, var)
    return y


def fc(b: GraphBuilder, x: Value, cout: int, activation: str = "none") -> Value:
    """A fully connected layer on (N, Cin): matmul by a (Cin, Cout) weight plus a bias, then
    the activation (a separate node, since it must come after the bias)."""
    cin = b.shape(x)[-1]
    y: Value = b.matmul(x, init_weight(b, (cin, cout), cin, activation == "relu"))
    y = b.add(y, b.uniform_weight((cout,)))
    return b.relu(y) if activation == "relu" else y


def classifier(b: GraphBuilder, x: Value, classes: int = IMAGENET_CLASSES) -> Value:
    """The ImageNet head: global average pool, flatten, one fully connected layer to logits."""
    return fc(b, b.flatten(b.global_avg_pool(x), axis=1), classes)


def taso_stem(b: GraphBuilder, x: Value, width: int = 64) -> Value:
    """TASO's ResNeXt/NASNet stem: 7x7/2 convolution with ReLU, then 3x3/2 max pool (SAME),
    224x224 -> 56x56."""
    x = conv(b, x, width, 7, stride=2)
    x = b.max_pool2d(x, kernel=3, stride=2, padding="same")
    return x


def finish(b: GraphBuilder, y: Value) -> Graph:
    """Name the output and build the graph."""
    b.output(y, "output")
    return b.build()


# ---- ResNet-50 / ResNeXt-50 -------------------------------------------------------------------

def bottleneck(b: GraphBuilder, x: Value, width: int, stride: int, expansion: int,
               groups: int = 1) -> Value:
    """TASO's bottleneck block: 1x1 -> 3x3 (grouped for ResNeXt, strided on the first block of
    a stage) -> 1x1 to width*expansion channels; a 1x1 projection (with ReLU, as TASO writes it)
    replaces the identity shortcut where the shape changes; ReLU after the addition."""
    cout = width * expansion
    t = conv(b, x, width, 1)
    t = conv(b, t, width, 3, stride=stride, groups=groups)
    t = conv(b, t, cout, 1, activation="none", damping=RESIDUAL_DAMPING)
    if stride > 1 or b.shape(x)[1] != cout:
        x = conv(b, x, cout, 1, stride=stride)
    y: Value = b.relu(b.add(x, t))
    return y


BlockFn = Callable[[GraphBuilder, Value, int, int], Value]


def residual_stages(b: GraphBuilder, x: Value, widths: Sequence[int], depths: Sequence[int],
                    block: BlockFn) -> Value:
    """Stack the stages of a ResNet-like body; every stage but the first halves the spatial
    size in its first block."""
    for stage, (width, depth) in enumerate(zip(widths, depths)):
        for i in range(depth):
            x = block(b, x, width, 2 if stage > 0 and i == 0 else 1)
    return x


RESNET50_DEPTHS = (3, 4, 6, 3)


@register("resnet50", "ResNet-50 as in TASO (no BN, fused ReLU), 224x224, 1000 classes",
          "taso-sosp19")
def resnet50(seed: int = 0) -> Graph:
    """ResNet-50: 16 bottleneck blocks of widths 64..512 (expansion 4). TASO's resnet50.py
    starts from a 64x56x56 input; the stem of its ResNeXt-50 (the standard ResNet stem) brings
    224x224 images there, and the classifier closes the model: 53 convolutions in all."""
    b = GraphBuilder(seed)
    x = taso_stem(b, b.input("input", IMAGENET_INPUT))
    x = residual_stages(b, x, (64, 128, 256, 512), RESNET50_DEPTHS,
                        lambda b, x, w, s: bottleneck(b, x, w, s, expansion=4))
    return finish(b, classifier(b, x))


@register("resnext50", "ResNeXt-50 32x4d as in TASO (no BN, fused ReLU), 224x224, 1000 classes",
          "taso-sosp19")
def resnext50(seed: int = 0) -> Graph:
    """ResNeXt-50 (32x4d): the ResNet-50 layout with 32-group 3x3 convolutions of widths
    128..1024 and expansion 2, as TASO's example builds it."""
    b = GraphBuilder(seed)
    x = taso_stem(b, b.input("input", IMAGENET_INPUT))
    x = residual_stages(b, x, (128, 256, 512, 1024), RESNET50_DEPTHS,
                        lambda b, x, w, s: bottleneck(b, x, w, s, expansion=2, groups=32))
    return finish(b, classifier(b, x))


# ---- VGG-19 -----------------------------------------------------------------------------------

VGG19_STAGES = ((64, 2), (128, 2), (256, 4), (512, 4), (512, 4))


@register("vgg19", "VGG-19: 16 3x3 convolutions and 3 fully connected layers, 224x224",
          "simonyan-iclr15")
def vgg19(seed: int = 0) -> Graph:
    """VGG-19 (configuration E): five stages of 3x3 convolutions with bias and ReLU, each
    closed by a 2x2 max pool, then FC 25088 -> 4096 -> 4096 -> 1000 (dropout is the identity
    at inference and is left out)."""
    b = GraphBuilder(seed)
    x = b.input("input", IMAGENET_INPUT)
    for width, depth in VGG19_STAGES:
        for _ in range(depth):
            x = conv(b, x, width, 3, padding=sym_pad(3), bias=True)
        x = b.max_pool2d(x, kernel=2, stride=2)
    x = b.flatten(x, axis=1)
    x = fc(b, x, 4096, activation="relu")
    x = fc(b, x, 4096, activation="relu")
    return finish(b, fc(b, x, IMAGENET_CLASSES))


# ---- SqueezeNet 1.1 ---------------------------------------------------------------------------

def fire(b: GraphBuilder, x: Value, squeeze: int, expand: int) -> Value:
    """SqueezeNet's fire module: a 1x1 squeeze, then 1x1 and 3x3 expansions side by side,
    concatenated along channels (all with bias and ReLU)."""
    s = conv(b, x, squeeze, 1, bias=True)
    e1 = conv(b, s, expand, 1, bias=True)
    e3 = conv(b, s, expand, 3, padding=sym_pad(3), bias=True)
    y: Value = b.concat(e1, e3, axis=1)
    return y


#: (squeeze, expand) of each fire module; None marks a 3x3/2 max pool.
SQUEEZENET11_LAYOUT: tuple[tuple[int, int] | None, ...] = (
    None, (16, 64), (16, 64), None, (32, 128), (32, 128), None,
    (48, 192), (48, 192), (64, 256), (64, 256))


@register("squeezenet", "SqueezeNet 1.1, 224x224, 1000 classes", "iandola-2016")
def squeezenet(seed: int = 0) -> Graph:
    """SqueezeNet 1.1: a 3x3/2 stem, eight fire modules between three max pools, and a 1x1
    convolution to 1000 classes with ReLU, global-average-pooled into the logits."""
    b = GraphBuilder(seed)
    x = conv(b, b.input("input", IMAGENET_INPUT), 64, 3, stride=2, padding="valid", bias=True)
    for layer in SQUEEZENET11_LAYOUT:
        x = (b.max_pool2d(x, kernel=3, stride=2) if layer is None
             else fire(b, x, *layer))
    x = conv(b, x, IMAGENET_CLASSES, 1, bias=True)
    return finish(b, b.flatten(b.global_avg_pool(x), axis=1))


# ---- MobileNetV2 ------------------------------------------------------------------------------

def conv_bn(b: GraphBuilder, x: Value, cout: int, kernel: KernelSize = 1, stride: int = 1,
            groups: int = 1, relu6: bool = True, damping: int = 1) -> Value:
    """MobileNetV2's unit: convolution without bias, batch norm, then ReLU6 as clip(0, 6)
    (or nothing, for the linear bottleneck projections)."""
    # He scaling suits ReLU6 too: the clip at 6 rarely bites at unit-scale activations.
    y = conv(b, x, cout, kernel, stride=stride, padding=sym_pad(kernel), groups=groups,
             activation="none", damping=damping, relu_follows=relu6)
    y = batch_norm(b, y)
    return b.clip(y, min=0.0, max=6.0) if relu6 else y


def inverted_residual(b: GraphBuilder, x: Value, cout: int, stride: int, expand: int) -> Value:
    """MobileNetV2's block: 1x1 expansion (skipped when the factor is 1), 3x3 depthwise,
    linear 1x1 projection; the input is added back when stride and channels allow."""
    cin = b.shape(x)[1]
    hidden = cin * expand
    t = conv_bn(b, x, hidden, 1) if expand != 1 else x
    t = conv_bn(b, t, hidden, 3, stride=stride, groups=hidden)
    residual = stride == 1 and cin == cout
    t = conv_bn(b, t, cout, 1, relu6=False, damping=RESIDUAL_DAMPING if residual else 1)
    return b.add(x, t) if residual else t


#: (expansion t, channels c, repeats n, first stride s), from the MobileNetV2 paper's Table 2.
MOBILENET_V2_SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                         (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))


@register("mobilenet_v2", "MobileNetV2 (width 1.0) with batch norm and ReLU6, 224x224",
          "sandler-cvpr18")
def mobilenet_v2(seed: int = 0) -> Graph:
    """MobileNetV2 1.0: 3x3/2 stem to 32 channels, 17 inverted residual blocks, a 1x1
    convolution to 1280 channels, and the classifier (its dropout is the identity here)."""
    b = GraphBuilder(seed)
    x = conv_bn(b, b.input("input", IMAGENET_INPUT), 32, 3, stride=2)
    for t, c, n, s in MOBILENET_V2_SETTINGS:
        for i in range(n):
            x = inverted_residual(b, x, c, s if i == 0 else 1, t)
    x = conv_bn(b, x, 1280, 1)
    return finish(b, classifier(b, x))


# ---- OCGGS scaling families -------------------------------------------------------------------

def ocggs_resnet_block(b: GraphBuilder, x: Value) -> Value:
    """The OCGGS ResNet block (5 operators): 3x3 conv with ReLU, 3x3 conv, a 1x1 projection
    shortcut with ReLU (present even though shapes match), add, ReLU; channels unchanged."""
    c = b.shape(x)[1]
    t = conv(b, x, c, 3)
    t = conv(b, t, c, 3, activation="none", damping=2)
    shortcut = conv(b, x, c, 1, damping=2)
    y: Value = b.relu(b.add(shortcut, t))
    return y


@register("resnet_blocks", "n ResNet blocks on 1x256x14x14 (OCGGS scaling family)",
          "ocggs-pvldb20", n=4)
def resnet_blocks(n: int = 4, seed: int = 0) -> Graph:
    """OCGGS's ResNet scaling model: n identical-shape 5-operator ResNet blocks (256 channels,
    14x14), the paper's 'ResNet' benchmark at n=8."""
    b = GraphBuilder(seed)
    x = b.input("input", (1, 256, 14, 14))
    for _ in range(n):
        x = ocggs_resnet_block(b, x)
    return finish(b, x)


def inception_e(b: GraphBuilder, x: Value, pool: str = "avg", nested: bool = False) -> Value:
    """Inception-v3's InceptionE block (8x8, 2048 output channels): a 1x1 branch, a 1x1 branch
    split into 1x3 and 3x1, a 1x1 -> 3x3 branch split the same way, and a pooled 1x1 branch.
    TASO writes it with an average pool and one six-way concat; OCGGS (`pool='max'`,
    `nested=True`) concatenates each split pair first, giving 13 operators."""
    def split_pair(t: Value) -> list[Value]:
        pair = [conv(b, t, 384, (1, 3)), conv(b, t, 384, (3, 1))]
        return [b.concat(*pair, axis=1)] if nested else pair

    branch1 = conv(b, x, 320, 1)
    branch3 = split_pair(conv(b, x, 384, 1))
    branch3dbl = split_pair(conv(b, conv(b, x, 448, 1), 384, 3))
    pool_fn = b.max_pool2d if pool == "max" else b.avg_pool2d
    branch_pool = conv(b, pool_fn(x, kernel=3, stride=1, padding="same"), 192, 1)
    y: Value = b.concat(branch1, *branch3, *branch3dbl, branch_pool, axis=1)
    return y


@register("inception_e_blocks", "n InceptionE blocks on 1x1280x8x8 (OCGGS scaling family)",
          "ocggs-pvldb20", n=2)
def inception_e_blocks(n: int = 2, seed: int = 0) -> Graph:
    """OCGGS's InceptionE scaling model: n 13-operator InceptionE blocks in a chain; the first
    takes 1280 channels, the rest the 2048 each block puts out."""
    b = GraphBuilder(seed)
    x = b.input("input", (1, 1280, 8, 8))
    for _ in range(n):
        x = inception_e(b, x, pool="max", nested=True)
    return finish(b, x)
