"""The ready ONNX models the `onnx` wheel ships under backend/test/data/light.

They are opset-9 classics (AlexNet, DenseNet-121, Inception v1/v2, ResNet-50, ShuffleNet,
SqueezeNet, VGG-19, ZFNet-512) whose weights are ConstantOfShape nodes; importing them
exercises opset conversion, constant folding and opaque ops (LRN) on real topologies.
"""

from __future__ import annotations

from pathlib import Path

from graphsub.errors import UnknownModelError
from graphsub.ir.graph import Graph
from graphsub.zoo import register

LIGHT_MODELS = ("bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50",
                "shufflenet", "squeezenet", "vgg19", "zfnet512")


def light_model_path(name: str) -> Path:
    import onnx

    path = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / f"light_{name}.onnx"
    if not path.exists():
        raise UnknownModelError(f"the installed onnx package has no light model {name!r} "
                                f"(looked for {path})")
    return path


def _register(name: str) -> None:
    @register(f"light_{name}", f"{name} as shipped (opset 9, constant weights) by the onnx wheel",
              "onnx package: backend/test/data/light")
    def build(seed: int = 0) -> Graph:
        from graphsub.onnx_io import load

        return load(light_model_path(name))


for _name in LIGHT_MODELS:
    _register(_name)
