"""Structural hashing: a Merkle hash per node, combined over the graph's interface.

A node's digest covers its op, attributes, output types and the digests of the nodes it reads
(with output indices), never its id, so renumbering nodes or adding them in another order does
not change the hash, while any change of op, attribute, shape, weight or edge does.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from typing import Any

from graphsub.ir.node import Node
from graphsub.ir.view import GraphView
from graphsub.ops import all_ops
from graphsub.tensors.types import Attrs, Constant


def _encode(value: Any) -> str:
    if isinstance(value, Constant):
        return "C" + value.digest.hex()
    if isinstance(value, tuple):
        return "(" + ",".join(_encode(v) for v in value) + ")"
    if isinstance(value, bytes):
        return "B" + hashlib.blake2b(value, digest_size=16).hexdigest()
    return repr(value)


def attrs_key(attrs: Attrs) -> str:
    """A canonical text form of attributes (cached on the immutable Attrs object)."""
    key = attrs._key
    if key is None:
        key = ";".join(f"{k}={_encode(v)}" for k, v in attrs.items_sorted())
        attrs._key = key
    return key


def node_digest(node: Node, input_digests: list[bytes]) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    h.update(node.op.encode())
    h.update(b"|")
    h.update(attrs_key(node.attrs).encode())
    h.update(b"|")
    for t in node.outputs:
        h.update(t.dtype.encode())
        h.update(_shape_text(t.shape))
    edges = [d + v.index.to_bytes(2, "little") for v, d in zip(node.inputs, input_digests)]
    if node.op in commutative_ops():
        edges.sort()  # add(x, y) and add(y, x) are the same computation
    for e in edges:
        h.update(e)
    return h.digest()


@lru_cache(maxsize=1 << 16)
def _shape_text(shape: tuple[Any, ...]) -> bytes:
    """A shape as text, once per distinct shape: printing a symbolic size is slow in sympy
    (a Paddle2ONNX recognizer's sizes are nested floors, 4 ms each), and thousands of nodes
    share a few shapes."""
    return str(shape).encode()


@lru_cache(maxsize=1)
def commutative_ops() -> frozenset[str]:
    return frozenset(name for name, op in all_ops().items() if op.commutative)


def node_digests(graph: GraphView) -> dict[int, bytes]:
    """The Merkle digest of every live node, by id (`Graph.node_digests` keeps them, so this
    runs once per graph).

    A graph made by editing another reuses the other's digest for every node that is the same
    object reading inputs whose digests did not change, so hashing after a small rewrite costs
    a walk over the ids, not a hash per node.
    """
    parent = graph.delta.parent if graph.delta is not None else None
    old = parent.node_digests() if parent is not None else {}
    old_nodes = parent.nodes if parent is not None else {}
    digests: dict[int, bytes] = {}
    nodes = graph.nodes
    for nid in graph.topo_order():
        node = nodes[nid]
        if old_nodes.get(nid) is node and all(digests[v.node] == old.get(v.node)
                                              for v in node.inputs):
            digests[nid] = old[nid]
        else:
            digests[nid] = node_digest(node, [digests[v.node] for v in node.inputs])
    return digests


def graph_hash(graph: GraphView) -> str:
    digests = graph.node_digests()
    h = hashlib.blake2b(digest_size=16)
    for i in graph.inputs:
        h.update(digests[i])
    for name, v in zip(graph.output_names, graph.outputs):
        h.update(digests[v.node])
        h.update(f"{v.index}:{name};".encode())
    return h.hexdigest()
