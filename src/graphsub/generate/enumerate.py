"""Step 1 of TASO's generator (Algorithm 1): enumerate every acyclic graph of up to N
operators over a set of input tensors, without duplicated computation, and index the graphs by
a fingerprint of their outputs.

Graphs are built depth-first, one operator at a time, from the inputs and the outputs of the
operators already placed. Each graph is built in exactly one order, its *canonical* order:
at every step the operator placed is the one with the smallest structural key among those
whose inputs exist. A prefix that is not canonical cannot be extended into a canonical
sequence, so its whole subtree is skipped; no table of visited graphs is needed, and the
enumeration splits into independent tasks by first operator (the first operator of the
canonical order owns the graph). As in TASO, a graph that computes a tensor equal to one it
already has is pruned (the same computation twice), and the same operator on the same inputs
is never placed twice.

The fingerprint hashes each output tensor's shape and exact integer content (hash1) and
combines them with a hash that ignores their order (hash2), so graphs equal up to a
permutation of outputs collide as they should. Float values are computed only when a graph
is replayed for testing, that is, when it shares its fingerprint with another graph.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphsub.generate.opset import (CONSTANTS, DEFAULT_OPS, OPS, PRIME, GenOp, GenTensor,
                                     _freeze, float_eval, infers)
from graphsub.rules.ast import AVar, Call, Lit

#: A graph as the enumerator stores it: (operator key, attribute variant, input tensor ids) per
#: node, in canonical order. Tensor ids count the inputs first, then node outputs in order.
Encoded = tuple[tuple[str, int, tuple[int, ...]], ...]
Sink = Callable[[bytes, Encoded], None]


@dataclass(frozen=True)
class GeneratorInput:
    """An input tensor of the enumeration, or one of TASO's constant tensors (`constant` names
    the kind, `params` its parameters)."""

    name: str
    shape: tuple[int, ...]
    constant: str | None = None
    params: tuple[tuple[str, Any], ...] = ()
    kernel: bool = False  # a convolution kernel: never a convolution's data (TASO's "w" inputs)


@dataclass(frozen=True)
class GenNode:
    op: str                      # key into OPS
    attrs: tuple[tuple[str, Any], ...]
    inputs: tuple[int, ...]      # tensor ids
    outputs: tuple[int, ...]     # tensor ids


@dataclass(frozen=True)
class GenGraph:
    """One enumerated graph, replayed: its nodes, its outputs (produced, not consumed) and all
    its tensors (inputs first), with float test values."""

    nodes: tuple[GenNode, ...]
    outputs: tuple[int, ...]
    tensors: tuple[GenTensor, ...]
    inputs: tuple[GeneratorInput, ...]

    @property
    def size(self) -> int:
        return len(self.nodes)

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(i.name for i in self.inputs)

    def used_inputs(self) -> frozenset[int]:
        return frozenset(i for n in self.nodes for i in n.inputs if i < len(self.inputs))


def hash1(t: GenTensor) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    h.update(repr(t.shape).encode())
    h.update(np.ascontiguousarray(t.exact, dtype=np.int64).tobytes())
    return h.digest()


def fingerprint(outputs: Sequence[GenTensor]) -> bytes:
    """hash2 over the outputs' hash1 values: symmetric, so the order of outputs is irrelevant."""
    return _combine(hash1(t) for t in outputs)


def _combine(digests: Iterable[bytes]) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for d in sorted(digests):
        h.update(d)
    return h.digest()


def as_specs(inputs: Mapping[str, tuple[int, ...]] | Sequence[GeneratorInput]
             ) -> tuple[GeneratorInput, ...]:
    if isinstance(inputs, Mapping):
        return tuple(GeneratorInput(name, tuple(shape)) for name, shape in inputs.items())
    return tuple(inputs)


def make_inputs(specs: Sequence[GeneratorInput], tests: int = 2, seed: int = 0) -> list[GenTensor]:
    """Input tensors: random residues for fingerprints and uniform [-1, 1] floats for tests;
    constants hold their fixed values."""
    rng = np.random.default_rng(seed)
    out = []
    for spec in specs:
        dims = tuple(Call("dim", (AVar(spec.name), Lit(i))) for i in range(len(spec.shape)))
        if spec.constant is not None:
            exact, real = CONSTANTS[spec.constant](dict(spec.params))
            out.append(GenTensor(exact.shape, np.mod(exact, PRIME), (real,) * tests,
                                 (None,) * exact.ndim, (), role="constant"))
            continue
        exact = rng.integers(0, PRIME, size=spec.shape, dtype=np.int64)
        floats = tuple(rng.uniform(-1, 1, size=spec.shape) for _ in range(tests))
        out.append(GenTensor(tuple(spec.shape), np.asarray(exact), floats, dims, (),
                             role="kernel" if spec.kernel else "data"))
    return out


@dataclass
class Enumeration:
    """Graphs by fingerprint (in memory, for small runs), and how many of each size."""

    enumerator: Enumerator
    by_fingerprint: dict[bytes, list[Encoded]] = field(default_factory=dict)
    counts: dict[int, int] = field(default_factory=dict)  # graphs recorded, by operator count

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def groups(self) -> Iterator[list[GenGraph]]:
        """Fingerprint groups with more than one graph, replayed with float values."""
        for group in self.by_fingerprint.values():
            if len(group) > 1:
                yield [self.enumerator.replay(g) for g in sorted(group)]


@dataclass(frozen=True)
class _Cand:
    digest: bytes
    op: str
    variant: int
    ins: tuple[int, ...]
    ready: int  # position after the last node producing one of its inputs


class Enumerator:
    """TASO's Algorithm 1 over one set of input tensors.

    Only connected graphs are recorded (operators linked by any shared tensor, inputs
    included): a graph of unrelated pieces side by side only pairs with graphs that rewrite
    each piece on its own, so its substitutions are products of smaller ones. The exception,
    kept when `batching` is on, is two independent instances of one operator, which a target
    can batch (TASO's relu(A), relu(B) => split(relu(concat(A, B)))). A partial graph that can
    no longer become connected within N operators is not extended, and its last operator is
    not even evaluated."""

    def __init__(self, inputs: Mapping[str, tuple[int, ...]] | Sequence[GeneratorInput],
                 max_ops: int, ops: Sequence[str] = DEFAULT_OPS, tests: int = 2, seed: int = 0,
                 batching: bool = True) -> None:
        unknown = set(ops) - set(OPS)
        if unknown:
            raise ValueError(f"unknown generator operators {sorted(unknown)}; known: {sorted(OPS)}")
        self.specs = as_specs(inputs)
        self.inputs = make_inputs(self.specs, tests, seed)
        self.max_ops = max_ops
        self.ops = tuple(ops)
        self.batching = batching
        self._input_keys = [s.name.encode() for s in self.specs]
        self._frozen = {k: [_freeze(a) for a in OPS[k].attr_variants] for k in self.ops}

    # ---- candidates ----------------------------------------------------------------------

    def _valid(self, op: GenOp, v: int, ins: Sequence[GenTensor]) -> bool:
        shapes = tuple(t.shape for t in ins)
        if () in shapes and not (op.key == "smul" and shapes[1] == () and shapes[0] != ()):
            return False  # scalars only scale
        attrs = op.attr_variants[v]
        if not op.restrict(ins, attrs):
            return False
        if op.exact is None:  # split: its sizes come from the seam it cuts at
            return True
        return infers(op.op, self._frozen[op.key][v], shapes) is not None

    def _new_candidates(self, tensors: Sequence[GenTensor], keys: Sequence[bytes],
                        producer: Sequence[int], new: range) -> list[_Cand]:
        n = len(tensors)
        out = []
        for key in self.ops:
            op = OPS[key]
            for v, attrs in enumerate(op.attr_variants):
                if op.arity == 1:
                    combos: Iterator[tuple[int, ...]] = ((i,) for i in new)
                elif op.commutative:  # unordered pairs with at least one new tensor
                    combos = ((i, j) for j in new for i in range(j + 1))
                else:  # new tensors have the highest ids
                    combos = itertools.chain(((i, j) for i in new for j in range(n)),
                                             ((i, j) for i in range(new.start) for j in new))
                for ins in combos:
                    if not self._valid(op, v, [tensors[i] for i in ins]):
                        continue
                    in_keys = [keys[i] for i in ins]
                    if op.commutative:
                        in_keys.sort()
                    h = hashlib.blake2b(f"{key}/{v}".encode(), digest_size=12)
                    for k in in_keys:
                        h.update(b"|" + k)
                    ready = max((producer[i] + 1 for i in ins), default=0)
                    out.append(_Cand(h.digest(), key, v, ins, ready))
        return out

    def roots(self) -> list[bytes]:
        """The possible first operators (their keys): one enumeration task each."""
        n = len(self.inputs)
        cands = self._new_candidates(self.inputs, self._input_keys, [-1] * n, range(n))
        return sorted(c.digest for c in cands)

    # ---- evaluation ----------------------------------------------------------------------

    def _apply(self, c: _Cand, ins: Sequence[GenTensor], floats: bool) -> list[GenTensor]:
        op = OPS[c.op]
        attrs = op.attr_variants[c.variant]
        if op.exact is None:
            return _split(ins[0], attrs["axis"])
        exact = op.exact([t.exact for t in ins], attrs)
        tests: list[tuple[np.ndarray, ...]] = []
        if floats:
            tests = [float_eval(op.op, attrs, [t.tests[k] for t in ins])
                     for k in range(len(ins[0].tests))]
        seams = op.seams(ins, attrs)
        dims = op.dims(ins, attrs)
        return [GenTensor(tuple(exact[o].shape), exact[o], tuple(t[o] for t in tests), dims[o],
                          seams[o]) for o in range(op.outputs)]

    # ---- the search ----------------------------------------------------------------------

    def run(self, sink: Sink | None = None, roots: Sequence[bytes] | None = None,
            on_graph: Callable[[int], None] | None = None) -> Enumeration:
        """Enumerate (only the subtrees of `roots` when given); each recorded graph goes to
        `sink`, or into the returned in-memory Enumeration when there is none."""
        result = Enumeration(self)
        if sink is None:
            def sink(fp: bytes, enc: Encoded) -> None:
                result.by_fingerprint.setdefault(fp, []).append(enc)
        n = len(self.inputs)
        state = _State(list(self.inputs), list(self._input_keys), [hash1(t) for t in self.inputs],
                       [-1] * n, [0] * n)
        cands = self._new_candidates(self.inputs, self._input_keys, state.producer, range(n))
        allowed = set(roots) if roots is not None else None
        self._dfs(state, cands, allowed, sink, result, on_graph)
        return result

    def _dfs(self, st: _State, cands: list[_Cand], allowed: set[bytes] | None, sink: Sink,
             result: Enumeration, on_graph: Callable[[int], None] | None) -> None:
        if st.nodes:
            self._record(st, sink, result, on_graph)
        if len(st.nodes) >= self.max_ops:
            return
        suffix_max = [b""] * (len(st.nodes) + 1)
        for j in range(len(st.nodes) - 1, -1, -1):
            suffix_max[j] = max(suffix_max[j + 1], st.nodes[j].digest)
        placed = {nd.digest for nd in st.nodes}
        comp_of, ncomp = _components(st)
        remaining = self.max_ops - len(st.nodes) - 1  # operators left after this one
        for c in cands:
            if c.digest in placed or c.digest <= suffix_max[c.ready]:
                continue  # duplicated computation, or not the canonical order
            if allowed is not None and not st.nodes and c.digest not in allowed:
                continue
            touched = {comp_of[i] for i in c.ins if i in comp_of}
            pieces = ncomp + 1 - len(touched)
            if pieces - 1 > remaining and not self._batching_pair(st, c, touched):
                continue  # cannot become connected any more: skip before evaluating
            outs = self._apply(c, [st.tensors[i] for i in c.ins], floats=False)
            hashes = [hash1(t) for t in outs]
            if any(h in st.hash_set for h in hashes) or len(set(hashes)) < len(hashes):
                continue  # computes a tensor the graph already has
            first = len(st.tensors)
            st.push(c, outs, hashes)
            if len(st.nodes) < self.max_ops:
                new = self._new_candidates(st.tensors, st.keys, st.producer,
                                           range(first, len(st.tensors)))
                self._dfs(st, cands + new, allowed, sink, result, on_graph)
            else:
                self._record(st, sink, result, on_graph)
            st.pop(c, len(outs))

    def _batching_pair(self, st: _State, c: _Cand, touched: set[int]) -> bool:
        """Two independent instances of one operator: a source that a target can batch."""
        return self.batching and len(st.nodes) == 1 and not touched and \
            (c.op, c.variant) == (st.nodes[0].op, st.nodes[0].variant)

    def _record(self, st: _State, sink: Sink, result: Enumeration,
                on_graph: Callable[[int], None] | None) -> None:
        _, pieces = _components(st)
        if pieces > 1 and not (pieces == 2 and len(st.nodes) == 2 and self.batching and
                               (st.nodes[0].op, st.nodes[0].variant) ==
                               (st.nodes[1].op, st.nodes[1].variant)):
            return
        outputs = [i for i in range(len(self.inputs), len(st.tensors)) if st.consumed[i] == 0]
        fp = _combine(st.hashes[i] for i in outputs)
        sink(fp, tuple((nd.op, nd.variant, nd.ins) for nd in st.nodes))
        size = len(st.nodes)
        result.counts[size] = result.counts.get(size, 0) + 1
        if on_graph is not None:
            on_graph(size)

    # ---- replay --------------------------------------------------------------------------

    def replay(self, encoded: Encoded) -> GenGraph:
        """Rebuild a recorded graph with float test values (and its dimensions and seams)."""
        tensors = list(self.inputs)
        nodes = []
        for key, variant, ins in encoded:
            op = OPS[key]
            outs = self._apply(_Cand(b"", key, variant, ins, 0), [tensors[i] for i in ins],
                               floats=True)
            first = len(tensors)
            tensors.extend(outs)
            nodes.append(GenNode(key, _freeze(op.attr_variants[variant]), ins,
                                 tuple(range(first, len(tensors)))))
        consumed = {i for nd in nodes for i in nd.inputs}
        outputs = tuple(o for nd in nodes for o in nd.outputs if o not in consumed)
        return GenGraph(tuple(nodes), outputs, tuple(tensors), self.specs)


@dataclass
class _PlacedNode:
    digest: bytes
    op: str
    variant: int
    ins: tuple[int, ...]


@dataclass
class _State:
    """The graph under construction, with per-tensor keys, hashes, producers and use counts."""

    tensors: list[GenTensor]
    keys: list[bytes]
    hashes: list[bytes]
    producer: list[int]
    consumed: list[int]
    nodes: list[_PlacedNode] = field(default_factory=list)
    hash_set: set[bytes] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.hash_set = set(self.hashes)

    def push(self, c: _Cand, outs: list[GenTensor], hashes: list[bytes]) -> None:
        for i in c.ins:
            self.consumed[i] += 1
        position = len(self.nodes)
        for k, (t, h) in enumerate(zip(outs, hashes)):
            self.tensors.append(t)
            self.keys.append(c.digest + bytes([k]))
            self.hashes.append(h)
            self.producer.append(position)
            self.consumed.append(0)
            self.hash_set.add(h)
        self.nodes.append(_PlacedNode(c.digest, c.op, c.variant, c.ins))

    def pop(self, c: _Cand, n_out: int) -> None:
        self.nodes.pop()
        for h in self.hashes[-n_out:]:
            self.hash_set.discard(h)
        for lst in (self.tensors, self.keys, self.hashes, self.producer, self.consumed):
            del lst[-n_out:]
        for i in c.ins:
            self.consumed[i] -= 1


def _components(st: _State) -> tuple[dict[int, int], int]:
    """The weakly connected pieces of the graph's operators (linked by any shared tensor,
    inputs included): each touched tensor's piece, and how many pieces there are."""
    parent = list(range(len(st.nodes)))

    def find(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    touching: dict[int, int] = {}
    for t, p in enumerate(st.producer):
        if p >= 0:
            touching[t] = p
    for pos, nd in enumerate(st.nodes):
        for t in nd.ins:
            if t in touching:
                parent[find(pos)] = find(touching[t])
            else:
                touching[t] = pos
    comp = {t: find(p) for t, p in touching.items()}
    return comp, len({find(i) for i in range(len(st.nodes))})


def _split(t: GenTensor, axis: int) -> list[GenTensor]:
    """Cut at the tensor's one seam on `axis` (split_{0,1} of TASO)."""
    ((pos, expr),) = t.seams_on(axis)
    total = t.dims[axis]
    rest = (total.args[1] if isinstance(total, Call) and total.fn == "+" and total.args[0] == expr
            else Call("-", (total, expr)))  # (a + b) - a is b
    parts = []
    for lo, hi, size in ((0, pos, expr), (pos, t.shape[axis], rest)):
        sl = [slice(None)] * len(t.shape)
        sl[axis] = slice(lo, hi)
        dims = list(t.dims)
        dims[axis] = size
        seams = tuple(s if i != axis else () for i, s in enumerate(t.seams))
        parts.append(GenTensor(tuple(t.exact[tuple(sl)].shape), t.exact[tuple(sl)].copy(),
                               tuple(x[tuple(sl)].copy() for x in t.tests), tuple(dims), seams))
    return parts


__all__ = ["Encoded", "Enumeration", "Enumerator", "GenGraph", "GenNode", "GeneratorInput",
           "fingerprint", "hash1"]
