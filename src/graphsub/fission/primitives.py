"""The fission pass, and the fission paper's categories of primitives it reads.

A primitive has one degree of parallelism and one data access pattern, so that it runs as one
kernel (fission paper, section 2.1; Korch, section 3). Each operator's category is part of its
definition (`OpDef.category`, `ops.base.Category`); it decides what a generated kernel may hold
(graphsub.fission.candidates): elementwise, reduce/broadcast and layout primitives fuse into
one loop nest; a linear primitive (a matmul, a convolution) is a library call of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

from graphsub.ir.graph import Graph, Value
from graphsub.ops import get_op
from graphsub.ops.base import Category
from graphsub.rules import LIBRARY, Rule, apply_match, find_matches, load_rules
from graphsub.rules.applier import Rejection

_HERE = Path(__file__).parent


def category(op: str) -> Category:
    """The category of a graphsub operator (raises OpAttributeError for an unknown one)."""
    return get_op(op).category


@lru_cache(maxsize=None)
def fission_rules() -> tuple[Rule, ...]:
    """Coarse operator -> primitives (fission.rules), each checked numerically on load."""
    return tuple(load_rules([_HERE / "fission.rules"]))


@lru_cache(maxsize=None)
def kernel_rules() -> tuple[Rule, ...]:
    """Primitives -> the fused operator a library runs as one kernel (kernels.rules)."""
    return tuple(load_rules([_HERE / "kernels.rules"]))


@lru_cache(maxsize=None)
def primitive_rules() -> tuple[Rule, ...]:
    """Rewrites among primitives that fission exposes (primitives.rules): reduce-sum as a
    matmul, row scalings moved past matmuls, horizontal fusion of batched matmuls."""
    return tuple(load_rules([_HERE / "primitives.rules"]))


def fission(graph: Graph) -> Graph:
    """The graph with every coarse operator split into primitives and the primitives in normal
    form, as far as the fission rules reach (a coarse operator no rule fits, such as a layer
    norm whose scale broadcasts oddly, stays whole and is a kernel of its own). Weight-only
    nodes are left alone: they fold at export and cost nothing. A generated kernel (`fused`,
    from an earlier orchestration) is put back as its primitives first. A graph that computes
    in half precision is left whole: onnxruntime's float16 softmax and norm kernels sum in
    float32 inside, where their primitives would sum in float16 (a fuzzed mixed-precision
    model's softmax moved by 5%)."""
    if any(t.dtype in HALF_PRECISIONS for node in graph.nodes.values() for t in node.outputs):
        return graph
    return rewrite_until_fixed(inline_generated(graph), fission_rules())


#: Element types whose coarse operators fission leaves whole.
HALF_PRECISIONS = frozenset({"float16", "bfloat16"})


def inline_generated(graph: Graph) -> Graph:
    """The graph with every `fused` node replaced by the primitives of its body (a primitive
    that several kernels recomputed is computed once again)."""
    fused = [nid for nid in graph.topo_order() if graph[nid].op == "fused"]
    if not fused:
        return graph
    editor = graph.edit()
    for nid in fused:
        node = editor.node(nid)  # as edited: its inputs may be an inlined kernel's by now
        body_nodes, body_outputs = node.attrs["body"]
        made: list[tuple[Value, ...]] = []

        def get(ref: tuple) -> Value:
            return node.inputs[ref[1]] if ref[0] == "in" else made[ref[1]][ref[2]]

        for op, attrs, refs in body_nodes:
            made.append(editor.add(op, [get(r) for r in refs], attrs))
        for k, ref in enumerate(body_outputs):
            editor.replace_uses(Value(nid, k), get(ref))
    return editor.finish().dce().cse()


@lru_cache(maxsize=None)
def cleanup_rules() -> tuple[Rule, ...]:
    """The built-in library's cleanup rules (transpose pairs, no-op reshapes, ...): what an
    orchestrated graph is tidied with, since a library kernel's target may transpose back
    what the graph had transposed."""
    return tuple(load_rules([LIBRARY / "cleanup.rules"]))


def rewrite_until_fixed(graph: Graph, rules: Sequence[Rule]) -> Graph:
    """Apply the rules wherever they match, in topological order, until none does. Meant for
    rule sets that terminate (each rewrite removes what its source matched), such as fission
    and cleanup; weight-only nodes are left alone."""
    by_op: dict[str, list[Rule]] = {}
    for rule in rules:
        by_op.setdefault(rule.sources[0].op, []).append(rule)  # type: ignore[union-attr]
    stuck: set[tuple[int, object]] = set()  # nodes no rule rewrites, as they are now
    while True:
        weight_only = graph.weight_only()
        todo = [nid for nid in graph.topo_order()
                if graph[nid].op in by_op and (nid, graph[nid]) not in stuck
                and nid not in weight_only]
        if not todo:
            return graph
        nid = todo[0]
        for rule in by_op[graph[nid].op]:
            rewritten = next((g for m in find_matches(graph, rule, first_roots=[nid])
                              if not isinstance(g := apply_match(graph, m), Rejection)), None)
            if rewritten is not None:
                graph = rewritten
                break
        else:
            stuck.add((nid, graph[nid]))
