"""Graphs that torch.compile captured with dynamic sizes (`dynamic=True`, or the automatic
dynamic shapes of a recompile after a size changed).

dynamo hands the backend its graph with the sizes it made dynamic as symbols of its shape
environment (s0, s1, ...): SymInts among the example inputs, and fake tensors with SymInt
sizes in the placeholders' metadata. This module traces such a graph to ATen operators in
that same shape environment, so that every node's size is an expression over dynamo's own
symbols (fx_import turns them into graphsub's), and makes the inputs that check an
optimized graph at sizes other than the example's.

Views are not functionalized here (torch's functionalization pins symbolic sizes to the
example's values): the ATen importers read views as they read their copies, which is exact
because a graph with dynamic sizes is refused when it writes into a tensor in place.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx

from graphsub.errors import GraphsubError
from graphsub.frontends.fx_origins import traced_with_origins

Binding = dict[str, int]


def has_dynamic_sizes(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> bool:
    """Whether dynamo made some size of this graph dynamic."""
    if any(isinstance(x, torch.SymInt) for x in example_inputs):
        return True
    for node in gm.graph.nodes:
        value = node.meta.get("example_value") if node.op == "placeholder" else None
        if isinstance(value, torch.Tensor) and any(isinstance(d, torch.SymInt)
                                                   for d in value.shape):
            return True
    return False


def trace_dynamic(gm: fx.GraphModule, example_inputs: Sequence[Any]
                  ) -> tuple[fx.GraphModule, list[Any], Binding]:
    """The graph at the ATen level with symbolic sizes (each node that is a node of dynamo's
    graph marked so: fx_origins), the example inputs with each SymInt
    at the value dynamo saw (what the graph runs on to be measured and checked), and those
    values by symbol."""
    from torch._guards import TracingContext, detect_fake_mode

    fake_mode = detect_fake_mode(list(example_inputs))
    if fake_mode is None or fake_mode.shape_env is None:
        raise GraphsubError("dynamic sizes without torch's shape environment")
    context = TracingContext.try_get()

    def fake(x: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        # (unannotated; with torch absent, Any: the ignore is unused there)
        sizes = (context.tensor_to_context.get(x)  # type: ignore[no-untyped-call, unused-ignore]
                 if context is not None else None)
        if sizes is None:  # not made dynamic by dynamo: a parameter, a buffer
            return fake_mode.from_tensor(x, static_shapes=True)
        return fake_mode.from_tensor(x, symbolic_context=sizes, source=sizes.tensor_source,
                                     trace=False)

    folded = _numbers_folded(gm, example_inputs)
    with fake_mode, torch.no_grad():
        fakes = [fake(x) for x in example_inputs]
        aten_gm = traced_with_origins(folded, fakes, functional=False, tracing_mode="symbolic")
    for node in aten_gm.graph.nodes:
        schema = getattr(node.target, "_schema", None)
        if node.op == "call_function" and schema is not None and schema.is_mutable:
            raise GraphsubError(f"with dynamic sizes graphsub does not optimize graphs that "
                                f"write into tensors in place ({node.target})")
    aten_gm.graph.eliminate_dead_code()
    aten_gm.recompile()
    hints = {symbol.name: int(value)
             for symbol, value in fake_mode.shape_env.backed_var_to_val.items()}
    concrete = [_hint(x) for x in example_inputs]
    return aten_gm, concrete, hints


def _numbers_folded(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> fx.GraphModule:
    """A copy of the graph where each number read from a one-element tensor of the module
    (`.item()` of an embedding's norm type, of a constant dynamo kept) is that number, as
    graphsub takes the module's state to be constant: fake tensors have no values to read.
    A number read from an input of the call stays a computation."""
    graph = copy.deepcopy(gm.graph)
    scalars: dict[fx.Node, torch.Tensor] = {}
    for node, x in zip(graph.find_nodes(op="placeholder"), example_inputs):
        if isinstance(x, torch.Tensor) and x.numel() == 1 and _module_state(node):
            scalars[node] = x
    for node in graph.find_nodes(op="get_attr"):
        value = _attribute(gm, node.target)
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            scalars[node] = value
    for node in list(graph.nodes):
        if node.op == "call_method" and node.target == "item" and node.args[0] in scalars:
            number = scalars[node.args[0]].item()

            def to_number(a: fx.Node, n: fx.Node = node) -> Any:
                return number if a is n else a

            for user in list(node.users):
                user.args = fx.node.map_arg(user.args, to_number)
                user.kwargs = fx.node.map_arg(user.kwargs, to_number)
            graph.erase_node(node)
    return fx.GraphModule(gm, graph)


def _module_state(placeholder: fx.Node) -> bool:
    """Whether dynamo reached this input through an object's attribute (a module's tensor),
    rather than as an argument of the call."""
    from torch._dynamo.source import AttrSource

    source = getattr(placeholder.meta.get("grapharg"), "source", None)
    while source is not None:
        if isinstance(source, AttrSource):
            return True
        source = getattr(source, "base", None)
    return False


def _attribute(module: torch.nn.Module, target: str) -> Any:
    value: Any = module
    for name in target.split("."):
        value = getattr(value, name, None)
    return value


def _hint(x: Any) -> Any:
    """A SymInt's value in the example; anything else as it is."""
    return int(x.node.hint) if isinstance(x, torch.SymInt) else x


def input_symbols(graph: fx.Graph) -> dict[str, Any]:
    """The symbols of the graph's input sizes, by name, with their value ranges (torch's
    ValueRanges; None where it has none)."""
    out: dict[str, Any] = {}
    for node in graph.find_nodes(op="placeholder"):
        val = node.meta.get("val")
        sizes = [val] if isinstance(val, torch.SymInt) else \
            list(val.shape) if isinstance(val, torch.Tensor) else []
        for size in sizes:
            if isinstance(size, torch.SymInt):
                env = size.node.shape_env
                for symbol in size.node.expr.free_symbols:
                    out[symbol.name] = env.var_to_range.get(symbol)
    return out


def range_bound(value: Any) -> int | None:
    """One end of a torch value range as an int (None: unbounded)."""
    try:
        return int(value) if bool(value.is_finite) else None
    except (TypeError, ValueError, AttributeError):
        return None


def other_bindings(gm: fx.GraphModule, hints: Binding) -> list[Binding]:
    """Sizes to check the optimized graph at besides the example's: every symbol at the
    smallest size torch.compile gives this graph, one more than the example (the other
    parity), and twice the example plus one, each within the symbol's range."""
    symbols = input_symbols(gm.graph)
    lows = {n: max(2, (range_bound(r.lower) or 2) if r is not None else 2)
            for n, r in symbols.items()}
    highs = {n: range_bound(r.upper) if r is not None else None for n, r in symbols.items()}

    def clamp(name: str, value: int) -> int:
        high = highs[name]
        return max(lows[name], value if high is None else min(high, value))

    out: list[Binding] = []
    makes: tuple[Callable[[str], int], ...] = (lambda n: lows[n], lambda n: hints[n] + 1,
                                              lambda n: 2 * hints[n] + 1)
    for make in makes:
        binding = {n: clamp(n, make(n)) for n in symbols}
        if binding != {n: hints[n] for n in symbols} and binding not in out:
            out.append(binding)
    return out


def inputs_at(gm: fx.GraphModule, example: Sequence[Any], binding: Binding,
              constants: Sequence[int], generator: torch.Generator) -> list[Any]:
    """The graph's inputs at the sizes `binding` gives the symbols: sizes computed, weights
    and one-number tensors as they are, float tensors random, other tensors filled from the
    example's values (token ids, masks: what the model accepts)."""
    import sympy

    fixed = set(constants)
    out: list[Any] = []
    for i, (node, given) in enumerate(zip(gm.graph.find_nodes(op="placeholder"), example)):
        val = node.meta.get("val")
        if isinstance(val, torch.SymInt):
            out.append(_size_at(val, binding, sympy))
            continue
        if i in fixed or not isinstance(given, torch.Tensor) or \
                not isinstance(val, torch.Tensor) or given.dim() == 0:
            out.append(given)  # (a one-number tensor: a Python number dynamo lifted)
            continue
        shape = [_size_at(d, binding, sympy) if isinstance(d, torch.SymInt) else int(d)
                 for d in val.shape]
        if given.is_floating_point():
            out.append(torch.randn(shape, generator=generator, dtype=given.dtype)
                       .to(given.device))
        else:
            flat = given.flatten()
            count = 1
            for d in shape:
                count *= d
            index = torch.arange(count, device=given.device) % max(flat.numel(), 1)
            out.append(flat[index].reshape(shape).clone())
    return out


def _size_at(size: torch.SymInt, binding: Binding, sympy: Any) -> int:
    expr = size.node.expr
    value = expr.xreplace({s: sympy.Integer(binding[s.name]) for s in expr.free_symbols
                           if s.name in binding})
    if not value.is_Integer:
        raise GraphsubError(f"size {expr} has no value at {binding}")
    return int(value)
