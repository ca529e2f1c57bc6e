"""Shrink a failing ONNX model to a small one that still fails the same way.

Greedy delta debugging over the ONNX graph: each step proposes a smaller model, keeps it when
it is still valid (onnx.checker + onnxruntime, finite outputs) and the caller's predicate says
it still fails, and the passes repeat until none makes progress or time runs out. Steps, from
the largest cut to the smallest:

1. keep a single graph output (or drop one), or make one node's output the only output (cut
   the graph after it), then remove what no output reads;
2. remove a node, rewiring what read its outputs to one of its inputs of the same shape
   (an identity-like cut that keeps the rest of the graph) or else to a new graph input;
3. replace a float initializer by a graph input of its shape (rules that need weights then
   stop matching, which tells whether the weight matters).

`minimize_rules` does the same for a rule list: the fewest rules with which a search still
produces a wrong graph, which names the culprit rule.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

import onnx
from onnx import TensorProto, helper

from graphsub.fuzz.models import InvalidModel, validate

Predicate = Callable[[onnx.ModelProto], bool]
T = TypeVar("T")


def minimize(model: onnx.ModelProto, still_fails: Predicate, max_seconds: float = 60.0,
             seed: int = 0) -> onnx.ModelProto:
    """The smallest model found that is valid and for which `still_fails` holds (the model
    itself when no step keeps the failure). `still_fails(model)` should be True for the
    model given; exceptions it raises count as False."""
    deadline = time.monotonic() + max_seconds
    best = _prune(model)
    if not _keeps(best, still_fails, seed):
        best = model
    progress = True
    while progress and time.monotonic() < deadline:
        progress = False
        for candidate in _steps(best):
            if time.monotonic() >= deadline:
                break
            if _size(candidate) < _size(best) and _keeps(candidate, still_fails, seed):
                best, progress = candidate, True
                break
    return best


def minimize_rules(rules: Sequence[T], still_fails: Callable[[list[T]], bool],
                   max_seconds: float = 60.0) -> list[T]:
    """The fewest rules (greedily: halves first, then one at a time) with which
    `still_fails` holds; `rules` itself when no smaller list keeps it."""
    deadline = time.monotonic() + max_seconds
    best = list(rules)
    chunk = max(len(best) // 2, 1)
    while chunk >= 1 and time.monotonic() < deadline:
        removed = False
        for start in range(0, len(best), chunk):
            trial = best[:start] + best[start + chunk:]
            if trial and time.monotonic() < deadline and _safe(still_fails, trial):
                best, removed = trial, True
                break
        if not removed:
            chunk //= 2
    return best


def _safe(predicate: Callable[[T], bool], value: T) -> bool:
    """The predicate's answer; a predicate that crashes on a candidate does not confirm the
    failure, which the warning says (a crash of another kind may be a finding of its own)."""
    try:
        return bool(predicate(value))
    except Exception as exc:  # noqa: BLE001 (the caller's predicate may raise anything)
        warnings.warn(f"the minimizer's predicate raised {type(exc).__name__} on a candidate "
                      f"({str(exc)[:200]}); the candidate counts as not failing",
                      RuntimeWarning, stacklevel=2)
        return False


def _keeps(model: onnx.ModelProto, still_fails: Predicate, seed: int) -> bool:
    try:
        validate(model, seed)
    except InvalidModel:
        return False
    return _safe(still_fails, model)


def _size(model: onnx.ModelProto) -> tuple[int, int, int, int]:
    g = model.graph
    return len(g.node), len(g.output), len(g.initializer), len(g.input)


# ---- steps ------------------------------------------------------------------------------

def _steps(model: onnx.ModelProto) -> Iterator[onnx.ModelProto]:
    """Candidate smaller models, the biggest cuts first."""
    outputs = list(model.graph.output)
    if len(outputs) > 1:
        for keep in outputs:
            yield _prune(_with_outputs(model, [keep]))
        for drop in outputs:
            yield _prune(_with_outputs(model, [o for o in outputs if o is not drop]))
    shapes = _value_shapes(model)
    for node in model.graph.node:
        if node.output[0] not in {o.name for o in outputs} and node.output[0] in shapes:
            yield _prune(_with_outputs(model, [_value_info(node.output[0], shapes)]))
    for index in reversed(range(len(model.graph.node))):
        yield from _remove_node(model, index, shapes)
    for init in model.graph.initializer:
        if init.data_type == TensorProto.FLOAT:
            yield _prune(_initializer_as_input(model, init.name))


def _value_info(name: str, shapes: dict[str, tuple[tuple[int, ...], int]]) -> onnx.ValueInfoProto:
    dims, elem = shapes[name]
    return helper.make_tensor_value_info(name, elem, list(dims))


def _with_outputs(model: onnx.ModelProto,
                  outputs: Sequence[onnx.ValueInfoProto]) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.output[:]
    out.graph.output.extend(outputs)
    return out


def _remove_node(model: onnx.ModelProto, index: int,
                 shapes: dict[str, tuple[tuple[int, ...], int]]) -> Iterator[onnx.ModelProto]:
    """The model without node `index`: its outputs replaced by one of its inputs of the same
    shape and type (each such input in turn), else by new graph inputs."""
    node = model.graph.node[index]
    outputs = [o for o in node.output if o]
    if any(o not in shapes for o in outputs):
        return
    same = [i for i in dict.fromkeys(node.input)
            if i and all(shapes.get(i) == shapes[o] for o in outputs)]
    for source in same:
        yield _prune(_replace_node(model, index, {o: source for o in outputs}))
    if any(shapes[o][1] != TensorProto.FLOAT for o in outputs):
        return
    yield _prune(_replace_node(model, index, {o: None for o in outputs}, shapes))


def _replace_node(model: onnx.ModelProto, index: int, mapping: dict[str, str | None],
                  shapes: dict[str, tuple[tuple[int, ...], int]] | None = None) -> onnx.ModelProto:
    """Remove node `index`; each of its outputs becomes mapping[output], or a new graph input
    of the same name when that is None (so nothing else needs renaming)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    del g.node[index]
    renames = {k: v for k, v in mapping.items() if v is not None}
    for n in g.node:
        for i, name in enumerate(n.input):
            if name in renames:
                n.input[i] = renames[name]
    # A graph output that was removed becomes its replacement (once: names stay unique).
    outputs: list[onnx.ValueInfoProto] = []
    for o in g.output:
        o.name = renames.get(o.name, o.name)
        if all(o.name != kept.name for kept in outputs):
            outputs.append(o)
    del g.output[:]
    g.output.extend(outputs)
    for name, source in mapping.items():
        if source is None and shapes is not None:
            g.input.append(_value_info(name, shapes))
    return out


def _initializer_as_input(model: onnx.ModelProto, name: str) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    init = next(i for i in g.initializer if i.name == name)
    g.input.append(helper.make_tensor_value_info(name, init.data_type, list(init.dims)))
    g.initializer.remove(init)
    return out


def _prune(model: onnx.ModelProto) -> onnx.ModelProto:
    """Drop the nodes, initializers and inputs no graph output depends on (inputs that are
    outputs stay)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    needed = {o.name for o in g.output}
    keep = []
    for node in reversed(list(g.node)):
        if any(o in needed for o in node.output):
            keep.append(node)
            needed.update(i for i in node.input if i)
    keep.reverse()
    del g.node[:]
    g.node.extend(keep)
    inits = [i for i in g.initializer if i.name in needed]
    del g.initializer[:]
    g.initializer.extend(inits)
    inputs = [i for i in g.input if i.name in needed]
    del g.input[:]
    g.input.extend(inputs)
    return out


def _value_shapes(model: onnx.ModelProto) -> dict[str, tuple[tuple[int, ...], int]]:
    """Static shape and element type of every value, from ONNX shape inference."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError):
        return {}  # no shapes known: the steps that need them propose nothing
    g = inferred.graph
    out: dict[str, tuple[tuple[int, ...], int]] = {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        tt = vi.type.tensor_type
        if tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
            out[vi.name] = (tuple(d.dim_value for d in tt.shape.dim), tt.elem_type)
    for init in g.initializer:
        out[init.name] = (tuple(init.dims), init.data_type)
    return out
