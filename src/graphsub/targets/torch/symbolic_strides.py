"""The strides of a view over symbolic sizes, as size expressions.

On torch a view feeds its readers directly, so an operator's price depends on the strides it
reads (a matmul of a transposed view). Over size symbols those strides are expressions
(`seq*64` for a transposed `batch x seq x 64`), bound with the rest of a signature at each
profile shape. They are computed the way torch computes them: the view's lowering runs on a
fake tensor whose sizes are torch SymInts of a private shape environment, and the resulting
strides' expressions are read back over graphsub's symbols.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from graphsub.ir.graph import Node
from graphsub.tensors.symbolic import (Dim, dim, evaluate_size, is_symbolic, size_symbol,
                                       symbols_in, symbols_in_value)
from graphsub.tensors.types import TensorType

log = logging.getLogger("graphsub.torch")

#: The sizes the private shape environment is traced at: large, distinct and odd, so that no
#: size-1 or equal-sizes case of torch's view logic is taken for the general one.
_FIRST_HINT = 1009


def is_static_value(value: Any) -> bool:
    """Whether an attribute value (numbers, tuples, nested) holds no size expression."""
    if is_symbolic(value):
        return False
    if isinstance(value, (tuple, list)):
        return all(is_static_value(v) for v in value)
    if hasattr(value, "items"):
        return all(is_static_value(v) for _, v in value.items())
    return True


def symbolic_view_strides(ctx: Any, producer: Node, index: int, source: TensorType,
                          in_strides: tuple[Dim, ...] | None) -> tuple[Dim, ...] | None:
    """The strides of output `index` of the view `producer` over a tensor of type `source`
    with strides `in_strides` (None: contiguous); None when the view is contiguous, or when
    torch cannot trace it symbolically (then it is priced as contiguous)."""
    from torch._dynamo.source import ConstantSource
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from graphsub.targets.torch.lowering import lower, torch_dtype
    from graphsub.targets.torch.program import computed_attrs

    names = sorted(symbols_in(source.shape) | symbols_in_value(producer.attrs)
                   | symbols_in(in_strides or ()))
    env = ShapeEnv()
    sizes: dict[str, Any] = {}
    back = {}
    for k, name in enumerate(names):
        hint = _FIRST_HINT + 2 * k
        symbol = env.create_symbol(hint, ConstantSource(f"graphsub_{name}"), positive=True)
        sizes[name] = env.create_symintnode(symbol, hint=hint)
        back[symbol] = size_symbol(name)
    try:
        with FakeTensorMode(shape_env=env, allow_non_fake_inputs=True):
            shape = [evaluate_size(d, sizes) for d in source.shape]
            base = (torch.empty_strided(shape, [evaluate_size(d, sizes) for d in in_strides],
                                        dtype=torch_dtype(source.dtype))
                    if in_strides is not None else
                    torch.empty(shape, dtype=torch_dtype(source.dtype)))
            fn = lower(ctx, producer.op, computed_attrs(producer.attrs, sizes), (source,),
                       producer.outputs)
            out = fn(base)[index]
            if out.is_contiguous():
                return None
            return tuple(dim(s.node.expr.xreplace(back)) if isinstance(s, torch.SymInt)
                         else int(s) for s in out.stride())
    except Exception as exc:  # noqa: BLE001 - a price off, never a failure
        log.debug("strides of %s over symbolic sizes not traced: %s", producer.op, exc)
        return None
