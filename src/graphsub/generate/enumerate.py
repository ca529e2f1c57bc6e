"""Step 1 of TASO's generator (Algorithm 1): enumerate every acyclic graph of up to N
operators over a set of input tensors, without duplicated computation, and index them by a
fingerprint of their outputs.

Graphs are built depth-first, one operator at a time, from the inputs and the outputs of the
operators already placed. A graph is recorded once however many orders reach it (its key is
the set of its operators' structural keys). The fingerprint hashes each output tensor's shape
and exact integer content (hash1) and combines them with a hash that ignores their order
(hash2), so graphs equal up to a permutation of outputs collide as they should.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphsub.generate.opset import DEFAULT_OPS, OPS, PRIME, GenTensor
from graphsub.rules.ast import AVar, Call, Lit


@dataclass(frozen=True)
class GenNode:
    op: str                      # key into OPS
    attrs: tuple[tuple[str, Any], ...]
    inputs: tuple[int, ...]      # tensor ids
    outputs: tuple[int, ...]     # tensor ids


@dataclass(frozen=True)
class GenGraph:
    """One enumerated graph: its nodes, its outputs (produced, not consumed) and the tensors
    it can refer to (inputs first)."""

    nodes: tuple[GenNode, ...]
    outputs: tuple[int, ...]
    tensors: tuple[GenTensor, ...]
    input_names: tuple[str, ...]

    @property
    def size(self) -> int:
        return len(self.nodes)

    def used_inputs(self) -> frozenset[int]:
        return frozenset(i for n in self.nodes for i in n.inputs if i < len(self.input_names))


def hash1(t: GenTensor) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    h.update(repr(t.shape).encode())
    h.update(np.ascontiguousarray(t.exact, dtype=np.int64).tobytes())
    return h.digest()


def fingerprint(outputs: Sequence[GenTensor]) -> bytes:
    """hash2 over the outputs' hash1 values: symmetric, so the order of outputs is irrelevant."""
    h = hashlib.blake2b(digest_size=16)
    for d in sorted(hash1(t) for t in outputs):
        h.update(d)
    return h.digest()


def make_inputs(shapes: Mapping[str, tuple[int, ...]], tests: int = 2,
                seed: int = 0) -> list[GenTensor]:
    """Input tensors: random residues for fingerprints, uniform [-1, 1] floats for tests."""
    rng = np.random.default_rng(seed)
    out = []
    for name, shape in shapes.items():
        exact = rng.integers(0, PRIME, size=shape, dtype=np.int64)
        floats = tuple(rng.uniform(-1, 1, size=shape) for _ in range(tests))
        dims = tuple(Call("dim", (AVar(name), Lit(i))) for i in range(len(shape)))
        out.append(GenTensor(tuple(shape), np.asarray(exact), floats, dims))
    return out


@dataclass
class Enumeration:
    """The result of step 1: graphs by fingerprint, and how many of each size."""

    by_fingerprint: dict[bytes, list[GenGraph]] = field(default_factory=dict)
    counts: dict[int, int] = field(default_factory=dict)  # graphs recorded, by operator count

    @property
    def total(self) -> int:
        return sum(self.counts.values())


class Enumerator:
    def __init__(self, input_shapes: Mapping[str, tuple[int, ...]], max_ops: int,
                 ops: Sequence[str] = DEFAULT_OPS, tests: int = 2, seed: int = 0) -> None:
        unknown = set(ops) - set(OPS)
        if unknown:
            raise ValueError(f"unknown generator operators {sorted(unknown)}; known: {sorted(OPS)}")
        self.names = tuple(input_shapes)
        self.inputs = make_inputs(input_shapes, tests, seed)
        self.max_ops = max_ops
        self.ops = tuple(ops)

    def run(self) -> Enumeration:
        result = Enumeration()
        seen: set[frozenset[Any]] = set()
        tensors = list(self.inputs)
        # structural key of every tensor, by id: inputs are their names
        keys: list[Any] = list(self.names)
        self._build([], tensors, keys, set(), seen, result)
        return result

    def _candidates(self, tensors: list[GenTensor]) -> Iterator[tuple[str, dict[str, Any], tuple[int, ...]]]:
        n = len(tensors)
        for name in self.ops:
            op = OPS[name]
            for attrs in op.attr_variants:
                combos = (itertools.combinations_with_replacement(range(n), op.arity)
                          if op.commutative else itertools.product(range(n), repeat=op.arity))
                for ins in combos:
                    if op.valid([tensors[i] for i in ins], attrs):
                        yield name, attrs, ins

    def _apply(self, name: str, attrs: dict[str, Any], ins: Sequence[GenTensor]) -> list[GenTensor]:
        op = OPS[name]
        if op.kernel is None:
            return _split(ins[0], attrs["axis"])
        exact = op.kernel([t.exact for t in ins], attrs, True)
        tests = [op.kernel([t.tests[k] for t in ins], attrs, False) for k in range(len(ins[0].tests))]
        seams = op.seams(ins, attrs)
        dims = op.dims(ins, attrs)
        return [GenTensor(tuple(exact[o].shape), exact[o], tuple(t[o] for t in tests), dims[o],
                          seams[o]) for o in range(op.outputs)]

    def _build(self, nodes: list[GenNode], tensors: list[GenTensor], keys: list[Any],
               node_keys: set[Any], seen: set[frozenset[Any]], result: Enumeration) -> None:
        if nodes:
            graph_key = frozenset(node_keys)
            if graph_key not in seen:
                seen.add(graph_key)
                consumed = {i for n in nodes for i in n.inputs}
                outputs = tuple(o for n in nodes for o in n.outputs if o not in consumed)
                g = GenGraph(tuple(nodes), outputs, tuple(tensors), self.names)
                fp = fingerprint([tensors[o] for o in outputs])
                result.by_fingerprint.setdefault(fp, []).append(g)
                result.counts[len(nodes)] = result.counts.get(len(nodes), 0) + 1
        if len(nodes) >= self.max_ops:
            return
        for name, attrs, ins in list(self._candidates(tensors)):
            in_keys = tuple(keys[i] for i in ins)
            if OPS[name].commutative:
                in_keys = tuple(sorted(in_keys, key=repr))  # add(a, b) is add(b, a)
            node_key = (name, tuple(sorted(attrs.items())), in_keys)
            if node_key in node_keys:
                continue  # duplicated computation: the same op on the same tensors
            outs = self._apply(name, attrs, [tensors[i] for i in ins])
            first = len(tensors)
            ids = tuple(range(first, first + len(outs)))
            tensors.extend(outs)
            keys.extend((node_key, o) for o in range(len(outs)))
            nodes.append(GenNode(name, tuple(sorted(attrs.items())), ins, ids))
            node_keys.add(node_key)
            self._build(nodes, tensors, keys, node_keys, seen, result)
            node_keys.discard(node_key)
            nodes.pop()
            del tensors[first:]
            del keys[first:]


def _split(t: GenTensor, axis: int) -> list[GenTensor]:
    """Cut at the tensor's one seam on `axis` (split_{0,1} of TASO)."""
    ((pos, expr),) = t.seams_on(axis)
    parts = []
    for lo, hi, size in ((0, pos, expr), (pos, t.shape[axis], Call("-", (t.dims[axis], expr)))):
        sl = [slice(None)] * len(t.shape)
        sl[axis] = slice(lo, hi)
        dims = list(t.dims)
        dims[axis] = size
        seams = [s if i != axis else () for i, s in enumerate(t.seams)]
        parts.append(GenTensor(tuple(t.exact[tuple(sl)].shape), t.exact[tuple(sl)].copy(),
                               tuple(x[tuple(sl)].copy() for x in t.tests), tuple(dims),
                               tuple(seams)))
    return parts
