"""The ready ONNX models the `onnx` wheel ships under backend/test/data/light.

They are opset-9 classics (AlexNet, DenseNet-121, Inception v1/v2, ResNet-50, ShuffleNet,
SqueezeNet, VGG-19, ZFNet-512) whose weights are ConstantOfShape nodes; importing them
exercises opset conversion, constant folding and opaque ops (LRN) on real topologies.

Every shipped weight holds one value (0.02), so every logit of the shipped models is the same
number (8.1e11 in AlexNet, where a float32 ulp is 65,536): their softmax is exactly uniform in
one library and one-hot in another, by rounding alone. The zoo therefore redraws the weights
(He-scaled, seeded; batch-norm scales and variances positive) unless `shipped_weights=True`:
same topology, outputs that tell a right computation from a wrong one. Random weights alone
still give logits in the thousands (no trained normalization), which saturates the softmax
just as badly, so the last weighted layer before each softmax is then scaled to bring its
logits to a standard deviation of LOGIT_STD on seeded random inputs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from graphsub.errors import UnknownModelError
from graphsub.ir.graph import Graph, Value, make_node
from graphsub.tensors.types import Constant
from graphsub.zoo import register

#: Inputs of batch_norm that must be positive-ish: the scale and the variance.
_POSITIVE_BN_INPUTS = (1, 4)
#: The spread of the logits a softmax reads, after calibration: far from saturation.
LOGIT_STD = 2.0
#: Ops through which scaling a layer's weights scales the logits by the same factor.
_HOMOGENEOUS = frozenset({"add", "relu", "max_pool2d", "avg_pool2d", "global_avg_pool",
                          "flatten", "reshape", "dropout", "identity", "transpose", "squeeze",
                          "unsqueeze"})

LIGHT_MODELS = ("bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50",
                "shufflenet", "squeezenet", "vgg19", "zfnet512")


def light_model_path(name: str) -> Path:
    import onnx

    path = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / f"light_{name}.onnx"
    if not path.exists():
        raise UnknownModelError(f"the installed onnx package has no light model {name!r} "
                                f"(looked for {path})")
    return path


def random_weights(graph: Graph, seed: int) -> Graph:
    """The graph with every float weight redrawn: He-normal for weights read as a conv or
    matmul's second input, uniform in [0.5, 1.5] for batch-norm scales and variances, small
    normal values elsewhere (biases, means)."""
    rng = np.random.default_rng(seed)
    users = graph.users()
    nodes = dict(graph.nodes)
    for nid in graph.nodes_by_op("weight"):
        node = graph[nid]
        t = node.type
        if not t.dtype.startswith("float"):
            continue  # shapes and indices
        reads = {(graph[u].op, pos) for u, pos in users.get(nid, ())}
        if reads & {("conv2d", 1), ("matmul", 1), ("matmul", 0)} and len(t.shape) >= 2:
            fan_in = int(np.prod(t.shape[1:])) if len(t.shape) > 2 else t.shape[0]
            arr = rng.standard_normal(t.shape) * np.sqrt(2.0 / max(fan_in, 1))
        elif any(op == "batch_norm" and pos in _POSITIVE_BN_INPUTS for op, pos in reads):
            arr = rng.uniform(0.5, 1.5, t.shape)
        else:
            arr = rng.standard_normal(t.shape) * 0.1
        nodes[nid] = make_node("weight", (), (), {"value": Constant(arr.astype(t.dtype))},
                               node.name)
    return Graph(nodes, graph.inputs, graph.outputs, graph.output_names, graph.facts,
                 graph.next_id)


def _source_weights(graph: Graph, nid: int) -> set[int]:
    """The weight nodes a weight-only node is computed from."""
    found, stack = set(), [nid]
    while stack:
        node = graph[stack.pop()]
        for v in node.inputs:
            (found.add(v.node) if graph[v.node].op == "weight" else stack.append(v.node))
    return found | ({nid} if graph[nid].op == "weight" else set())


def _logit_layer_weights(graph: Graph, value: Value) -> set[int] | None:
    """The weights that scale `value` linearly: those of the last conv or matmul upstream of
    it (through biases, activations, pools and reshapes), with the biases on the way; None
    where the path is not of that kind."""
    weight_only = graph.weight_only()
    scaled: set[int] = set()
    node = graph[value.node]
    while node.op in _HOMOGENEOUS:
        data = [v for v in node.inputs if v.node not in weight_only]
        if len(data) != 1:
            return None
        for v in node.inputs:
            if v.node in weight_only and node.op == "add":
                scaled |= _source_weights(graph, v.node)
        node = graph[data[0].node]
    if node.op not in ("conv2d", "matmul"):
        return None
    for v in node.inputs:
        if v.node in weight_only:
            scaled |= _source_weights(graph, v.node)
    return scaled or None


def calibrate_logits(graph: Graph, seed: int) -> Graph:
    """Scale the last weighted layer before each softmax so that its logits have a standard
    deviation of LOGIT_STD on seeded random inputs (in onnxruntime)."""
    from graphsub.onnx_io.exporter import to_onnx_bytes
    from graphsub.runtime.inputs import graph_input_specs, random_feeds
    from graphsub.runtime.ort_sessions import run

    logits = [graph[s].inputs[0] for s in graph.nodes_by_op("softmax")]
    if not logits:
        return graph
    names = [f"logits{i}" for i in range(len(logits))]
    probe = Graph(graph.nodes, graph.inputs, logits, names, graph.facts, graph.next_id,
                  check=False).dce()
    values = run(to_onnx_bytes(probe), random_feeds(graph_input_specs(graph), seed), threads=1)
    nodes = dict(graph.nodes)
    for value, name in zip(logits, names):
        weights = _logit_layer_weights(graph, value)
        spread = float(np.std(values[name]))
        if weights is None or not spread > 0:
            continue
        factor = LOGIT_STD / spread
        for nid in weights:
            array = nodes[nid].attrs["value"].array
            nodes[nid] = make_node("weight", (), (), {"value": Constant(
                (array * factor).astype(array.dtype))}, nodes[nid].name)
    return Graph(nodes, graph.inputs, graph.outputs, graph.output_names, graph.facts,
                 graph.next_id)


def _register(name: str) -> None:
    @register(f"light_{name}", f"{name} from the onnx wheel (opset 9), weights redrawn",
              "onnx package: backend/test/data/light", shipped_weights=False)
    def build(seed: int = 0, shipped_weights: bool = False) -> Graph:
        from graphsub.onnx_io import load

        graph = load(light_model_path(name))
        return graph if shipped_weights else calibrate_logits(random_weights(graph, seed), seed)


for _name in LIGHT_MODELS:
    _register(_name)
