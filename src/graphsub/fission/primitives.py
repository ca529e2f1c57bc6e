"""The fission pass, and the fission paper's categories of primitives it reads.

A primitive has one degree of parallelism and one data access pattern, so that it runs as one
kernel (fission paper, section 2.1; Korch, section 3). Each operator's category is part of its
definition (`OpDef.category`, `ops.base.Category`); it decides what a generated kernel may hold
(graphsub.fission.candidates): elementwise, reduce/broadcast and layout primitives fuse into
one loop nest; a linear primitive (a matmul, a convolution) is a library call of its own.

The rules fission reads are chosen by the role each declares (graphsub.rules.roles: fission,
kernel, primitive, cleanup) among graphsub's own rule files: this folder's and the library's,
whose GELU forms and cleanup rules serve the search's normal form and fission alike.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from graphsub.ir.graph import Graph, Value
from graphsub.ops import get_op
from graphsub.ops.base import Category
from graphsub.ops.fused import Ref
from graphsub.rules import Rule, library_files, load_rules
from graphsub.rules.fixed_point import rewrite_to_fixed_point
from graphsub.rules.roles import Role, with_role

_HERE = Path(__file__).parent


def category(op: str) -> Category:
    """The category of a graphsub operator (raises OpAttributeError for an unknown one)."""
    return get_op(op).category


@lru_cache(maxsize=None)
def own_rules() -> tuple[Rule, ...]:
    """Every rule of graphsub's own rule files, fission's (this folder's) first, then the
    library's: what fission's rule sets are chosen from. Verified where graphsub is built
    (the test suite checks every rule's two sides), as the library is (rules.builtin_rules)."""
    return tuple(load_rules([*sorted(_HERE.glob("*.rules")), *library_files()], check=False))


@lru_cache(maxsize=None)
def fission_rules() -> tuple[Rule, ...]:
    """Coarse operator -> primitives (the fission role: fission.rules)."""
    return tuple(with_role(own_rules(), Role.FISSION))


@lru_cache(maxsize=None)
def kernel_rules() -> tuple[Rule, ...]:
    """Primitives -> the fused operator a library runs as one kernel (the kernel role:
    kernels.rules, and the library's activations, which the search's normal form reads back
    the same way)."""
    return tuple(with_role(own_rules(), Role.KERNEL))


@lru_cache(maxsize=None)
def primitive_rules() -> tuple[Rule, ...]:
    """Rewrites among primitives that fission exposes (the primitive role: primitives.rules):
    reduce-sum as a matmul, row scalings moved past matmuls, horizontal fusion of batched
    matmuls."""
    return tuple(with_role(own_rules(), Role.PRIMITIVE))


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
    return rewrite_to_fixed_point(inline_generated(graph), fission_rules())[0]


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

        def get(ref: Ref) -> Value:
            return node.inputs[ref[1]] if ref[0] == "in" else made[ref[1]][ref[2]]

        for op, attrs, refs in body_nodes:
            made.append(editor.add(op, [get(r) for r in refs], attrs))
        for k, ref in enumerate(body_outputs):
            editor.replace_uses(Value(nid, k), get(ref))
    return editor.finish().dce().cse()


@lru_cache(maxsize=None)
def cleanup_rules() -> tuple[Rule, ...]:
    """The cleanup role's rules (the library's cleanup.rules: transpose pairs, no-op
    reshapes, ...): what an orchestrated graph is tidied with, since a library kernel's
    target may transpose back what the graph had transposed."""
    return tuple(with_role(own_rules(), Role.CLEANUP))
