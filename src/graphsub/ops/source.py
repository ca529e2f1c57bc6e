"""Graph inputs and weights. Both are nodes, so a rule's pattern variable can bind either."""

from __future__ import annotations

from typing import Any

import numpy as np

from graphsub.errors import GraphsubError
from graphsub.ir.types import Attrs, Constant, TensorType
from graphsub.ops.base import AttrSpec, Category, OpDef, Types, ints, register


def _no_export(ctx, attrs: Attrs, ins: list[str], outs: list[str], types: Types) -> None:
    raise AssertionError("inputs and weights are written by the exporter itself")


def _no_eval(attrs: Attrs, xs: Any) -> tuple[np.ndarray, ...]:
    raise GraphsubError(f"no value was given for graph input {attrs['name']!r}")


def _constant(value: Any) -> Constant:
    return value if isinstance(value, Constant) else Constant(np.asarray(value))


def _zero_bytes(attrs: Attrs, ins: Types, outs: Types) -> int:
    return 0


register(OpDef(
    name="input", inputs=(0, 0), category=Category.SOURCE,
    attrs=(AttrSpec("name", convert=str), AttrSpec("shape", convert=ints),
           AttrSpec("dtype", "float32", str)),
    infer=lambda attrs, ins: (TensorType(attrs["shape"], attrs["dtype"]),),
    evaluate=_no_eval, export=_no_export, bytes=_zero_bytes,
    doc="A named graph input of a concrete type.",
))

register(OpDef(
    name="weight", inputs=(0, 0), attrs=(AttrSpec("value", convert=_constant),),
    category=Category.SOURCE,
    infer=lambda attrs, ins: (attrs["value"].type,),
    evaluate=lambda attrs, xs: (attrs["value"].array,),
    export=_no_export, bytes=_zero_bytes,
    doc="A constant tensor (ONNX initializer or Constant).",
))
