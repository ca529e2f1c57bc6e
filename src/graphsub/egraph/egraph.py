"""An e-graph over graphsub's operators, with egg's design.

E-nodes are `(op, attrs, child classes)`; e-classes are sets of equivalent e-nodes. A
union-find maps class ids to their representative, a hash-cons maps each canonical e-node to
its one id, and `rebuild` restores the invariants after unions (egg's deferred rebuilding):
every e-node's children are canonical, equal e-nodes are in one class (congruence), and each
class's analysis is the merge of its e-nodes'.

The analysis of a class is its tensor type(s), whether it can be computed from weights alone
(so inference folds it and it costs nothing, TASO 7.3) and, if it contains a weight, the
weight's value (for `all-equal` conditions). A node with several outputs (split) has a *tuple*
class, read through projection e-nodes `#out` (one per output), as Tensat's split0/split1.

Snapshots (`clone`) are copy-on-write: e-nodes and class records are immutable and shared, a
change replaces a record instead of editing it, and a clone copies only the containers that
hold them. MCTS clones an e-graph per search-tree node and per rollout; for the 2,000-node
e-graphs of the paper a clone takes a fraction of a millisecond, less than the search for one
rule, whereas an undo log would have to record the inverse of every edit (hash-cons entries,
union-find links, parent lists) and replay a path of rule applications to reach a tree node.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, NamedTuple

from graphsub.errors import GraphsubError
from graphsub.ir.graph import Graph, Value, make_node
from graphsub.tensors.types import EMPTY_ATTRS, Attrs, Constant, TensorType

#: The projection op: `#out :index i` of a tuple class is the class of its i-th output.
PROJ = "#out"


class ENode(NamedTuple):
    op: str
    attrs: Attrs
    children: tuple[int, ...]
    #: Non-zero for nodes that must never be merged with an equal-looking one (a random op).
    salt: int = 0


class EClass(NamedTuple):
    """An e-class record. Immutable: edits replace it (so clones can share it)."""

    nodes: tuple[int, ...]
    parents: tuple[int, ...]          # e-nodes that read this class
    types: tuple[TensorType, ...]     # one type; several for a tuple class
    weight_only: bool
    constant: Constant | None
    stamp: int                        # e-graph version of its last change (semi-naive search)


class EGraphError(GraphsubError):
    """An e-graph invariant would break (a union of differently typed classes, ...)."""


class EGraph:
    """Union-find + hash-cons + analyses. Read with `classes`, `nodes_of`, `node`, `find`;
    grow with `add`/`add_op` and `union`, then `rebuild` before searching again."""

    def __init__(self) -> None:
        self._nodes: list[ENode] = []        # by e-node id; canonical as of the last rebuild
        self._home: list[int] = []           # e-node id -> the class it was created in
        self._uf: list[int] = []             # class id -> parent class id
        self._memo: dict[ENode, int] = {}    # canonical e-node -> e-node id
        self._classes: dict[int, EClass] = {}
        self._by_op: dict[str, list[int]] = {}
        self._dead: set[int] = set()         # e-nodes found equal to an older one (congruence)
        self._pending: list[int] = []        # classes whose readers must be re-canonicalized
        self._wo_pending: list[int] = []     # classes that became weight-only
        #: E-nodes removed from search and extraction by the cycle filter.
        self.blacklist: set[int] = set()
        #: Which rule application made each e-node (-1: the input graph).
        self.origin: list[int] = []
        #: Names of e-nodes made from named graph nodes (weights keep their initializer names).
        self.names: dict[int, str] = {}
        #: Bumped by every change: equal versions of one e-graph mean equal e-graphs.
        self.version = 0

    # ---- reading ----------------------------------------------------------------------------
    def find(self, cls: int) -> int:
        uf = self._uf
        root = cls
        while uf[root] != root:
            root = uf[root]
        while uf[cls] != root:  # path compression
            uf[cls], cls = root, uf[cls]
        return root

    @property
    def classes(self) -> Mapping[int, EClass]:
        """Canonical class id -> record."""
        return self._classes

    def __getitem__(self, cls: int) -> EClass:
        return self._classes[self.find(cls)]

    def node(self, nid: int) -> ENode:
        return self._nodes[nid]

    def class_of(self, nid: int) -> int:
        return self.find(self._home[nid])

    def nodes_of(self, cls: int) -> Iterator[int]:
        """The live e-nodes of a class (not blacklisted)."""
        bl = self.blacklist
        return (n for n in self._classes[self.find(cls)].nodes if n not in bl)

    def nodes_by_op(self, op: str) -> Iterator[int]:
        dead, bl = self._dead, self.blacklist
        return (n for n in self._by_op.get(op, ()) if n not in dead and n not in bl)

    def has_op(self, op: str) -> bool:
        """Whether some live e-node has this op (a cheap test before matching)."""
        return next(self.nodes_by_op(op), None) is not None

    @property
    def num_nodes(self) -> int:
        """Live e-nodes (what node limits count)."""
        return len(self._nodes) - len(self._dead)

    @property
    def num_classes(self) -> int:
        return len(self._classes)

    def is_clean(self) -> bool:
        return not self._pending and not self._wo_pending

    def node_weight_only(self, nid: int) -> bool:
        """Whether this e-node computes from weights alone (so it is folded and free)."""
        node = self._nodes[nid]
        if node.op == "weight":
            return True
        if not node.children or node.salt:
            return False
        return all(self._classes[self.find(c)].weight_only for c in node.children)

    # ---- growing ----------------------------------------------------------------------------
    def add(self, node: ENode, types: tuple[TensorType, ...], origin: int = -1) -> int:
        """The class of `node`, added if no equal e-node exists (hash-consing)."""
        find = self.find
        node = node._replace(children=tuple(find(c) for c in node.children))
        existing = self._memo.get(node)
        if existing is not None:
            return find(self._home[existing])
        nid, cls = len(self._nodes), len(self._uf)
        self._nodes.append(node)
        self._home.append(cls)
        self._uf.append(cls)
        self.origin.append(origin)
        self._memo[node] = nid
        self._by_op.setdefault(node.op, []).append(nid)
        classes = self._classes
        for c in set(node.children):
            rec = classes[c]
            classes[c] = rec._replace(parents=rec.parents + (nid,))
        self.version += 1
        weight_only = node.op == "weight" or bool(
            node.children and not node.salt and all(classes[c].weight_only for c in node.children))
        constant = node.attrs["value"] if node.op == "weight" else None
        classes[cls] = EClass((nid,), (), types, weight_only, constant, self.version)
        return cls

    def add_op(self, op: str, attrs: Mapping[str, Any] | None, children: Iterable[int],
               origin: int = -1, name: str = "", salt: int = 0) -> tuple[int, ...]:
        """Add an operator application, inferring its output types from the children's; the
        classes of its outputs (through projections when it has several). Raises the op's
        GraphsubError (ShapeError, ...) when it does not apply to these types."""
        kids = tuple(self.find(c) for c in children)
        types = [self._single_type(c) for c in kids]
        made = make_node(op, [Value(c) for c in kids], types, attrs)
        cls = self.add(ENode(op, made.attrs, kids, salt), made.outputs, origin)
        if name:
            self.names.setdefault(self._classes[cls].nodes[0], name)
        if len(made.outputs) == 1:
            return (cls,)
        return tuple(self.add(ENode(PROJ, Attrs({"index": i}), (cls,)), (t,), origin)
                     for i, t in enumerate(made.outputs))

    def _single_type(self, cls: int) -> TensorType:
        types = self._classes[cls].types
        if len(types) != 1:
            raise EGraphError(f"class {cls} has {len(types)} outputs; read it through {PROJ}")
        return types[0]

    def union(self, a: int, b: int) -> bool:
        """Merge two classes (their types must agree); whether anything changed."""
        a, b = self.find(a), self.find(b)
        if a == b:
            return False
        ra, rb = self._classes[a], self._classes[b]
        if ra.types != rb.types:
            raise EGraphError(f"cannot merge classes of types {ra.types} and {rb.types}")
        if len(ra.nodes) + len(ra.parents) < len(rb.nodes) + len(rb.parents):
            a, b, ra, rb = b, a, rb, ra
        self._uf[b] = a
        self.version += 1
        weight_only = ra.weight_only or rb.weight_only
        self._classes[a] = EClass(ra.nodes + rb.nodes, ra.parents + rb.parents, ra.types,
                                  weight_only, ra.constant or rb.constant, self.version)
        del self._classes[b]
        self._pending.append(a)
        if weight_only and not (ra.weight_only and rb.weight_only):
            self._wo_pending.append(a)
        return True

    def rebuild(self) -> int:
        """Restore congruence and the analyses after unions (egg's rebuild); the number of
        congruence unions it made."""
        merged = 0
        while self._pending or self._wo_pending:
            while self._pending:
                todo = {self.find(c) for c in self._pending}
                self._pending = []
                for cls in todo:
                    merged += self._repair(cls)
            while self._wo_pending:
                self._propagate_weight_only(self.find(self._wo_pending.pop()))
        return merged

    def _repair(self, cls: int) -> int:
        """Re-canonicalize the readers of a merged class; readers that became equal to another
        e-node are merged with it (congruence) and marked dead."""
        cls = self.find(cls)
        rec = self._classes.get(cls)
        if rec is None:
            return 0
        merged = 0
        memo, nodes, dead, find = self._memo, self._nodes, self._dead, self.find
        parents: list[int] = []
        seen: set[int] = set()
        for p in rec.parents:
            if p in seen or p in dead:
                continue
            seen.add(p)
            old = nodes[p]
            canon = old._replace(children=tuple(find(c) for c in old.children))
            if canon != old:
                if memo.get(old) == p:
                    del memo[old]
                nodes[p] = canon
            other = memo.get(canon)
            if other is not None and other != p and other not in dead:
                # p and `other` are the same e-node now: keep the older, merge their classes.
                keep, drop = min(other, p), max(other, p)
                memo[canon] = keep
                dead.add(drop)
                self.union(self._home[keep], self._home[drop])
                self._drop_node(drop)
                merged += 1
                if drop == p:
                    continue
            else:
                memo[canon] = p
            parents.append(p)
        if self.find(cls) == cls:
            # Classes merged into this one during the loop appended their readers after ours.
            now = self._classes[cls]
            extra = now.parents[len(rec.parents):]
            self._classes[cls] = now._replace(parents=tuple(parents) + extra)
        return merged

    def _drop_node(self, nid: int) -> None:
        cls = self.find(self._home[nid])
        rec = self._classes[cls]
        self._classes[cls] = rec._replace(nodes=tuple(n for n in rec.nodes if n != nid))

    def _propagate_weight_only(self, cls: int) -> None:
        """A class became weight-only: readers whose inputs now all are become so too."""
        stack = [cls]
        while stack:
            rec = self._classes[self.find(stack.pop())]
            for p in rec.parents:
                if p in self._dead:
                    continue
                pc = self.find(self._home[p])
                prec = self._classes[pc]
                if not prec.weight_only and self.node_weight_only(p):
                    self.version += 1
                    self._classes[pc] = prec._replace(weight_only=True, stamp=self.version)
                    stack.append(pc)

    # ---- snapshots --------------------------------------------------------------------------
    def clone(self) -> EGraph:
        """An independent copy (copy-on-write: records are shared, containers copied)."""
        if not self.is_clean():
            raise EGraphError("rebuild the e-graph before cloning it")
        g = EGraph.__new__(EGraph)
        g._nodes = self._nodes.copy()
        g._home = self._home.copy()
        g._uf = self._uf.copy()
        g._memo = self._memo.copy()
        g._classes = self._classes.copy()
        g._by_op = {op: ids.copy() for op, ids in self._by_op.items()}
        g._dead = self._dead.copy()
        g._pending, g._wo_pending = [], []
        g.blacklist = self.blacklist.copy()
        g.origin = self.origin.copy()
        g.names = self.names.copy()
        g.version = self.version
        return g

    # ---- invariants (for tests and debugging) -----------------------------------------------
    def check(self) -> None:
        """Raise EGraphError unless the e-graph is rebuilt and every invariant holds."""
        if not self.is_clean():
            raise EGraphError("pending unions: call rebuild()")
        find = self.find
        seen: dict[ENode, int] = {}
        for cls, rec in self._classes.items():
            if find(cls) != cls:
                raise EGraphError(f"class {cls} is not canonical")
            for n in rec.nodes:
                if n in self._dead:
                    raise EGraphError(f"dead e-node {n} still in class {cls}")
                canon = self._nodes[n]._replace(
                    children=tuple(find(c) for c in self._nodes[n].children))
                if canon in seen and seen[canon] != cls:
                    raise EGraphError(f"congruence broken: {canon} in classes {seen[canon]}, {cls}")
                seen[canon] = cls
                if self._memo.get(canon) is None or find(self._home[self._memo[canon]]) != cls:
                    raise EGraphError(f"hash-cons does not map {canon} to class {cls}")
            wo = any(self.node_weight_only(n) for n in rec.nodes)
            if wo != rec.weight_only:
                raise EGraphError(f"class {cls}: weight-only analysis {rec.weight_only}, "
                                  f"its e-nodes say {wo}")


class GraphEncoding(NamedTuple):
    """An e-graph made from a graph, and where the graph's outputs and inputs went."""

    egraph: EGraph
    outputs: tuple[int, ...]
    inputs: tuple[int, ...]


def egraph_from_graph(graph: Graph) -> GraphEncoding:
    """The e-graph of one graph: one class per value. Equal subgraphs fall into one class by
    hash-consing (common subexpressions are shared), except for non-deterministic nodes."""
    from graphsub.ops import is_deterministic

    eg = EGraph()
    value_class: dict[Value, int] = {}
    for nid in graph.topo_order():
        node = graph[nid]
        kids = tuple(value_class[v] for v in node.inputs)
        salt = 0 if is_deterministic(node) else nid + 1
        cls = eg.add(ENode(node.op, node.attrs, kids, salt), node.outputs)
        if node.name:
            eg.names.setdefault(eg[cls].nodes[0], node.name)
        if len(node.outputs) == 1:
            value_class[Value(nid, 0)] = cls
        else:
            for i, t in enumerate(node.outputs):
                value_class[Value(nid, i)] = eg.add(
                    ENode(PROJ, Attrs({"index": i}), (cls,)), (t,))
    outputs = tuple(value_class[v] for v in graph.outputs)
    inputs = tuple(value_class[Value(i, 0)] for i in graph.inputs)
    return GraphEncoding(eg, outputs, inputs)


__all__ = ["EClass", "EGraph", "EGraphError", "ENode", "EMPTY_ATTRS", "GraphEncoding", "PROJ",
           "egraph_from_graph"]
