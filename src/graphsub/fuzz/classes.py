"""The classes of models people deploy, made from a random float32 model: control flow whose
bodies read outer values, half precision (whole or with float32 islands), and quantization
in onnxruntime's three formats (QDQ, QOperator, dynamic). Each is made with the tools that make such models in the field (onnxruntime's
float16 converter, the code of onnxconverter-common, and its static quantizer), so that the
fuzzer sees their forms rather than graphsub's idea of them.

    model = with_class(random_model(7), "control-flow", np.random.default_rng(7))
    model, stats = generate(7, classes=0.3, symbolic=0.3)   # a share of the seeds in a class
"""

from __future__ import annotations

import logging
import os
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper

from graphsub.fuzz.models import GenStats, InvalidModel, fuzz_sizes, generate as generate_plain
from graphsub.fuzz.models import random_inputs, validate

CLASSES: tuple[str, ...] = ("control-flow", "float16", "mixed-precision", "qdq", "dynamic",
                            "qoperator")
#: Where a model records its class (a metadata property), for the campaign's tables.
CLASS_KEY = "fuzz_class"


def generate(seed: int, classes: float = 0.0, **options: object
             ) -> tuple[onnx.ModelProto, GenStats]:
    """fuzz.models.generate's model, made into one of CLASSES for a share `classes` of the
    seeds (a model with a size symbol stays as it is). The class is drawn from a stream of its
    own; a model the class cannot be made from is counted as a discard and the next attempt
    tries again, until the plain model is kept."""
    model, stats = generate_plain(seed, **options)
    pick = np.random.default_rng([seed, 1])
    if not classes or pick.random() >= classes or fuzz_sizes(model):
        return model, stats
    name = CLASSES[int(pick.integers(len(CLASSES)))]
    for attempt in range(4):
        base = model if attempt == 0 else generate_plain(seed + 7919 * attempt, **options)[0]
        try:
            return with_class(base, name, pick), stats
        except InvalidModel as exc:
            stats.discards += 1
            stats.reasons[str(exc).split(":")[0]] += 1
    return model, stats


def random_model(seed: int, classes: float = 0.0, **options: object) -> onnx.ModelProto:
    """`generate`'s model alone."""
    return generate(seed, classes, **options)[0]


def model_class(model: onnx.ModelProto) -> str:
    """The class a model was made in ("" for a plain float32 one)."""
    return next((p.value for p in model.metadata_props if p.key == CLASS_KEY), "")


def with_class(model: onnx.ModelProto, name: str, rng: np.random.Generator) -> onnx.ModelProto:
    """The model made into one of CLASSES, checked (full check, runs, sane outputs);
    InvalidModel when the class cannot be made from it."""
    made = {"control-flow": _control_flow, "float16": _float16,
            "mixed-precision": _mixed_precision, "qdq": _qdq, "dynamic": _dynamic,
            "qoperator": _qoperator}[name](model, rng)
    prop = made.metadata_props.add()
    prop.key, prop.value = CLASS_KEY, name
    validate(made)
    return made


def _renamed_graph(graph: onnx.GraphProto, suffix: str, keep: set[str]) -> onnx.GraphProto:
    """A copy of the graph's nodes with every value it computes renamed (ONNX assigns a name
    once across a model's scopes); the names in `keep` (outer values it reads) stay."""
    out = onnx.GraphProto()
    names = {o: o + suffix for n in graph.node for o in n.output if o}
    for node in graph.node:
        copy = out.node.add()
        copy.CopyFrom(node)
        copy.name = (node.name + suffix) if node.name else ""
        del copy.input[:]
        copy.input.extend(names.get(i, i) if i not in keep else i for i in node.input)
        del copy.output[:]
        copy.output.extend(names.get(o, o) for o in node.output)
    for o in graph.output:
        vi = out.output.add()
        vi.CopyFrom(o)
        vi.name = names.get(o.name, o.name)
    return out


def _control_flow(model: onnx.ModelProto, rng: np.random.Generator) -> onnx.ModelProto:
    """The whole computation moved into an If on a new boolean input: the then-branch as it
    was, the else-branch the same with its outputs negated, both reading the model's inputs
    and weights from the scope around them; with a chance, the then-branch's computation
    nested in an inner If of its own."""
    g = model.graph
    outer = {i.name for i in g.input} | {i.name for i in g.initializer}
    then = _renamed_graph(g, "_t", outer)
    other = _renamed_graph(g, "_e", outer)
    negated = []
    for out in other.output:
        neg = out.name + "_neg"
        other.node.append(helper.make_node("Neg", [out.name], [neg]))
        negated.append(neg)
    for out, name in zip(other.output, negated):
        out.name = name
    then.name, other.name = "then", "else"
    if rng.random() < 0.5:
        inner_then = _renamed_graph(g, "_it", outer)
        inner_else = _renamed_graph(g, "_ie", outer)
        inner_then.name, inner_else.name = "inner_then", "inner_else"
        results = [o.name + "_inner" for o in g.output]
        nested = onnx.GraphProto()
        nested.name = "then"
        nested.node.append(helper.make_node("If", ["cond"], results, then_branch=inner_then,
                                            else_branch=inner_else))
        for out, name in zip(g.output, results):
            vi = nested.output.add()
            vi.CopyFrom(out)
            vi.name = name
        then = nested
    node = helper.make_node("If", ["cond"], [o.name for o in g.output], then_branch=then,
                            else_branch=other)
    made = onnx.ModelProto()
    made.CopyFrom(model)
    del made.graph.node[:]
    made.graph.node.append(node)
    made.graph.input.append(helper.make_tensor_value_info("cond", TensorProto.BOOL, []))
    return made


def _converted(model: onnx.ModelProto, keep_io_types: bool, block: list[str]) -> onnx.ModelProto:
    from onnxruntime.transformers.float16 import convert_float_to_float16

    try:
        made = convert_float_to_float16(model, keep_io_types=keep_io_types,
                                        op_block_list=block or None)
    except Exception as exc:  # noqa: BLE001 (the converter raises many kinds)
        raise InvalidModel(f"float16: {str(exc).splitlines()[0][:200]}") from None
    _sort_nodes(made.graph)  # the converter appends the input casts after their readers
    return made


def _sort_nodes(graph: onnx.GraphProto) -> None:
    """Put the graph's nodes in an order where each comes after what it reads."""
    ready = {i.name for i in graph.input} | {i.name for i in graph.initializer} | {""}
    pending, ordered = list(graph.node), []
    while pending:
        left = [n for n in pending if not set(n.input) <= ready]
        done = [n for n in pending if set(n.input) <= ready]
        if not done:
            raise InvalidModel("float16: the converted graph has a cycle")
        for n in done:
            ordered.append(n)
            ready.update(n.output)
        pending = left
    copies = [onnx.NodeProto() for _ in ordered]
    for copy, node in zip(copies, ordered):
        copy.CopyFrom(node)
    del graph.node[:]
    graph.node.extend(copies)


def _float16(model: onnx.ModelProto, rng: np.random.Generator) -> onnx.ModelProto:
    """The model in float16 as onnxruntime's converter writes it, inputs and outputs too."""
    return _converted(model, keep_io_types=False, block=[])


def _mixed_precision(model: onnx.ModelProto, rng: np.random.Generator) -> onnx.ModelProto:
    """Float16 with float32 inputs and outputs and some op types kept in float32 (Cast
    islands, as the converter leaves them around ops it is told to keep)."""
    ops = sorted({n.op_type for n in model.graph.node})
    block = [op for op in ops if rng.random() < 0.3]
    return _converted(model, keep_io_types=True, block=block)


def _qdq(model: onnx.ModelProto, rng: np.random.Generator) -> onnx.ModelProto:
    """QDQ quantization by onnxruntime's quantize_static, calibrated on random inputs."""
    return _quantized(model, rng, "qdq", {"QuantizeLinear"})


def _qoperator(model: onnx.ModelProto, rng: np.random.Generator) -> onnx.ModelProto:
    """QOperator quantization by quantize_static: QLinearConv, QLinearMatMul and onnxruntime's
    QLinear elementwise operators between a QuantizeLinear and a DequantizeLinear."""
    return _quantized(model, rng, "qoperator", {"QLinearConv", "QLinearMatMul"})


def _dynamic(model: onnx.ModelProto, rng: np.random.Generator) -> onnx.ModelProto:
    """Dynamic quantization by quantize_dynamic: DynamicQuantizeLinear before MatMulInteger
    and ConvInteger."""
    return _quantized(model, rng, "dynamic", {"MatMulInteger", "ConvInteger"})


def _quantized(model: onnx.ModelProto, rng: np.random.Generator, how: str,
               expected: set[str]) -> onnx.ModelProto:
    """The model quantized by onnxruntime's quantizer (`how`: qdq, qoperator or dynamic),
    with 7-bit weights (reduce_range) as the quantizer advises for x86 without VNNI, where
    MLAS sums uint8 x int8 products in int16 and full-range weights saturate there (its
    result is then not the product's, on this machine and not on others)."""
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_dynamic, quantize_static)

    seed = int(rng.integers(2**31))
    weight_type = QuantType.QUInt8 if rng.random() < 0.3 else QuantType.QInt8

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = [random_inputs(model, seed + k) for k in range(4)]

        def get_next(self):
            return self.feeds.pop() if self.feeds else None

    root = logging.getLogger()
    level = root.level
    with tempfile.TemporaryDirectory() as folder:
        src, out = os.path.join(folder, "f.onnx"), os.path.join(folder, "q.onnx")
        onnx.save(model, src)
        root.setLevel(logging.ERROR)  # the quantizer's advice on pre-processing, per model
        try:
            if how == "dynamic":
                quantize_dynamic(src, out, weight_type=weight_type, reduce_range=True)
            else:
                quantize_static(src, out, Reader(), reduce_range=how == "qoperator",
                                quant_format=QuantFormat.QDQ if how == "qdq"
                                else QuantFormat.QOperator)
        except Exception as exc:  # noqa: BLE001 (the quantizer raises many kinds)
            raise InvalidModel(f"{how}: {str(exc).splitlines()[0][:200]}") from None
        finally:
            root.setLevel(level)
        made = onnx.load(out)
    if not any(n.op_type in expected for n in made.graph.node):
        raise InvalidModel(f"{how}: nothing to quantize")
    return made
