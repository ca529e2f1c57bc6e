"""Structure of the convolutional models of the zoo: resnet50, resnext50, vgg19, squeezenet,
mobilenet_v2, inception_v3, nasnet_a and the OCGGS block families resnet_blocks and
inception_e_blocks.

Each model is built once per module. The checks are architectural: output shapes, operator
and convolution counts, parameter counts against the published architectures, grouped and
depthwise convolutions, the shapes between blocks, and that block families scale linearly in
their block count. ONNX round trips of every zoo model live in another test file.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from graphsub import zoo
from graphsub.ir.graph import Graph, Node

IMAGENET_MODELS = ("resnet50", "resnext50", "vgg19", "squeezenet", "mobilenet_v2",
                   "inception_v3", "nasnet_a")
CNN_MODELS = IMAGENET_MODELS + ("resnet_blocks", "inception_e_blocks")

Build = Callable[[str], Graph]


@pytest.fixture(scope="module")
def build() -> Iterator[Build]:
    """Build each spec at most once in this module (the large models take seconds), and drop
    them all when the module is done (VGG-19 alone holds 575 MB of weights)."""
    cache: dict[str, Graph] = {}

    def get(spec: str) -> Graph:
        if spec not in cache:
            cache[spec] = zoo.build(spec)
        return cache[spec]

    yield get
    cache.clear()


def case(name: str, *values: Any) -> Any:
    """A parameter set; VGG-19's are marked slow (it builds 144M random weights)."""
    return pytest.param(name, *values, marks=pytest.mark.slow if name == "vgg19" else ())


def ops(g: Graph) -> Counter[str]:
    """Operator counts, without graph inputs and weights."""
    return Counter(n.op for n in g.nodes.values() if n.op not in ("input", "weight"))


def params(g: Graph) -> int:
    return sum(n.type.numel for n in g.nodes.values() if n.op == "weight")


def convs(g: Graph) -> list[Node]:
    return [g[nid] for nid in g.nodes_by_op("conv2d")]


def in_channels(g: Graph, node: Node) -> int:
    return g.type_of(node.inputs[0]).shape[1]


def weight_shape(g: Graph, node: Node) -> tuple[int, ...]:
    return g.type_of(node.inputs[1]).shape


def groups(g: Graph, node: Node) -> int:
    return in_channels(g, node) // weight_shape(g, node)[1]


def output_shape(g: Graph) -> tuple[int, ...]:
    assert g.output_names == ("output",)
    return g.type_of(g.outputs[0]).shape


def shapes_of(g: Graph, op: str, rank: int = 4) -> list[tuple[int, ...]]:
    """Output shapes (without the batch dimension) of every `op` node, in topological order."""
    return [g[nid].type.shape[1:] for nid in g.nodes_by_op(op) if g[nid].type.rank == rank]


# ---- every model -----------------------------------------------------------------------------

def test_all_registered() -> None:
    by_name = {m.name: m for m in zoo.models()}
    for name in CNN_MODELS:
        assert name in by_name
    assert by_name["resnet_blocks"].params == {"n": 4}
    assert by_name["inception_e_blocks"].params == {"n": 2}


@pytest.mark.parametrize("name, input_shape, out", [
    *[case(n, (1, 3, 224, 224), (1, 1000)) for n in IMAGENET_MODELS if n != "inception_v3"],
    case("inception_v3", (1, 3, 299, 299), (1, 1000)),
    case("resnet_blocks", (1, 256, 14, 14), (1, 256, 14, 14)),
    case("inception_e_blocks", (1, 1280, 8, 8), (1, 2048, 8, 8)),
])
def test_interface(build: Build, name: str, input_shape: tuple[int, ...],
                   out: tuple[int, ...]) -> None:
    g = build(name)
    assert g.input_names == ("input",)
    assert g[g.inputs[0]].type.shape == input_shape
    assert output_shape(g) == out


# Convolution counts of each architecture, as built here:
#   resnet50/resnext50: stem + 16 blocks x 3 + 4 projection shortcuts = 53
#   vgg19: 16; squeezenet 1.1: stem + 8 fire x 3 + final 1x1 = 26
#   mobilenet_v2: stem + 2 (first block, no expansion) + 16 x 3 + last 1x1 = 52
#   inception_v3: stem 5 + A 3x7 + B 4 + C 4x10 + D 6 + E 2x9 = 94
#   nasnet_a: stem + 18 cells x (squeeze + fit + 5 separable x 2) = 217
#   resnet_blocks (n=4): 3 per block; inception_e_blocks (n=2): 9 per block
@pytest.mark.parametrize("name, count", [
    case("resnet50", 53), case("resnext50", 53), case("vgg19", 16), case("squeezenet", 26),
    case("mobilenet_v2", 52), case("inception_v3", 94), case("nasnet_a", 217),
    case("resnet_blocks", 12), case("inception_e_blocks", 18),
])
def test_conv_count(build: Build, name: str, count: int) -> None:
    assert len(convs(build(name))) == count


# Parameters against the reference implementations (torchvision), whose counts include batch
# norm: TASO-style models have none (subtract 2 x the BN channels), mobilenet_v2 keeps BN and
# counts its running mean and variance as weights too (add 2 x the BN channels).
@pytest.mark.parametrize("name, count", [
    case("resnet50", 25_557_032 - 2 * 26_560),
    case("resnext50", 25_028_904 - 2 * 34_112),
    case("vgg19", 143_667_240),
    case("squeezenet", 1_235_496),
    case("mobilenet_v2", 3_504_872 + 2 * 17_056),
    case("inception_v3", 23_834_568 - 2 * 17_216),  # torchvision without the auxiliary head
])
def test_parameter_count(build: Build, name: str, count: int) -> None:
    assert params(build(name)) == count


@pytest.mark.parametrize("name", ["resnet50", "resnext50", "inception_v3", "nasnet_a",
                                  "resnet_blocks", "inception_e_blocks"])
def test_taso_style_has_no_batch_norm(build: Build, name: str) -> None:
    """TASO's models fuse ReLU into the convolutions and have no normalization."""
    counts = ops(build(name))
    assert counts["batch_norm"] == 0 and counts["clip"] == 0
    assert counts["conv2d"] > 0


# ---- ResNet-50 / ResNeXt-50 ----------------------------------------------------------------

@pytest.mark.parametrize("name", ["resnet50", "resnext50"])
def test_resnet_stages(build: Build, name: str) -> None:
    """16 residual additions in stages of 3, 4, 6, 3 blocks at 56, 28, 14, 7 pixels, 4 of them
    with a projection shortcut (a 1x1 convolution read by the add, beside the branch's)."""
    g = build(name)
    stages = Counter(shape for shape in shapes_of(g, "add"))
    assert stages == {(256, 56, 56): 3, (512, 28, 28): 4, (1024, 14, 14): 6, (2048, 7, 7): 3}
    projections = [nid for nid in g.nodes_by_op("add")
                   if all(g[v.node].op == "conv2d" for v in g[nid].inputs)]
    assert len(projections) == 4
    linear = [c for c in convs(g) if c.attrs["activation"] == "none"]
    assert len(linear) == 16  # only each branch's last 1x1 convolution lacks a fused ReLU


def test_resnext_grouped_convolutions(build: Build) -> None:
    g = build("resnext50")
    grouped = [c for c in convs(g) if groups(g, c) > 1]
    assert len(grouped) == 16
    assert {groups(g, c) for c in grouped} == {32}
    assert {weight_shape(g, c)[2:] for c in grouped} == {(3, 3)}
    assert sorted({in_channels(g, c) for c in grouped}) == [128, 256, 512, 1024]
    plain = build("resnet50")
    assert all(groups(plain, c) == 1 for c in convs(plain))


# ---- VGG-19, SqueezeNet, MobileNetV2 -------------------------------------------------------

@pytest.mark.slow
def test_vgg19_layout(build: Build) -> None:
    g = build("vgg19")
    assert [weight_shape(g, c)[0] for c in convs(g)] == [64] * 2 + [128] * 2 + [256] * 4 + [512] * 8
    assert all(len(c.inputs) == 3 and c.attrs["activation"] == "relu" for c in convs(g))
    assert shapes_of(g, "max_pool2d") == [(64, 112, 112), (128, 56, 56), (256, 28, 28),
                                          (512, 14, 14), (512, 7, 7)]
    assert [g.type_of(g[n].inputs[1]).shape for n in g.nodes_by_op("matmul")] == [
        (25088, 4096), (4096, 4096), (4096, 1000)]


def test_squeezenet_fire_modules(build: Build) -> None:
    g = build("squeezenet")
    assert shapes_of(g, "concat") == [(128, 55, 55)] * 2 + [(256, 27, 27)] * 2 + [
        (384, 13, 13)] * 2 + [(512, 13, 13)] * 2
    assert ops(g)["max_pool2d"] == 3 and ops(g)["global_avg_pool"] == 1


def test_mobilenet_v2_layout(build: Build) -> None:
    g = build("mobilenet_v2")
    counts = ops(g)
    assert counts["batch_norm"] == 52  # one per convolution
    clips = [g[n] for n in g.nodes_by_op("clip")]
    assert len(clips) == 52 - 17  # ReLU6 everywhere but the 17 linear projections
    assert {(c.attrs["min"], c.attrs["max"]) for c in clips} == {(0.0, 6.0)}
    depthwise = [c for c in convs(g) if groups(g, c) == in_channels(g, c) > 1]
    assert len(depthwise) == 17
    assert all(c.attrs["activation"] == "none" for c in convs(g))
    # residual additions: every block after the first of its group (t, c, n, s) but n=1 ones
    assert len(shapes_of(g, "add")) == 1 + 2 + 3 + 2 + 2
    assert shapes_of(g, "add")[-1] == (160, 7, 7)


# ---- Inception-v3 and the InceptionE family -------------------------------------------------

def test_inception_v3_blocks(build: Build) -> None:
    """The concatenated outputs of its 11 blocks: 3 A, B, 4 C, D, 2 E."""
    g = build("inception_v3")
    assert shapes_of(g, "concat") == (
        [(256, 35, 35), (288, 35, 35), (288, 35, 35), (768, 17, 17)]
        + [(768, 17, 17)] * 4 + [(1280, 8, 8), (2048, 8, 8), (2048, 8, 8)])
    kernels = Counter(weight_shape(g, c)[2:] for c in convs(g))
    assert kernels[(1, 7)] == kernels[(7, 1)] == 4 * 3 + 1  # C blocks 3 each, D block 1
    assert kernels[(1, 3)] == kernels[(3, 1)] == 2 * 2
    assert kernels[(5, 5)] == 3


def test_inception_e_blocks_scaling(build: Build) -> None:
    one, three = build("inception_e_blocks:n=1"), build("inception_e_blocks:n=3")
    assert sum(ops(one).values()) == 13  # 9 convolutions, a max pool, 3 concats (OCGGS)
    assert ops(one) == Counter(conv2d=9, concat=3, max_pool2d=1)
    assert ops(three) == Counter({op: 3 * k for op, k in ops(one).items()})
    assert len(three) - 1 == 3 * (len(one) - 1)
    # the first block reads 1280 channels, the following ones the 2048 a block puts out
    readers = Counter(in_channels(three, c) for c in convs(three)
                      if in_channels(three, c) in (1280, 2048))
    assert readers == {1280: 4, 2048: 8}
    assert sum(ops(build("inception_e_blocks")).values()) == 26  # default n=2


# ---- NASNet-A ----------------------------------------------------------------------------------

def test_nasnet_a_cells(build: Build) -> None:
    g = build("nasnet_a")
    assert shapes_of(g, "concat") == ([(640, 56, 56)] * 5 + [(1280, 28, 28)] * 6
                                      + [(2560, 14, 14)] * 6 + [(5120, 7, 7)])
    assert len(shapes_of(g, "add")) == 18 * 5  # five pairwise sums per cell
    depthwise = Counter(weight_shape(g, c)[2:] for c in convs(g)
                        if groups(g, c) == in_channels(g, c) > 1)
    # five 3x3 separable convolutions per normal cell; 7x7, 5x5, 7x7, 5x5, 3x3 per reduction
    assert depthwise == {(3, 3): 15 * 5 + 3, (5, 5): 3 * 2, (7, 7): 3 * 2}


# ---- the OCGGS ResNet family -----------------------------------------------------------------

@pytest.mark.parametrize("k", [1, 2, 3, 8])
def test_resnet_blocks_scale_linearly(build: Build, k: int) -> None:
    one, g = build("resnet_blocks:n=1"), build(f"resnet_blocks:n={k}")
    assert ops(one) == Counter(conv2d=3, add=1, relu=1)  # the paper's 5-operator block
    assert ops(g) == Counter({op: k * n for op, n in ops(one).items()})
    assert len(g) - 1 == k * (len(one) - 1)  # everything but the input node repeats
    assert output_shape(g) == (1, 256, 14, 14)


def test_resnet_block_wiring(build: Build) -> None:
    """relu(add(conv1x1+relu(x), conv3x3(conv3x3+relu(x)))): both paths read the block input."""
    g = build("resnet_blocks:n=1")
    (relu,) = g.nodes_by_op("relu")
    (add,) = g.nodes_by_op("add")
    assert g[relu].inputs[0].node == add
    short, branch = sorted((g[v.node] for v in g[add].inputs),
                           key=lambda c: weight_shape(g, c)[2:])
    assert weight_shape(g, short) == (256, 256, 1, 1) and short.attrs["activation"] == "relu"
    assert weight_shape(g, branch) == (256, 256, 3, 3) and branch.attrs["activation"] == "none"
    first = g[branch.inputs[0].node]
    assert first.op == "conv2d" and first.attrs["activation"] == "relu"
    assert first.inputs[0] == short.inputs[0] and g[short.inputs[0].node].op == "input"


# ---- determinism ---------------------------------------------------------------------------------

@pytest.mark.parametrize("spec", ["resnet_blocks:n=2", "inception_e_blocks:n=1", "squeezenet"])
def test_seed_determines_graph(spec: str) -> None:
    a, b = zoo.build(spec, seed=0), zoo.build(spec, seed=0)
    assert a.structural_hash() == b.structural_hash()
    assert zoo.build(spec, seed=1).structural_hash() != a.structural_hash()


def test_block_count_changes_hash(build: Build) -> None:
    assert (build("resnet_blocks:n=1").structural_hash()
            != build("resnet_blocks:n=2").structural_hash())
