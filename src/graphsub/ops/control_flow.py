"""The subgraphs of ONNX control flow (If, Loop, Scan and any op with a graph attribute).

A body may read values of the scopes around it by name, without listing them as inputs. An
opaque node that holds bodies lists those names (its "captures") as extra inputs, so that the
graph around it knows what the node depends on, keeps the values alive and orders the node
after them; when the node is written back, the bodies' references are renamed to whatever
names the writer gave those values. ONNX asks every value name to be assigned once across a
model and all its subgraphs, so a body's own names never shadow an outer one, and renaming
the free names is enough.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import onnx


def subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    """The node's bodies (its GRAPH and GRAPHS attributes), not those nested inside them."""
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == onnx.AttributeProto.GRAPHS:
            yield from attr.graphs


def all_graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """The graph and every body nested in it, outer first (a body reads the values of the
    graphs around it by name)."""
    yield graph
    for node in graph.node:
        for body in subgraphs(node):
            yield from all_graphs(body)


def has_subgraphs(node: onnx.NodeProto) -> bool:
    return next(subgraphs(node), None) is not None


def _defined(graph: onnx.GraphProto, into: set[str]) -> None:
    into.update(i.name for i in graph.input)
    into.update(i.name for i in graph.initializer)
    into.update(s.values.name for s in graph.sparse_initializer)
    for node in graph.node:
        into.update(o for o in node.output if o)
        for body in subgraphs(node):
            _defined(body, into)


def defined_names(node: onnx.NodeProto) -> set[str]:
    """Every value name assigned inside the node's bodies, at any depth."""
    names: set[str] = set()
    for body in subgraphs(node):
        _defined(body, names)
    return names


def _referenced(graph: onnx.GraphProto, into: dict[str, None]) -> None:
    for node in graph.node:
        into.update(dict.fromkeys(n for n in node.input if n))
        for body in subgraphs(node):
            _referenced(body, into)
    into.update(dict.fromkeys(o.name for o in graph.output))


def captured_names(node: onnx.NodeProto) -> tuple[str, ...]:
    """The outer values the node's bodies read, in the order they first appear."""
    referenced: dict[str, None] = {}
    for body in subgraphs(node):
        _referenced(body, referenced)
    inner = defined_names(node)
    return tuple(n for n in referenced if n not in inner)


def _rename(graph: onnx.GraphProto, mapping: Mapping[str, str]) -> None:
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name in mapping:
                node.input[i] = mapping[name]
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                _rename(attr.g, mapping)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for body in attr.graphs:
                    _rename(body, mapping)
    for out in graph.output:
        if out.name in mapping:
            out.name = mapping[out.name]


def rename_captures(node: onnx.NodeProto, mapping: Mapping[str, str]) -> None:
    """Rename, in place, the bodies' references to outer values (`mapping`: old -> new)."""
    mapping = {old: new for old, new in mapping.items() if old != new}
    if mapping:
        for body in subgraphs(node):
            _rename(body, mapping)
