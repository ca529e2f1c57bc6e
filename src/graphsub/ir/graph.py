"""The graph IR: nodes, values and immutable graphs with copy-on-write edits.

A `Graph` is a value. Edits go through a `GraphEditor`, which returns a *new* graph that shares
every unchanged `Node` object with the old one; only the node table (a dict of references) is
copied. Node ids are stable across edits, so a search can hold ids from a parent graph and
still find the same nodes in a child.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from graphsub.errors import CycleError, GraphsubError, ShapeError
from graphsub.ir.facts import NO_FACTS, GraphFacts
from graphsub.ir.hashing import commutative_ops, graph_hash, node_digests
from graphsub.ir.incremental import incremental_users, incremental_weight_only, node_fingerprints
from graphsub.ir.node import Node as Node  # re-exported: the graph's nodes
from graphsub.ir.view import GraphDelta
from graphsub.tensors.types import Attrs, Constant, TensorType
from graphsub.tensors.values import Value as Value  # the graph's edges, re-exported
from graphsub.ops import get_op, is_deterministic, is_foldable


#: Canonical attributes and output types (or the error) by (op, attributes, input types). A
#: search builds the same target operators on the same types tens of thousands of times, and
#: canonicalizing and inferring them was the largest cost of a rewrite.
_INFERRED: dict[tuple[Any, ...], tuple[Attrs, tuple[TensorType, ...]] | GraphsubError] = {}
#: Emptied when full. One search needs hundreds of entries to about a thousand (15 s on
#: NasNet-A or Inception-v3 with TASO's rules: backtracking 160-250, MCTS 410-1,100); what
#: fills the cache is a long-lived process that optimizes many models (a notebook, a
#: torch.compile server, the fuzzer's workers). Every entry is a handful of objects a full
#: garbage collection walks: at 200,000 entries full collections took 1.5-2 s and broke
#: 0.5 s time limits in the fuzz campaign.
_INFERRED_MAX = 10_000


def make_node(op: str, inputs: Sequence[Value], input_types: Sequence[TensorType],
              attrs: Mapping[str, Any] | None = None, name: str = "") -> Node:
    """Make a node, validating and canonicalizing attributes and inferring output types."""
    in_types = tuple(input_types)
    key: tuple[Any, ...] | None = None
    inferred = None
    if op != "weight":  # a weight's key would hold its data alive in the cache
        try:
            key = (op, attrs if isinstance(attrs, Attrs) else
                   tuple(sorted((attrs or {}).items())), in_types)
            inferred = _INFERRED.get(key)
        except TypeError:  # an unhashable attribute value (a list): not cached
            key, inferred = None, None
    if inferred is None:
        inferred = _infer(op, in_types, attrs)
        if key is not None:
            if len(_INFERRED) >= _INFERRED_MAX:
                _INFERRED.clear()
            _INFERRED[key] = inferred
    if isinstance(inferred, GraphsubError):
        # A fresh copy: raising the cached instance would attach the raiser's frames to it,
        # and the cache would keep whatever they reference (a search's graphs) alive.
        raise copy.copy(inferred)
    return Node(op, inferred[0], tuple(inputs), inferred[1], name)


def _infer(op: str, in_types: tuple[TensorType, ...], attrs: Mapping[str, Any] | None
           ) -> tuple[Attrs, tuple[TensorType, ...]] | GraphsubError:
    opdef = get_op(op)
    try:
        opdef.check_arity(len(in_types))
        canonical = attrs if isinstance(attrs, Attrs) else opdef.make_attrs(attrs or {}, in_types)
        return canonical, tuple(opdef.infer(canonical, in_types))
    except GraphsubError as exc:
        return exc.with_traceback(None)


class Graph:
    """An immutable dataflow graph over `Node`s, with named inputs and outputs.

    `inputs` lists the ids of the `input` nodes in interface order; `outputs` the values the
    graph returns, named by `output_names`. `facts` (ir.facts.GraphFacts) says what is known of it
    besides what it computes (its opset, how its model declared its inputs, the ranges of its
    size symbols); they do not enter the hash.
    """

    __slots__ = ("_nodes", "inputs", "outputs", "output_names", "facts", "_next_id",
                 "_topo", "_users", "_hash", "_weight_only", "_by_op", "_digests", "delta",
                 "_positions", "_fingerprints", "memo")

    def __init__(self, nodes: Mapping[int, Node], inputs: Sequence[int],
                 outputs: Sequence[Value], output_names: Sequence[str],
                 facts: GraphFacts = NO_FACTS, next_id: int | None = None,
                 check: bool = True) -> None:
        self._nodes = dict(nodes)
        self.inputs = tuple(inputs)
        self.outputs = tuple(outputs)
        self.output_names = tuple(output_names)
        self.facts = facts
        self._next_id = next_id if next_id is not None else max(self._nodes, default=-1) + 1
        self._topo: list[int] | None = None
        self._users: dict[int, list[tuple[int, int]]] | None = None
        self._hash: str | None = None
        self._weight_only: frozenset[int] | None = None
        self._by_op: dict[str, list[int]] | None = None
        self._digests: dict[int, bytes] | None = None
        #: What changed since the graph this one was edited from (None for a fresh graph); the
        #: hash, users, weight-only set, fingerprints and costs are derived from the parent's.
        self.delta: GraphDelta[Graph] | None = None
        self._positions: dict[int, int] | None = None
        self._fingerprints: dict[int, int] | None = None
        #: Facts other modules derive from this graph (costs, matches), keyed by their owner.
        self.memo: dict[Any, Any] = {}
        if check:
            self.validate()

    # ---- access ---------------------------------------------------------------------------
    @property
    def nodes(self) -> Mapping[int, Node]:
        return self._nodes

    def __getitem__(self, node_id: int) -> Node:
        return self._nodes[node_id]

    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._nodes

    def type_of(self, value: Value) -> TensorType:
        return self._nodes[value.node].outputs[value.index]

    def input_types(self, node_id: int) -> tuple[TensorType, ...]:
        return tuple(self.type_of(v) for v in self._nodes[node_id].inputs)

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(self._nodes[i].attrs["name"] for i in self.inputs)

    @property
    def next_id(self) -> int:
        return self._next_id

    # ---- structure ------------------------------------------------------------------------
    def validate(self) -> None:
        """Check references, input nodes and acyclicity; raise a GraphsubError if broken."""
        if len(self.outputs) != len(self.output_names):
            raise GraphsubError("graph has a different number of outputs and output names")
        if len(set(self.output_names)) != len(self.output_names):
            raise GraphsubError(f"graph output names are not unique: {self.output_names}")
        for nid, node in self._nodes.items():
            for v in node.inputs:
                src = self._nodes.get(v.node)
                if src is None or v.index >= len(src.outputs):
                    raise GraphsubError(f"node {nid} ({node.op}) reads {v!r}, which does not exist")
        for i in self.inputs:
            if self._nodes.get(i) is None or self._nodes[i].op != "input":
                raise GraphsubError(f"graph input {i} is not an input node")
        for v in self.outputs:
            if v.node not in self._nodes or v.index >= len(self._nodes[v.node].outputs):
                raise GraphsubError(f"graph output {v!r} does not exist")
        self.topo_order()

    def topo_order(self) -> list[int]:
        """Node ids in a deterministic topological order (inputs first, then a DFS from the
        outputs in order); raises CycleError naming the nodes on a cycle."""
        if self._topo is None:
            self._topo = _topological_order(self._nodes, self.inputs, self.outputs)
        return self._topo

    def positions(self) -> dict[int, int]:
        """Each node's index in the topological order."""
        if self._positions is None:
            self._positions = {nid: i for i, nid in enumerate(self.topo_order())}
        return self._positions

    def users(self) -> Mapping[int, list[tuple[int, int]]]:
        """For each node id, the (user node id, input position) pairs that read its outputs."""
        if self._users is None and self.delta is not None:
            self._users = incremental_users(self, self.delta)
        if self._users is None:
            users: dict[int, list[tuple[int, int]]] = {nid: [] for nid in self._nodes}
            for nid, node in self._nodes.items():
                for pos, v in enumerate(node.inputs):
                    users[v.node].append((nid, pos))
            self._users = users
        return self._users

    def nodes_by_op(self, op: str) -> list[int]:
        """Ids of the nodes of one op, in topological order (indexed once per graph)."""
        if self._by_op is None:
            by_op: dict[str, list[int]] = {}
            for nid in self.topo_order():
                by_op.setdefault(self._nodes[nid].op, []).append(nid)
            self._by_op = by_op
        return self._by_op.get(op, [])

    def structural_hash(self) -> str:
        """A hash equal for graphs that differ only in node ids or insertion order."""
        if self._hash is None:
            self._hash = graph_hash(self)
        return self._hash

    def node_digests(self) -> dict[int, bytes]:
        """The Merkle digest of every live node, by id (ir.hashing; computed once)."""
        if self._digests is None:
            self._digests = node_digests(self)
        return self._digests

    def weight_only(self) -> frozenset[int]:
        """Ids of nodes whose value depends on weights alone (TASO section 7.3): they are folded
        into constants at export and cost nothing at inference."""
        if self._weight_only is None and self.delta is not None:
            self._weight_only = incremental_weight_only(self, self.delta, _is_weight_only)
        if self._weight_only is None:
            result: set[int] = set()
            for nid in self.topo_order():
                if _is_weight_only(self._nodes[nid], result):
                    result.add(nid)
            self._weight_only = frozenset(result)
        return self._weight_only

    def weight_bytes(self) -> int:
        """Bytes of the graph's weights as stored (weight nodes; what the model file holds)."""
        return sum(node.attrs["value"].type.nbytes for node in self._nodes.values()
                   if node.op == "weight")

    def fingerprints(self) -> dict[int, int]:
        """Process-local integer digests of every node (see `fingerprint`)."""
        if self._fingerprints is None:

            self._fingerprints = node_fingerprints(self, commutative_ops())
        return self._fingerprints

    def fingerprint(self) -> int:
        """An integer equal for graphs that differ only in node ids, valid within one process:
        what a search deduplicates with. Computed from the parent's where the graph was edited
        from one, so it costs work proportional to what the edit changed downstream."""
        fps = self.fingerprints()
        return hash((tuple(fps[i] for i in self.inputs),
                     tuple((fps[v.node], v.index) for v in self.outputs), self.output_names))

    def edit(self) -> GraphEditor:
        return GraphEditor(self)

    def with_facts(self, **changes: Any) -> Graph:
        """The same computation with these facts changed (GraphFacts' fields): what a stage
        learns about the model (the input values it runs at) goes into a new graph, never into
        one that others hold."""
        g = Graph(self._nodes, self.inputs, self.outputs, self.output_names,
                  replace(self.facts, **changes), self._next_id, check=False)
        g._topo = self._topo
        return g

    def dce(self) -> Graph:
        """A graph without the nodes that no output depends on (graph inputs are kept)."""
        order = self.topo_order()
        if len(order) == len(self._nodes):
            return self
        nodes = {nid: self._nodes[nid] for nid in order}
        g = Graph(nodes, self.inputs, self.outputs, self.output_names, self.facts,
                  self._next_id, check=False)
        g._topo = order
        return g

    def cse(self) -> Graph:
        """A graph in which nodes computing the same thing (same op, attributes and inputs;
        weights with equal content) are one node. Traced graphs repeat computations (one
        reshape of an input per layer reading it), and rules that join on a shared input, such
        as merging the projections that read it, only see the sharing once it is one node."""
        canon: dict[int, int] = {}
        seen: dict[tuple[Any, ...], int] = {}
        for nid in self.topo_order():
            node = self._nodes[nid]
            ins = tuple(Value(canon[v.node], v.index) for v in node.inputs)
            if node.op == "input" or not is_deterministic(node):
                canon[nid] = nid
                continue
            key = (node.op, node.attrs, ins)
            canon[nid] = seen.setdefault(key, nid)
        if all(canon[n] == n for n in canon):
            return self
        nodes = {}
        for nid, node in self._nodes.items():
            if canon.get(nid, nid) != nid:
                continue
            ins = tuple(Value(canon.get(v.node, v.node), v.index) for v in node.inputs)
            nodes[nid] = node if ins == node.inputs else Node(node.op, node.attrs, ins,
                                                               node.outputs, node.name)
        outputs = [Value(canon.get(v.node, v.node), v.index) for v in self.outputs]
        return Graph(nodes, self.inputs, outputs, self.output_names, self.facts, self._next_id,
                     check=False).dce()

    def __repr__(self) -> str:
        return f"<Graph {len(self._nodes)} nodes, inputs {self.input_names}, outputs {self.output_names}>"

    def format(self) -> str:
        """A readable listing, one node a line, in topological order."""
        lines = []
        for nid in self.topo_order():
            n = self._nodes[nid]
            attrs = {k: v for k, v in n.attrs.items() if not isinstance(v, Constant)}
            args = ", ".join(repr(v) for v in n.inputs)
            outs = ", ".join(str(t) for t in n.outputs)
            lines.append(f"%{nid} = {n.op}({args}) {attrs if attrs else ''} -> {outs}")
        outs = ", ".join(f"{name}={v!r}" for name, v in zip(self.output_names, self.outputs))
        lines.append(f"return {outs}")
        return "\n".join(lines)


def _is_weight_only(node: Node, weight_only: set[int] | frozenset[int]) -> bool:
    """A weight, or a function of weights alone; not one whose shape depends on the sizes (a
    slice of a position table by `seq`), which is a computation at every size."""
    return node.op == "weight" or bool(
        node.inputs and is_foldable(node) and all(v.node in weight_only for v in node.inputs)
        and all(t.is_static for t in node.outputs))


def _topological_order(nodes: Mapping[int, Node], inputs: Sequence[int],
                       outputs: Sequence[Value]) -> list[int]:
    order: list[int] = list(inputs)
    state: dict[int, int] = {i: 2 for i in inputs}  # 1 = on the DFS stack, 2 = done
    for root in (v.node for v in outputs):
        if state.get(root) == 2:
            continue
        stack: list[tuple[int, int]] = [(root, 0)]
        state[root] = 1
        while stack:
            nid, pos = stack[-1]
            ins = nodes[nid].inputs
            if pos < len(ins):
                stack[-1] = (nid, pos + 1)
                child = ins[pos].node
                s = state.get(child)
                if s is None:
                    state[child] = 1
                    stack.append((child, 0))
                elif s == 1:
                    path = [n for n, _ in stack]
                    cycle = path[path.index(child):] + [child]
                    names = " -> ".join(f"{nodes[n].op}#{n}" for n in reversed(cycle))
                    raise CycleError(f"graph has a cycle: {names}")
            else:
                stack.pop()
                state[nid] = 2
                order.append(nid)
    return order


class GraphEditor:
    """Copy-on-write edits of a graph: add nodes, redirect uses, then `finish()`.

    The base graph is never modified. `finish()` removes nodes that became dead, checks that
    the result is acyclic, and returns the new graph.
    """

    def __init__(self, base: Graph) -> None:
        self._base = base
        self._nodes: dict[int, Node] = dict(base.nodes)
        self._outputs = list(base.outputs)
        self._next_id = base.next_id
        # Readers gained during this edit, which the base graph's user index does not know.
        self._new_readers: dict[int, set[int]] = {}
        self._added: list[int] = []       # new node ids, in creation order
        self._repointed: set[int] = set()  # existing nodes whose inputs were redirected
        self._replaced: list[int] = []    # nodes whose values lost readers

    def type_of(self, value: Value) -> TensorType:
        return self._nodes[value.node].outputs[value.index]

    def node(self, node_id: int) -> Node:
        return self._nodes[node_id]

    def add(self, op: str, inputs: Sequence[Value] = (), attrs: Mapping[str, Any] | None = None,
            name: str = "") -> tuple[Value, ...]:
        """Add a node; returns its output values."""
        node = make_node(op, inputs, [self.type_of(v) for v in inputs], attrs, name)
        return self.add_node(node)

    def add_node(self, node: Node) -> tuple[Value, ...]:
        nid = self._next_id
        self._next_id += 1
        self._nodes[nid] = node
        self._added.append(nid)
        for v in node.inputs:
            self._new_readers.setdefault(v.node, set()).add(nid)
        return tuple(Value(nid, i) for i in range(len(node.outputs)))

    def replace_uses(self, old: Value, new: Value) -> None:
        """Make every reader of `old` (nodes and graph outputs) read `new` instead.

        The two must have the same type: a substitution may not change what its context sees.
        """
        t_old, t_new = self.type_of(old), self.type_of(new)
        if t_old != t_new:
            raise ShapeError(f"cannot replace {old!r} ({t_old}) by {new!r} ({t_new}): types differ")
        readers = {nid for nid, _ in self._base.users().get(old.node, ())}
        readers |= self._new_readers.get(old.node, set())
        for nid in readers:
            node = self._nodes.get(nid)
            if node is None or nid == new.node or old not in node.inputs:
                continue
            ins = tuple(new if v == old else v for v in node.inputs)
            self._nodes[nid] = Node(node.op, node.attrs, ins, node.outputs, node.name)
            self._new_readers.setdefault(new.node, set()).add(nid)
            self._repointed.add(nid)
        self._outputs = [new if v == old else v for v in self._outputs]
        self._replaced.append(old.node)

    def finish(self) -> Graph:
        """The edited graph, without dead nodes; raises CycleError if an edit made a cycle.

        When the base graph is free of dead nodes (every graph a search makes is), dead nodes
        are found from the edit outwards and acyclicity is proved from the base's topological
        positions; the rare edit that the positions cannot prove acyclic takes the full path.
        """
        base = self._base
        if len(base.topo_order()) == len(base):
            g = self._finish_locally()
            if g is not None:
                return g
        return self._finish_fully()

    def _finish_fully(self) -> Graph:
        base = self._base
        g = Graph(self._nodes, base.inputs, self._outputs, base.output_names,
                  base.facts, self._next_id, check=False)
        g.topo_order()  # cycle check
        g = g.dce()
        changed = frozenset(nid for nid, node in g.nodes.items() if base.nodes.get(nid) is not node)
        removed = frozenset(nid for nid in base.nodes if nid not in g.nodes)
        positions = g.positions()
        g.delta = GraphDelta(base, changed, removed,
                             {nid: float(p) for nid, p in positions.items()})
        return g

    def _finish_locally(self) -> Graph | None:
        base, nodes = self._base, self._nodes
        removed = self._remove_dead()
        changed = frozenset(n for n in (*self._added, *self._repointed) if n in nodes)
        # Positions for new nodes, strictly between their latest input and the next integer.
        old_pos = base.positions()
        step = 1.0 / (len(self._added) + 1)
        new_pos: dict[int, float] = {}

        def pos(nid: int) -> float:
            p = new_pos.get(nid)
            return p if p is not None else old_pos[nid]

        order = self._added_in_order()
        if order is None:
            return None  # the new nodes read each other in a cycle: the full check names it
        for nid in order:
            new_pos[nid] = max((pos(v.node) for v in nodes[nid].inputs), default=-1.0) + step
        # Every edge must go up in position; only edges into changed nodes can be new. An
        # existing node that now reads something placed after it has that something's
        # ancestors moved in front of it (Pearce and Kelly's reordering); a cycle, or an order
        # the moves cannot repair, is left to the full check.
        for nid in changed:
            for v in nodes[nid].inputs:
                if pos(v.node) >= pos(nid) and not self._move_before(nid, v.node, pos, new_pos):
                    return None
        for nid in changed:
            if any(pos(v.node) >= pos(nid) for v in nodes[nid].inputs):
                return None
        g = Graph(nodes, base.inputs, self._outputs, base.output_names, base.facts,
                  self._next_id, check=False)
        g.delta = GraphDelta(base, changed, frozenset(removed), new_pos)
        return g

    def _added_in_order(self) -> list[int] | None:
        """The surviving new nodes, each after the new nodes it reads (usually creation
        order, but replace_uses can point a new node at one made after it), or None when
        they read each other in a cycle."""
        nodes, added = self._nodes, set(self._added)
        order: list[int] = []
        state: dict[int, int] = {}  # 1: being visited, 2: placed
        for start in self._added:
            if start not in nodes or start in state:
                continue
            stack = [(start, iter(nodes[start].inputs))]
            state[start] = 1
            while stack:
                nid, inputs = stack[-1]
                for v in inputs:
                    if v.node in added and v.node in nodes:
                        if state.get(v.node) == 1:
                            return None
                        if v.node not in state:
                            state[v.node] = 1
                            stack.append((v.node, iter(nodes[v.node].inputs)))
                            break
                else:
                    stack.pop()
                    state[nid] = 2
                    order.append(nid)
        return order

    def _move_before(self, reader: int, source: int, pos: Callable[[int], float],
                     new_pos: dict[int, float]) -> bool:
        """Give `source` and its ancestors placed after `reader` positions just before it,
        above everything they read; False if `reader` is among them (a cycle)."""
        limit = pos(reader)
        moved, stack = set(), [source]
        while stack:
            nid = stack.pop()
            if nid in moved or pos(nid) <= limit:
                continue
            if nid == reader:
                return False
            moved.add(nid)
            stack.extend(v.node for v in self._nodes[nid].inputs)
        floor = max((pos(v.node) for nid in moved for v in self._nodes[nid].inputs
                     if v.node not in moved), default=limit - 1)
        if floor >= limit:
            return False
        ordered = sorted(moved, key=pos)
        for i, nid in enumerate(ordered):
            new_pos[nid] = floor + (limit - floor) * (i + 1) / (len(ordered) + 1)
        return True

    def _remove_dead(self) -> set[int]:
        """Delete nodes that lost their last reader in this edit, and, transitively, inputs
        that lose theirs with them."""
        nodes, base_users = self._nodes, self._base.users()
        keep = {v.node for v in self._outputs} | set(self._base.inputs)

        def read(nid: int) -> bool:
            if nid in keep:
                return True
            for user in (*(u for u, _ in base_users.get(nid, ())), *self._new_readers.get(nid, ())):
                node = nodes.get(user)
                if node is not None and any(v.node == nid for v in node.inputs):
                    return True
            return False

        removed: set[int] = set()
        work = [*self._replaced, *self._added]
        while work:
            nid = work.pop()
            if nid in nodes and not read(nid):
                removed.add(nid)
                work.extend(v.node for v in nodes.pop(nid).inputs)
        # A node made and dropped within this edit is not a removal from the base.
        return {nid for nid in removed if nid in self._base.nodes}
