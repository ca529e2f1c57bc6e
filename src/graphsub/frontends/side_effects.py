"""Programs that write into their inputs: a static key/value cache filled with `index_copy_`,
a step counter advanced with `add_`, running statistics, an in-place operation on an argument.

torch.compile hands the backend such a program with its writes in it, and the backend runs
the program many times while compiling (tracing, shapes, checks, the race). Each of those
runs on the user's tensors would write them again: a cache filled at the next position, a
counter advanced once per run, the user's next call reading state that no eager run would
have made. So the backend
- finds the writes before it runs anything (`find_writes`: the program traced on fake tensors
  and functionalized, where every write into an input becomes one `copy_` into its
  placeholder at the end);
- optimizes the program without them (`without_writes`: the value each written input ends
  with is returned after the outputs), which it may run on the user's tensors as often as it
  likes, since nothing is written;
- hands back dynamo's own graph with the rewrites spliced in (fx_splice), whose writes are
  where the program makes them; and
- runs what writes (the checks, the race) only on private copies (`PrivateInputs`),
  restored to the values the user gave before every run, so that every run sees the state
  the user's own call will see.

Copies are made outside inference mode: under `torch.inference_mode()` the user's tensors are
inference tensors, which nothing outside that mode may write, and torch.compile calls its
backend outside it.
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from graphsub.errors import GraphsubError

_ATEN = torch.ops.aten
@dataclass(frozen=True)
class Writes:
    """The inputs a captured program writes into: their positions among its inputs (in
    order) and the names torch.compile gave them (for the report)."""

    positions: tuple[int, ...] = ()
    names: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.positions)


def find_writes(gm: fx.GraphModule, example_inputs: Sequence[Any],
                dynamic: bool = False) -> Writes:
    """Which inputs the program writes into, found without running it on a real tensor.

    A look at dynamo's graph first (`may_write_inputs`): most graphs write no input, and
    those are done with at once. The others are traced on fake tensors and functionalized
    (every write into an input, through any view, becomes a `copy_` of its final value into
    the input's placeholder). The fake tensors have a mode of their own, outside the
    compilation under way: dynamo's shape environment must not gain guards from this trace.

    Refused (GraphsubError, before anything runs): writes functionalization does not show
    (batch norm's running statistics in training mode), and writes into the inputs of a graph
    with dynamic sizes."""
    for node in gm.graph.nodes:
        if _quietly_written(node):
            raise GraphsubError(
                f"{node.target.__name__} writes into its arguments here (batch statistics, "
                f"a renormalized weight): graphsub optimizes inference; call model.eval() "
                f"(or leave max_norm unset) for it to optimize this graph")
    if not may_write_inputs(gm):
        return Writes()
    if dynamic:
        raise GraphsubError("with dynamic sizes graphsub does not optimize graphs that write "
                            "into tensors in place")
    from torch._guards import tracing
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with tracing(None), mode, torch.no_grad():
        fakes = [mode.from_tensor(x, static_shapes=True) if isinstance(x, torch.Tensor) else x
                 for x in example_inputs]
        traced = make_fx(torch.func.functionalize(gm, remove="mutations_and_views"),
                         decomposition_table={})(*fakes)
    positions = written_inputs(traced)
    names = [n.name for n in gm.graph.find_nodes(op="placeholder")]
    return Writes(positions, tuple(names[i] for i in positions))


#: Python's augmented assignments, which dynamo records as calls of these.
_AUGMENTED = frozenset({operator.iadd, operator.isub, operator.imul, operator.itruediv,
                        operator.ifloordiv, operator.imod, operator.ipow, operator.imatmul,
                        operator.iand, operator.ior, operator.ixor, operator.ilshift,
                        operator.irshift, operator.setitem})


def may_write_inputs(gm: fx.GraphModule) -> bool:
    """Whether some operation of dynamo's graph may write into one of its inputs: an
    in-place operation (a method or function named with a trailing underscore, an augmented
    assignment, `x[i] = v`, `inplace=True`, `out=`, an operator whose schema writes, a module
    call) on a tensor that shares its storage with an input, as dynamo's example values tell.
    Unsure is yes: the trace then decides."""
    inputs = set()
    for node in gm.graph.find_nodes(op="placeholder"):
        value = node.meta.get("example_value")
        if isinstance(value, torch.Tensor):
            inputs.add(_storage(value))
        elif value is None:
            return True
    for node in gm.graph.nodes:
        for arg in possibly_written(gm, node):
            value = arg.meta.get("example_value") if isinstance(arg, fx.Node) else None
            if not isinstance(value, torch.Tensor) or _storage(value) in inputs:
                return True
    return False


def _storage(t: torch.Tensor) -> Any:
    from torch.multiprocessing.reductions import StorageWeakRef

    # (unannotated; with torch absent, Any: the ignore is unused there)
    return StorageWeakRef(t.untyped_storage())  # type: ignore[no-untyped-call, unused-ignore]


def possibly_written(gm: fx.GraphModule, node: fx.Node) -> list[Any]:
    """The arguments this node of dynamo's graph may write into."""
    if node.op == "call_module":
        return list(node.all_input_nodes) or [None]
    if node.op not in ("call_method", "call_function"):
        return []
    target = node.target
    name = target if isinstance(target, str) else getattr(target, "__name__", "")
    first = node.args[:1]
    written: list[Any] = []
    if target in _AUGMENTED or (name.endswith("_") and not name.endswith("__")) or \
            (name.startswith("__i") and name.endswith("__")) or name == "__setitem__":
        written += first
    if node.kwargs.get("inplace") is True or (node.op == "call_function"
                                              and _inplace_by_position(node)):
        written += first
    if "out" in node.kwargs:
        out = node.kwargs["out"]
        written += list(out) if isinstance(out, (tuple, list)) else [out]
    schema = getattr(target, "_schema", None)
    if schema is not None and schema.is_mutable:
        written += list(node.all_input_nodes) or [None]
    return written + _quietly_written(node)


def _inplace_by_position(node: fx.Node) -> bool:
    """Whether a function with an `inplace` parameter gets it true by position
    (`F.relu(x, True)`)."""
    bound = _bound(node)
    return bound is not None and bound.get("inplace") is True


#: Functions that write into an argument without saying so in their name, by the parameter
#: that makes them write and its position: batch and instance norm update their running
#: statistics when they compute with the batch's, and an embedding with `max_norm`
#: renormalizes its weight in place.
_QUIET_WRITERS = {"batch_norm": ("training", 5), "instance_norm": ("use_input_stats", 5),
                  "embedding": ("max_norm", 3)}


def _quietly_written(node: fx.Node) -> list[Any]:
    """The arguments a function of `_QUIET_WRITERS` writes on this call."""
    name = getattr(node.target, "__name__", "")
    if node.op != "call_function" or name not in _QUIET_WRITERS:
        return []
    flag, position = _QUIET_WRITERS[name]
    bound = _bound(node)
    if bound is not None:
        value = bound.get(flag)
    else:  # a builtin (torch.batch_norm): its arguments by position
        value = node.kwargs.get(flag, node.args[position] if len(node.args) > position else None)
    return list(node.all_input_nodes) if value not in (None, False) else []


def _bound(node: fx.Node) -> dict[str, Any] | None:
    """The call's arguments by parameter name (None where the function's signature cannot
    be read or does not take them)."""
    import inspect

    if isinstance(node.target, str):  # a method's or a module's name: no signature
        return None
    try:
        return dict(inspect.signature(node.target).bind(*node.args, **node.kwargs).arguments)
    except (TypeError, ValueError):
        return None


def written_inputs(gm: fx.GraphModule) -> tuple[int, ...]:
    """The positions of the placeholders a functionalized ATen graph writes (the
    destinations of its `copy_`s). A graph that changes an input any other way (its size,
    its strides) is refused: graphsub keeps writes of values only."""
    for node in gm.graph.nodes:
        schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
        if schema is None or not schema.is_mutable or node.target is _ATEN.copy_.default:
            continue
        for arg, spec in zip(node.args, schema.arguments):
            if spec.alias_info is not None and spec.alias_info.is_write and \
                    isinstance(arg, fx.Node) and arg.op == "placeholder":
                raise GraphsubError(f"the graph changes its input {arg.name} with "
                                    f"{node.target}, which graphsub does not keep")
    return tuple(sorted(_writes_of(gm.graph)))


def _writes_of(graph: fx.Graph) -> dict[int, fx.Node]:
    """The `copy_` nodes writing into placeholders, by placeholder position."""
    placeholders = list(graph.find_nodes(op="placeholder"))
    return {placeholders.index(n.args[0]): n
            for n in graph.find_nodes(op="call_function", target=_ATEN.copy_.default)
            if isinstance(n.args[0], fx.Node) and n.args[0].op == "placeholder"}


def without_writes(gm: fx.GraphModule, writes: Writes) -> fx.GraphModule:
    """The functionalized program with its writes taken out: it returns its outputs, then the
    value each written input ends with (in `writes`' order), and changes nothing."""
    graph = copy.deepcopy(gm.graph)
    copies = _writes_of(graph)
    if sorted(copies) != list(writes.positions):
        raise GraphsubError(f"the graph writes inputs {sorted(copies)} where tracing it on "
                            f"fake tensors found {list(writes.positions)}")
    if not writes:
        return gm
    output = graph.output_node()
    outputs = output.args[0]
    if not isinstance(outputs, (tuple, list)):
        raise GraphsubError("a graph that writes into its inputs returns a tuple")
    final = [copies[i].args[1] for i in writes.positions]
    for node in copies.values():
        graph.erase_node(node)
    output.args = (tuple(outputs) + tuple(final),)
    graph.lint()
    return fx.GraphModule(gm, graph)


def private_copy(t: Any) -> Any:
    """A copy of a tensor that graphsub may write, whatever mode the user is in."""
    if not isinstance(t, torch.Tensor):
        return t
    with torch.inference_mode(False), torch.no_grad():
        return t.detach().clone(memory_format=torch.preserve_format)


class PrivateInputs:
    """A program's inputs for graphsub's own runs of what writes: the written tensors are
    copies, never the user's, and hold the values the user gave before every run."""

    def __init__(self, inputs: Sequence[Any], writes: Writes) -> None:
        self.inputs = list(inputs)
        self.writes = writes
        self._given = {i: private_copy(inputs[i]) for i in writes.positions}

    def fresh(self) -> list[Any]:
        """A set of inputs with copies of their own (for one run)."""
        out = list(self.inputs)
        for i, value in self._given.items():
            out[i] = private_copy(value)
        return out

    def restorer(self, args: list[Any]) -> Callable[[], None] | None:
        """What puts the given values back into `args`' written tensors (None where nothing is
        written): called before each timed run, outside its time."""
        if not self._given:
            return None
        pairs = [(args[i], value) for i, value in self._given.items()]

        def restore() -> None:
            with torch.no_grad():
                for target, value in pairs:
                    target.copy_(value)

        return restore


def returning_writes(fn: Callable[..., Any], writes: Writes) -> Callable[..., tuple[Any, ...]]:
    """`fn` run on copies of the tensors it writes, returning its outputs and then what it
    left in each of them: the whole effect of a call, to compare two programs by."""
    def call(*args: Any) -> tuple[Any, ...]:
        run_args = list(args)
        for i in writes.positions:
            run_args[i] = private_copy(args[i])
        outs = fn(*run_args)
        outs = tuple(outs) if isinstance(outs, (tuple, list)) else (outs,)
        return outs + tuple(run_args[i] for i in writes.positions)

    return call
