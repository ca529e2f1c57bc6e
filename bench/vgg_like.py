"""A VGG-19-shaped ONNX model with random weights (143.7 million parameters, 575 MB), at the
opset the ONNX model zoo's VGG-19 is written for (7 by default), for timing what graphsub does
with a large model of an old opset (issue 51's time limit):

    python bench/vgg_like.py out/models/vgg19.onnx [--opset 7] [--width 1.0]
"""

from __future__ import annotations

import argparse

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

#: VGG-19's convolutions per stage, and their widths.
STAGES = ((2, 64), (2, 128), (4, 256), (4, 512), (4, 512))


def vgg19(opset: int, width: float = 1.0, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    x, channels = "data", 3

    def weight(name: str, shape: tuple[int, ...], fan_in: int) -> str:
        inits.append(numpy_helper.from_array(
            (rng.standard_normal(shape, dtype=np.float32) * np.float32(np.sqrt(2.0 / fan_in))),
            name))
        return name

    for s, (convs, out) in enumerate(STAGES):
        out = max(8, int(out * width))
        for k in range(convs):
            name = f"conv{s + 1}_{k + 1}"
            w = weight(f"{name}_w", (out, channels, 3, 3), channels * 9)
            b = weight(f"{name}_b", (out,), out)
            nodes.append(helper.make_node("Conv", [x, w, b], [name], pads=[1, 1, 1, 1],
                                          kernel_shape=[3, 3]))
            nodes.append(helper.make_node("Relu", [name], [name + "_relu"]))
            x, channels = name + "_relu", out
        nodes.append(helper.make_node("MaxPool", [x], [f"pool{s + 1}"], kernel_shape=[2, 2],
                                      strides=[2, 2]))
        x = f"pool{s + 1}"
    nodes.append(helper.make_node("Flatten", [x], ["flat"], axis=1))
    x, features = "flat", channels * 7 * 7
    for k, out in enumerate((int(4096 * width), int(4096 * width), 1000)):
        name = f"fc{k + 6}"
        w = weight(f"{name}_w", (features, out), features)
        b = weight(f"{name}_b", (out,), out)
        nodes.append(helper.make_node("Gemm", [x, w, b], [name]))
        if k < 2:
            nodes.append(helper.make_node("Relu", [name], [name + "_relu"]))
            name += "_relu"
        x, features = name, out
    nodes.append(helper.make_node("Softmax", [x], ["prob"], axis=1))
    # IR version 3 (the zoo's file) lists every initializer among the graph's inputs too
    inputs = [helper.make_tensor_value_info("data", TensorProto.FLOAT, [1, 3, 224, 224])]
    if opset <= 7:
        inputs += [helper.make_tensor_value_info(i.name, i.data_type, list(i.dims))
                   for i in inits]
    graph = helper.make_graph(nodes, "vgg19", inputs, [helper.make_tensor_value_info(
        "prob", TensorProto.FLOAT, [1, 1000])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 3 if opset <= 7 else 6
    return model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--opset", type=int, default=7)
    p.add_argument("--width", type=float, default=1.0)
    args = p.parse_args()
    onnx.save(vgg19(args.opset, args.width), args.out)


if __name__ == "__main__":
    main()
