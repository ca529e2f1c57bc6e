"""The operator registry: every graphsub operator, defined once (see ops.base.OpDef)."""

from graphsub.ops import (attention, conv, elementwise, fused, linalg, norm,  # noqa: F401
                          opaque, pool, reduce, rotary, shape, source)
from graphsub.ops.base import (AttrSpec, OpDef, all_ops, aten_importers, get_op,
                               importable_onnx_ops, importer_for, register, view_ops)


def is_deterministic(node) -> bool:
    """Whether a node's value is a function of its inputs (so it may be folded)."""
    if node.op == "opaque":
        return opaque.is_deterministic(node.attrs)
    return True


__all__ = ["AttrSpec", "OpDef", "all_ops", "aten_importers", "get_op", "importable_onnx_ops",
           "importer_for", "is_deterministic", "register", "view_ops"]
