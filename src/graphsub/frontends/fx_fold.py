"""Values a traced graph computes from no input at all, computed once.

A model traced at fixed sizes builds some tensors from nothing but those sizes: the causal
mask of a decoder (aranges, comparisons, a `where` between 0 and the lowest float), rotary
tables, position ids, an empty key/value cache. Left as operators, they split the graph into
parts around ops graphsub does not model (arange, comparisons, where), and their values are
hidden from the rules that need them (a mask is causal, or leaves every query a key). Folded,
each is a constant the part reads like a weight.

The module's parameters and buffers (which torch.compile passes as inputs) are constants
too, as graphsub takes them (frozen, like inductor's freezing): a rotary table computed from
a buffer of inverse frequencies folds. What is computed from them folds only up to
PARAMETER_FOLD_LIMIT elements, so that no weight is copied (a transposed weight stays a
transpose, which graphsub reads as a weight anyway).

Only deterministic operators fold (no random draws, no uninitialized memory), and only
results up to FOLD_LIMIT elements (a mask broadcast to batch x heads x seq x seq stays an
operator over its smaller constant).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.fx as fx

#: The largest constant (elements) folding makes.
FOLD_LIMIT = 1 << 26
#: The largest constant (elements) folding makes from parameters and buffers.
PARAMETER_FOLD_LIMIT = 1 << 20


def fold_constants(gm: fx.GraphModule,
                   parameters: Mapping[fx.Node, torch.Tensor] | None = None) -> int:
    """Replace each tensor the graph computes from constants alone, and that something else
    reads, by a constant attribute (in place); returns how many were made. `parameters` are
    the placeholders that are the module's parameters and buffers, with their values; the
    other inputs, and what depends on them, are left alone."""
    parameters = parameters or {}
    values: dict[fx.Node, Any] = {}
    from_parameters: set[fx.Node] = set(parameters)
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            values[node] = attribute(gm, node.target)
        elif node in parameters:
            values[node] = parameters[node]
        elif node.op == "call_function" and _foldable(node) and all(
                n in values for n in node.all_input_nodes):
            args = fx.node.map_arg(node.args, values.__getitem__)
            kwargs = fx.node.map_arg(node.kwargs, values.__getitem__)
            try:
                with torch.no_grad():
                    value = node.target(*args, **kwargs)
            except Exception:  # noqa: BLE001 - not foldable here: it stays an operator
                continue
            limit = FOLD_LIMIT
            if any(n in from_parameters for n in node.all_input_nodes):
                from_parameters.add(node)
                limit = PARAMETER_FOLD_LIMIT
            if isinstance(value, torch.Tensor) and value.numel() <= limit:
                values[node] = value
    frontier = [n for n in values if n.op == "call_function"
                and any(user not in values for user in n.users)]
    for i, node in enumerate(frontier):
        name = f"_graphsub_folded_{i}"
        gm.register_buffer(name, values[node].detach().clone(), persistent=False)
        with gm.graph.inserting_before(node):
            constant = gm.graph.get_attr(name)
        constant.meta.update(node.meta)
        node.replace_all_uses_with(constant)
    if frontier:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return len(frontier)


def attribute(gm: fx.GraphModule, target: str) -> Any:
    value: Any = gm
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _foldable(node: fx.Node) -> bool:
    """Deterministic ATen operators (torch's own tag), none that allocates without writing."""
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return False
    if torch.Tag.nondeterministic_seeded in target.tags:
        return False
    name = target.name()  # type: ignore[no-untyped-call, unused-ignore]  # unannotated in torch
    return not name.split("::")[-1].startswith(("empty", "new_empty"))
