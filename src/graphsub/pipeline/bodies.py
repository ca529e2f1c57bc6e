"""Searching inside control flow: the bodies of If, Loop and Scan, each as a graph of its own.

The graph around a control-flow node is searched like any other, with the node opaque. Its
bodies are searched first, each alone: a body becomes a standalone model whose inputs are its
formal inputs (typed from the node's inputs: a Loop's carried values, a Scan's states and one
slice of each scanned input) and the outer values it captures; outer weights it reads are its
initializers (small ones copied, large ones moved in when no one else reads them), so that
shape computations fold and weight rules see them. The best graph
the search finds for a body replaces it only if it is predicted cheaper and computes what the
body computed, checked in onnxruntime on the two standalone models; then the whole model is
measured and verified against the original like any candidate. Bodies inside bodies are
searched first, the same way.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Collection, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from graphsub.errors import GraphsubError
from graphsub.ir.graph import Graph, Value
from graphsub.tensors.types import TensorType
from graphsub.onnx_io.bodies import (Placeholders, bodies, body_reads, formal_types,
                                     standalone_model)
from graphsub.ops.control_flow import captured_names, subgraphs
from graphsub.ops.opaque import body_names, node_proto
from graphsub.runtime.check_sizes import check_bindings
from graphsub.verdicts.equivalence import SAME_FUNCTION, compare_runners, value_dtypes
from graphsub.runtime.inputs import graph_input_specs
from graphsub.runtime.ort_sessions import ORT_ERRORS, make_session, quiet_run

#: Bodies smaller than this are not searched (nothing to rewrite in one or two operators).
MIN_BODY_NODES = 3
#: The largest outer weight copied into every body that reads it.
MAX_COPIED_ELEMENTS = 4096
#: A body's rewrite is kept when predicted at least this much cheaper.
MIN_GAIN = 0.01

#: Searches a graph for `seconds`: its best graph and the predicted costs before and after.
BodySearch = Callable[[Graph, float], tuple[Graph, float, float]]


@dataclass(frozen=True)
class BodyOutcome:
    """What happened to one body: where it is (`If node 'x' then_branch`), its operators,
    the predicted costs, and whether the rewrite was kept (or why not)."""

    where: str
    nodes: int
    cost_before: float
    cost_after: float
    kept: bool
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        """For the report's JSON (a cost never computed is null)."""
        return {**asdict(self), **{k: None for k in ("cost_before", "cost_after")
                                   if not math.isfinite(getattr(self, k))}}

    def text(self) -> str:
        costs = (f"predicted {self.cost_before:.4g} -> {self.cost_after:.4g}"
                 if math.isfinite(self.cost_before) else "")
        state = "rewritten" if self.kept else self.note
        return f"{self.where} ({self.nodes} operators): {state}" + (f"; {costs}" if costs else "")


def _written_back(body: onnx.GraphProto, optimized: onnx.ModelProto) -> onnx.GraphProto:
    """The optimized standalone model as the body again: the body's own formal inputs and
    declared outputs, the optimized nodes and initializers; the captured values are read from
    the scope around it again."""
    g = optimized.graph
    out = onnx.GraphProto()
    out.name = body.name
    out.input.extend(body.input)
    out.output.extend(body.output)
    out.node.extend(g.node)
    out.initializer.extend(g.initializer)
    return out


def _interface(body: onnx.GraphProto) -> set[str]:
    return {i.name for i in body.input} | {o.name for o in body.output}


def _flows(graph: Graph) -> list[int]:
    return [nid for nid in graph.topo_order() if graph[nid].op == "opaque"
            and body_names(graph[nid].attrs["onnx_node"])]


def _body_nodes(graph: onnx.GraphProto) -> int:
    return sum(1 + sum(_body_nodes(b) for b in subgraphs(n)) for n in graph.node)


def body_node_count(graph: Graph) -> int:
    """How many operators the graph's control-flow bodies hold, at every depth."""
    return sum(_body_nodes(b) for nid in _flows(graph)
               for b in subgraphs(node_proto(graph[nid].attrs["onnx_node"])))


def optimize_bodies(graph: Graph, search: BodySearch, seconds: float, threads: int
                    ) -> tuple[Graph, list[BodyOutcome]]:
    """`graph` with each control-flow body replaced by its optimized version where that is
    predicted cheaper and checks out, and what happened to each body. `seconds` is shared
    among the bodies by their size."""
    searcher = BodySearcher(search, graph, seconds, threads)
    return searcher.optimize(graph), searcher.outcomes


class BodySearcher:
    """Searches every body of a graph's control-flow nodes (see the module's docstring)."""

    def __init__(self, search: BodySearch, graph: Graph, seconds: float, threads: int) -> None:
        self.search = search
        domains = dict(graph.facts.domain_opsets)
        domains[""] = graph.facts.opset or domains.get("", 17)
        self.opsets = sorted(domains.items())
        self.threads = threads
        self.seconds = seconds
        self.total = max(body_node_count(graph), 1)
        self.symbols = dict(graph.facts.symbols)
        self.outcomes: list[BodyOutcome] = []

    def optimize(self, graph: Graph, avoid: Collection[str] = ()) -> Graph:
        """`graph` with its bodies optimized (nested ones first); `avoid`: the names of the
        scopes around it, which no new value inside may take."""
        flows = _flows(graph)
        if not flows:
            return graph
        names = set(avoid) | set(graph.input_names) | set(graph.output_names)
        users = graph.users()
        edit = None
        for nid in flows:
            new_node = self._node(graph, nid, names, users)
            if new_node is None:
                continue
            edit = edit or graph.edit()
            proto, inputs, captures = new_node
            old = graph[nid]
            outs = edit.add("opaque", inputs, old.attrs.replace(
                onnx_node=proto.SerializeToString(), captures=captures), name=old.name)
            for i, value in enumerate(outs):
                edit.replace_uses(Value(nid, i), value)
        return edit.finish() if edit is not None else graph

    def _node(self, graph: Graph, nid: int, avoid: set[str],
              users: Mapping[int, list[tuple[int, int]]]
              ) -> tuple[onnx.NodeProto, list[Value], tuple[str, ...]] | None:
        node = graph[nid]
        proto = node_proto(node.attrs["onnx_node"])
        slots, captures = node.attrs["input_slots"], node.attrs["captures"]
        values = dict(zip(captures, node.inputs[len(slots):]))
        types = {name: graph.type_of(v) for name, v in values.items()}
        slot_types = {proto.input[s]: graph.type_of(v) for s, v in zip(slots, node.inputs)}
        found = bodies(proto)
        # Outer weights become constants of the bodies (shape computations fold over them,
        # indices stay in range, weight rules see them): a small one is copied into each body
        # that reads it, a large one moves inside when one body of this node alone reads it
        # (a large one read elsewhere too stays an outer value, not copied).
        readers = {name: sum(name in body_reads(b) for _, b in found) for name in values}
        inside = {name: numpy_helper.from_array(graph[v.node].attrs["value"].array, name)
                  for name, v in values.items() if graph[v.node].op == "weight"
                  and (graph.type_of(v).numel <= MAX_COPIED_ELEMENTS or (
                      readers[name] == 1 and len({r for r, _ in users.get(v.node, ())}) == 1))}
        changed = False
        for attr, body in found:
            where = f"{proto.op_type} node {proto.name or node.name!r} {attr}"
            formal = formal_types(proto, attr, slot_types)
            # Captured names stay the outer values' (a weight moved inside gets a new name).
            names = (avoid | set(captures)) - _interface(body)
            try:
                new = self._body(body, formal, types, inside, where, names)
            except (GraphsubError, ValueError, RuntimeError) + ORT_ERRORS as exc:
                # One body that cannot be searched degrades the result; it never ends the run.
                self.outcomes.append(BodyOutcome(where, len(body.node), math.nan, math.nan,
                                                 False, f"not searched: {exc}"))
                warnings.warn(f"{where} was not searched: {exc}", RuntimeWarning, stacklevel=2)
                continue
            if new is not None:
                body.CopyFrom(new)
                changed = True
        if not changed:
            return None
        new_captures = captured_names(proto)
        if not set(new_captures) <= set(captures):
            return None  # a body cannot read what the node was not given
        inputs = [*node.inputs[:len(slots)], *(values[n] for n in new_captures)]
        return proto, inputs, new_captures

    def _body(self, body: onnx.GraphProto, formal: list[TensorType] | None,
              captured: Mapping[str, TensorType], inside: Mapping[str, onnx.TensorProto],
              where: str, avoid: set[str]) -> onnx.GraphProto | None:
        from graphsub.onnx_io.exporter import to_onnx
        from graphsub.onnx_io.importer import load

        if formal is None or len(formal) != len(body.input) or len(body.node) < MIN_BODY_NODES:
            return None
        original = standalone_model(body, formal, captured, inside, self.opsets, Placeholders())
        try:
            graph = load(original)
        except GraphsubError as exc:
            self.outcomes.append(BodyOutcome(where, len(body.node), math.nan, math.nan, False,
                                             f"not searched: {exc}"))
            return None
        if self.symbols and graph.facts.symbols:
            graph = graph.with_facts(symbols={n: self.symbols.get(n, r)
                                              for n, r in graph.facts.symbols.items()})
        start = self.optimize(graph, avoid)
        best, before, after = self.search(start, self.seconds * len(body.node) / self.total)
        if after >= before * (1 - MIN_GAIN):
            best = start  # not worth a change of its own (nested bodies may have changed)
        if best.structural_hash() == graph.structural_hash():
            self.outcomes.append(BodyOutcome(where, len(body.node), before, after, False,
                                             "nothing cheaper found"))
            return None
        try:
            optimized = to_onnx(best, opset=graph.facts.opset, avoid=avoid)
            comparison = self._check(original, optimized, graph)
        except GraphsubError as exc:
            self.outcomes.append(BodyOutcome(where, len(body.node), before, after, False,
                                             f"not kept: {exc}"))
            return None
        if not comparison:
            self.outcomes.append(BodyOutcome(where, len(body.node), before, after, False,
                                             "not kept: it did not compute what the body "
                                             "computes (a bug: please report it)"))
            return None
        self.outcomes.append(BodyOutcome(where, len(body.node), before, after, True))
        return _written_back(body, optimized)

    def _check(self, original: onnx.ModelProto, optimized: onnx.ModelProto, graph: Graph) -> bool:
        bindings = check_bindings(graph.facts.symbols) or [{}]
        a, b = (make_session(m.SerializeToString(), self.threads, quiet=True)
                for m in (original, optimized))
        names = [o.name for o in a.get_outputs()]

        def runner(session: Any) -> Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]:
            return lambda feeds: dict(zip(names, session.run(names, dict(feeds), quiet_run())))

        tolerance = SAME_FUNCTION.for_precision(value_dtypes(graph))
        return all(compare_runners(runner(a), runner(b), graph_input_specs(graph, binding),
                                   tolerance, trials=2).equivalent for binding in bindings)
