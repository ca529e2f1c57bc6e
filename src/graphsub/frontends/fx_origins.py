"""Which node of dynamo's graph each traced ATen node's value is.

graphsub reads a captured graph at the ATen level (fx_import), but hands back dynamo's own
graph with only its rewrites spliced in (fx_splice). To splice, it must know, for a value it
reads or replaces, which node of dynamo's graph computes exactly that value: `x.transpose(1,
2)` is one ATen node, `F.linear(x, w)` is four (a transpose of the weight, views around a
product) of which only the last is the linear's result, and a no-op `.to(float32)` is none.

The trace is made by running dynamo's graph node by node (an `fx.Interpreter`) under the
tracer, so that after each node runs, the tensor it returned can be asked which ATen node
made it (the proxy the tracer attached to it, through functionalization's wrapper where the
trace functionalizes). That node's `meta[ORIGIN]` is the dynamo node's name; where several
dynamo nodes return the same ATen value (a no-op cast after its input), the first keeps it:
redirecting the readers of the first redirects the others' too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
import torch.fx as fx

#: The `meta` key of a traced node whose value is a node of dynamo's graph: that node's name.
ORIGIN = "graphsub_origin"
#: The `meta` key naming the node of dynamo's graph whose operation made a traced node (its
#: result, or a step inside its decomposition: the product inside a `linear`).
WITHIN = "graphsub_within"


# (torch absent, its classes are Any: the ignore is for mypy without the extras)
class _OriginRecorder(fx.Interpreter):  # type: ignore[misc, unused-ignore]
    """Runs dynamo's graph under a tracer and marks each ATen node that is a dynamo node's
    tensor result with that node's name (ORIGIN), and every ATen node with the name of the
    dynamo node whose operation made it (WITHIN)."""

    def run_node(self, n: fx.Node) -> Any:
        from torch.fx.experimental.proxy_tensor import get_proxy_mode

        mode = get_proxy_mode()
        graph = mode.tracer.graph if mode is not None else None
        last = next(reversed(graph.nodes), None) if graph is not None else None
        result = self._mark_result(n, super().run_node(n))
        if graph is not None:
            made = last.next if last is not None else next(iter(graph.nodes), None)
            while made is not None and made.op != "root":
                made.meta.setdefault(WITHIN, n.name)
                made = made.next
        return result

    def _mark_result(self, n: fx.Node, result: Any) -> Any:
        from torch._utils import _functionalize_sync
        from torch.fx.experimental.proxy_tensor import get_proxy_mode, get_proxy_slot

        mode = get_proxy_mode()
        if mode is None:
            return result
        if isinstance(result, torch.SymInt):  # a size computed in the graph
            traced = get_proxy_slot(result, mode.tracer, None, lambda t: t.force().node)
            if isinstance(traced, fx.Node):
                traced.meta.setdefault(ORIGIN, n.name)
            return result
        if not isinstance(result, torch.Tensor):
            return result
        inner = result
        if torch._is_functional_tensor(result):
            # a view of a written base: its value as of now (torch leaves it unannotated)
            _functionalize_sync(result)  # type: ignore[no-untyped-call, unused-ignore]
            inner = torch._from_functional_tensor(result)
        traced = get_proxy_slot(inner, mode.tracer, None, lambda p: p.proxy.node)
        if isinstance(traced, fx.Node):
            traced.meta.setdefault(ORIGIN, n.name)
        return result


def traced_with_origins(gm: fx.GraphModule, args: Sequence[Any], functional: bool,
                        tracing_mode: Literal["real", "symbolic"] = "real") -> fx.GraphModule:
    """dynamo's graph traced to ATen operators on `args` (views and writes functionalized
    where `functional`), each node that is the value of a dynamo node marked with its name
    (`meta[ORIGIN]`); dead nodes removed."""
    from torch.fx.experimental.proxy_tensor import make_fx

    run = _OriginRecorder(gm).run
    traced_fn = torch.func.functionalize(run, remove="mutations_and_views") if functional \
        else run
    with torch.no_grad():
        traced = make_fx(traced_fn, decomposition_table={}, tracing_mode=tracing_mode)(*args)
    # the inputs, sizes among them, are dynamo's in order
    for mine, theirs in zip(traced.graph.find_nodes(op="placeholder"),
                            gm.graph.find_nodes(op="placeholder")):
        mine.meta[ORIGIN] = theirs.name
    traced.graph.eliminate_dead_code()  # unused outputs (batch norm's statistics), syncs
    traced.recompile()
    return traced


__all__ = ["ORIGIN", "WITHIN", "traced_with_origins"]
