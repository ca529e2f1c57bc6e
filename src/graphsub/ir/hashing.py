"""Structural hashing: a Merkle hash per node, combined over the graph's interface.

A node's digest covers its op, attributes, output types and the digests of the nodes it reads
(with output indices), never its id, so renumbering nodes or adding them in another order does
not change the hash, while any change of op, attribute, shape, weight or edge does.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

from graphsub.ir.types import Attrs, Constant

if TYPE_CHECKING:
    from graphsub.ir.graph import Graph, Node


def _encode(value: Any) -> str:
    if isinstance(value, Constant):
        return "C" + value.digest.hex()
    if isinstance(value, tuple):
        return "(" + ",".join(_encode(v) for v in value) + ")"
    if isinstance(value, bytes):
        return "B" + hashlib.blake2b(value, digest_size=16).hexdigest()
    return repr(value)


def attrs_key(attrs: Attrs) -> str:
    return ";".join(f"{k}={_encode(v)}" for k, v in attrs.items_sorted())


def node_digest(node: Node, input_digests: list[bytes]) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    h.update(node.op.encode())
    h.update(b"|")
    h.update(attrs_key(node.attrs).encode())
    h.update(b"|")
    for t in node.outputs:
        h.update(f"{t.dtype}{t.shape}".encode())
    for v, d in zip(node.inputs, input_digests):
        h.update(d)
        h.update(v.index.to_bytes(2, "little"))
    return h.digest()


def node_digests(graph: Graph) -> dict[int, bytes]:
    """The Merkle digest of every live node, by id."""
    digests: dict[int, bytes] = {}
    nodes = graph.nodes
    for nid in graph.topo_order():
        node = nodes[nid]
        digests[nid] = node_digest(node, [digests[v.node] for v in node.inputs])
    return digests


def graph_hash(graph: Graph) -> str:
    digests = node_digests(graph)
    h = hashlib.blake2b(digest_size=16)
    for i in graph.inputs:
        h.update(digests[i])
    for name, v in zip(graph.output_names, graph.outputs):
        h.update(digests[v.node])
        h.update(f"{v.index}:{name};".encode())
    return h.hexdigest()
