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
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from graphsub.fuzz.models import GenStats, InvalidModel, fuzz_sizes, generate as generate_plain
from graphsub.fuzz.models import random_inputs, validate

CLASSES: tuple[str, ...] = ("control-flow", "float16", "mixed-precision", "qdq", "dynamic",
                            "qoperator", "opaque-values", "old-opset")
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
            "qoperator": _qoperator, "opaque-values": _opaque_values,
            "old-opset": _old_opset}[name](model, rng)
    prop = made.metadata_props.add()
    prop.key, prop.value = CLASS_KEY, name
    validate(made)
    return made


def _opaque_values(model: onnx.ModelProto, rng: np.random.Generator) -> onnx.ModelProto:
    """ONNX values that are not tensors of numbers around the model's computation: its first
    input split into a sequence and joined back (SplitToSequence, ConcatFromSequence), the
    first output passed through an optional (Optional, OptionalGetElement), and a new input
    of words whose matches with constant words (Equal over strings) scale the first output
    by 1 or 2. graphsub carries them as opaque values and optimizes the rest."""
    g = model.graph
    if not g.input or not g.output or g.input[0].type.tensor_type.elem_type != TensorProto.FLOAT:
        raise InvalidModel("opaque-values: the first input is not a float tensor")
    made = onnx.ModelProto()
    made.CopyFrom(model)
    g = made.graph
    first, out = g.input[0].name, g.output[0].name
    joined, raw = first + "_joined", out + "_raw"
    for node in g.node:
        node.input[:] = [joined if i == first else i for i in node.input]
        node.output[:] = [raw if o == out else o for o in node.output]
    words = np.array(["graphsub", "Monday", "tensor"], dtype=object)[
        : int(rng.integers(1, 4))]
    g.initializer.append(helper.make_tensor("known_words", TensorProto.STRING, [len(words)],
                                            [w.encode() for w in words]))
    g.input.append(helper.make_tensor_value_info("words", TensorProto.STRING, [len(words)]))
    g.node.extend([
        helper.make_node("SplitToSequence", [first], [first + "_seq"], axis=0, keepdims=1),
        helper.make_node("ConcatFromSequence", [first + "_seq"], [joined], axis=0),
        helper.make_node("Optional", [raw], [out + "_opt"]),
        helper.make_node("OptionalGetElement", [out + "_opt"], [out + "_got"]),
        helper.make_node("Cast", ["hits"], ["hits_f"], to=TensorProto.FLOAT),
        helper.make_node("ReduceMax", ["hits_f"], ["any_hit"], keepdims=0),
        helper.make_node("Add", ["any_hit", "fuzz_one"], ["scale"]),
        helper.make_node("Mul", [out + "_got", "scale"], [out])])
    g.initializer.append(helper.make_tensor("fuzz_one", TensorProto.FLOAT, [], [1.0]))
    opsets = [o for o in made.opset_import if o.domain in ("", "ai.onnx")]
    if opsets and opsets[0].version >= 19:  # Equal over strings
        g.node.append(helper.make_node("Equal", ["words", "known_words"], ["hits"]))
    else:  # before: whether the words joined are as many as expected (always: a scale of 1)
        g.node.extend([
            helper.make_node("Concat", ["words", "known_words"], ["all_words"], axis=0),
            helper.make_node("Size", ["all_words"], ["count"]),
            helper.make_node("Equal", ["count", "expected_count"], ["hits"])])
        g.initializer.append(helper.make_tensor("expected_count", TensorProto.INT64, [], [0]))
    _sort_nodes(g)
    return made


#: The opsets the old-opset class writes models for.
OLD_OPSETS = (7, 8, 9, 10, 11, 12)


def _old_opset(model: onnx.ModelProto, rng: np.random.Generator) -> onnx.ModelProto:
    """A model as an exporter of opsets 7-12 writes it, in the forms whose meaning or layout
    changed since (attributes that became inputs: Squeeze, Unsqueeze, ReduceSum, Split, Pad,
    Slice, Clip; Softmax's 2-D coercion; Upsample; batch norm's `spatial`): blocks on an NCHW
    image drawn from the seed. graphsub upgrades it where onnx's converter keeps its meaning
    (checked), and keeps its opset otherwise. (`model` only lends its seed's randomness.)"""
    opset = int(rng.choice(OLD_OPSETS))
    c = 4
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    counter = iter(range(10**6))

    def fresh(hint: str) -> str:
        return f"{hint}{next(counter)}"

    def weight(shape: tuple[int, ...], scale: float = 0.5) -> str:
        name = fresh("w")
        inits.append(onnx.numpy_helper.from_array(
            (rng.standard_normal(shape) * scale).astype(np.float32), name))
        return name

    def ints(values: list[int]) -> str:
        name = fresh("i")
        inits.append(onnx.numpy_helper.from_array(np.array(values, np.int64), name))
        return name

    x, h = "image", 8
    for _ in range(int(rng.integers(3, 7))):
        kind = str(rng.choice(["conv_bn", "prelu", "pad_pool", "slice", "clip", "reduce",
                               "softmax", "split", "upsample"]))
        y = fresh(kind)
        if kind == "conv_bn":
            conv = fresh("conv")
            nodes.append(helper.make_node("Conv", [x, weight((c, c, 3, 3), 0.2), weight((c,))],
                                          [conv], pads=[1, 1, 1, 1]))
            bn_attrs: dict[str, Any] = {"spatial": 1} if opset < 9 else {}
            nodes.append(helper.make_node(
                "BatchNormalization", [conv, weight((c,)), weight((c,)), weight((c,)),
                                       _positive(inits, fresh("var"), c, rng)], [y],
                epsilon=1e-5, **bn_attrs))
        elif kind == "prelu":
            nodes.append(helper.make_node("PRelu", [x, weight((c, 1, 1))], [y]))
        elif kind == "pad_pool":
            padded = fresh("pad")
            if opset < 11:
                nodes.append(helper.make_node("Pad", [x], [padded], pads=[0, 0, 1, 1, 0, 0, 1, 1]))
            else:
                nodes.append(helper.make_node("Pad", [x, ints([0, 0, 1, 1, 0, 0, 1, 1])],
                                              [padded]))
            nodes.append(helper.make_node("MaxPool", [padded], [y], kernel_shape=[3, 3]))
        elif kind == "slice" and h > 4:
            if opset < 10:
                nodes.append(helper.make_node("Slice", [x], [y], axes=[2, 3], starts=[1, 0],
                                              ends=[h, h - 1]))
            else:
                nodes.append(helper.make_node("Slice", [x, ints([1, 0]), ints([h, h - 1]),
                                                        ints([2, 3])], [y]))
            h -= 1
        elif kind == "clip":
            if opset < 11:
                nodes.append(helper.make_node("Clip", [x], [y], min=-1.0, max=1.5))
            else:
                low, high = fresh("low"), fresh("high")
                inits += [onnx.numpy_helper.from_array(np.array(-1.0, np.float32), low),
                          onnx.numpy_helper.from_array(np.array(1.5, np.float32), high)]
                nodes.append(helper.make_node("Clip", [x, low, high], [y]))
        elif kind == "reduce":
            r, u = fresh("reduced"), fresh("squeezed")
            nodes.append(helper.make_node("ReduceMean", [x], [r], axes=[1], keepdims=0))
            nodes.append(helper.make_node("Unsqueeze", [r], [u], axes=[1]))
            nodes.append(helper.make_node("Add", [x, u], [y]))
        elif kind == "softmax":  # before opset 13: the input coerced to 2-D at the axis
            flat = fresh("flat")
            nodes.append(helper.make_node("Softmax", [x], [flat], axis=2))
            nodes.append(helper.make_node("Mul", [flat, weight((1,), 1.0)], [y]))
        elif kind == "split":
            a, b = fresh("a"), fresh("b")
            nodes.append(helper.make_node("Split", [x], [a, b], axis=1, split=[1, c - 1]))
            nodes.append(helper.make_node("Concat", [b, a], [y], axis=1))
        elif kind == "upsample" and opset <= 9 and h <= 8:
            scales = [1.0, 1.0, 2.0, 2.0]
            if opset < 9:
                nodes.append(helper.make_node("Upsample", [x], [y], scales=scales))
            else:
                name = fresh("scales")
                inits.append(onnx.numpy_helper.from_array(np.array(scales, np.float32), name))
                nodes.append(helper.make_node("Upsample", [x, name], [y]))
            h *= 2
        else:
            nodes.append(helper.make_node("Relu", [x], [y]))
        x = y
    nodes.append(helper.make_node("Identity", [x], ["out"]))
    graph = helper.make_graph(nodes, "old", [helper.make_tensor_value_info(
        "image", TensorProto.FLOAT, [1, c, 8, 8])], [helper.make_tensor_value_info(
            "out", TensorProto.FLOAT, None)], initializer=inits)
    made = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    made.ir_version = 6
    inferred = onnx.shape_inference.infer_shapes(made)
    del made.graph.output[:]
    made.graph.output.extend(inferred.graph.output)
    return made


def _positive(inits: list[onnx.TensorProto], name: str, c: int,
              rng: np.random.Generator) -> str:
    inits.append(onnx.numpy_helper.from_array(rng.uniform(0.5, 2.0, c).astype(np.float32), name))
    return name


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
        made: onnx.ModelProto = convert_float_to_float16(model, keep_io_types=keep_io_types,
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

    class Reader(CalibrationDataReader):  # type: ignore[misc]  # onnxruntime.quantization is untyped
        def __init__(self) -> None:
            self.feeds = [random_inputs(model, seed + k) for k in range(4)]

        def get_next(self) -> dict[str, np.ndarray] | None:
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
