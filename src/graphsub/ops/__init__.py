"""The operator registry: every graphsub operator, defined once (see ops.base.OpDef)."""

from __future__ import annotations

from typing import Protocol

from graphsub.ops import (attention, conv, elementwise, fused, linalg, norm,  # noqa: F401
                          opaque, pool, quant, reduce, rotary, shape, source)
from graphsub.ops.base import (AttrSpec, OpDef, all_ops, aten_importers, get_op,
                               importable_onnx_ops, importer_for, register, view_ops)
from graphsub.tensors.types import Attrs


class OperatorUse(Protocol):
    """What these questions read of a node (graphsub.ir's `Node` is one): the operator and
    its attributes."""

    @property
    def op(self) -> str: ...

    @property
    def attrs(self) -> Attrs: ...


def is_deterministic(node: OperatorUse) -> bool:
    """Whether a node's value is a function of its inputs (so it may be folded)."""
    if node.op == "opaque":
        return opaque.is_deterministic(node.attrs)
    return True


def is_foldable(node: OperatorUse) -> bool:
    """Whether a node over weights alone may be computed once into a weight: deterministic,
    and not a dequantization, whose folding would store quantized weights as floats (four
    times the file) and hide them from onnxruntime's fusions of quantized operators."""
    if node.op == "opaque" and not opaque.is_foldable(node.attrs):
        return False
    return is_deterministic(node) and not is_dequantization(node)


def is_dequantization(node: OperatorUse) -> bool:
    """Whether a node turns quantized values into floats."""
    return node.op == "dequantize" or (node.op == "opaque" and opaque.is_dequantization(node.attrs))


def is_quantization(node: OperatorUse) -> bool:
    """Whether a node turns float values into quantized ones."""
    return node.op in ("quantize", "dynamic_quantize") or (
        node.op == "opaque" and opaque.is_quantization(node.attrs))


__all__ = ["AttrSpec", "OpDef", "all_ops", "aten_importers", "get_op", "importable_onnx_ops",
           "importer_for", "is_dequantization", "is_deterministic", "is_foldable",
           "is_quantization", "register", "view_ops"]
