"""From an e-graph to extraction and back to a graph.

`extraction_problem` prices every live e-node with the cost model (an e-node costs what a graph
node with the same signature costs: zero for inputs, weights, projections and weight-only
e-nodes, which are folded at export) and numbers classes and nodes densely for the extractors.
`graph_from_choice` turns an extractor's choice (one e-node per class) into a graphsub Graph,
which then goes through the same pricing, measuring, verification and export as any search
result. Node names of the input graph (weights, inputs) are kept.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from graphsub.cost.base import CostModel, costs_nothing, make_signature, signature_values
from graphsub.egraph.egraph import PROJ, EGraph
from graphsub.egraph.problem import ExtractionProblem
from graphsub.errors import GraphsubError
from graphsub.ir.graph import Graph, Node, Value, make_node


@dataclass
class EGraphProblem:
    """An extraction problem and how its indices map back to the e-graph."""

    problem: ExtractionProblem
    enodes: list[int]          # problem node -> e-node id
    classes: list[int]         # problem class -> canonical class id


class NodeCosts:
    """Costs of e-nodes under one cost model, memoized by what the cost depends on: op,
    attributes, input types and which inputs are weight-only. (Not by e-node id: MCTS prices
    clones of one e-graph, in which one id names different e-nodes once they diverge.)"""

    def __init__(self, cost_model: CostModel) -> None:
        self.cost_model = cost_model
        self._memo: dict[tuple[object, ...], float] = {}

    def cost(self, eg: EGraph, nid: int) -> float:
        node = eg.node(nid)
        if node.op == PROJ:
            return 0.0
        kids = [eg[c] for c in node.children]
        consts = tuple(k.weight_only for k in kids)
        if costs_nothing(node.op, bool(kids) and all(consts) and not node.salt):
            return 0.0
        ins = tuple(k.types[0] for k in kids)
        values = signature_values(node.op, tuple(k.constant for k in kids))
        key = (node.op, node.attrs, ins, consts, values)
        cost = self._memo.get(key)
        if cost is None:
            sig = make_signature(node.op, node.attrs, ins, consts, eg[eg.class_of(nid)].types,
                                 lambda: tuple(k.constant for k in kids))
            cost = self.cost_model.signature_cost(sig)
            self._memo[key] = cost
        return cost


def extraction_problem(eg: EGraph, roots: Sequence[int], costs: NodeCosts) -> EGraphProblem:
    """The e-graph's live e-nodes as an extraction problem rooted at `roots`."""
    classes = list(eg.classes)
    index = {c: i for i, c in enumerate(classes)}
    node_class: list[int] = []
    node_cost: list[float] = []
    node_children: list[tuple[int, ...]] = []
    labels: list[str] = []
    enodes: list[int] = []
    for i, cls in enumerate(classes):
        for n in eg.nodes_of(cls):
            node = eg.node(n)
            node_class.append(i)
            node_cost.append(costs.cost(eg, n))
            node_children.append(tuple(index[eg.find(c)] for c in node.children))
            labels.append(node.op)
            enodes.append(n)
    problem = ExtractionProblem(node_class, node_cost, node_children,
                                [index[eg.find(r)] for r in roots], labels)
    return EGraphProblem(problem, enodes, classes)


def graph_from_choice(eg: EGraph, ep: EGraphProblem, choice: Mapping[int, int],
                      template: Graph, input_classes: Sequence[int],
                      output_classes: Sequence[int]) -> Graph:
    """The graph an extraction chose (class index -> problem node index), with the template's
    inputs (all of them, in order, used or not), output names and metadata."""
    nodes: dict[int, Node] = {}
    value_of: dict[int, Value] = {}  # problem class -> graph value
    class_index = {c: i for i, c in enumerate(ep.classes)}
    for new_id, (nid, cls) in enumerate(zip(template.inputs, input_classes)):
        nodes[new_id] = template[nid]
        value_of[class_index[eg.find(cls)]] = Value(new_id)
    next_id = len(nodes)

    roots = [class_index[eg.find(c)] for c in output_classes]
    stack: list[tuple[int, bool]] = [(r, False) for r in reversed(roots)]
    on_path: set[int] = set()
    while stack:
        cls, done = stack.pop()
        if cls in value_of:
            continue
        if cls not in choice:
            raise GraphsubError(f"the extraction chose nothing for e-class {ep.classes[cls]}")
        pnode = choice[cls]
        kids = ep.problem.node_children[pnode]
        if not done:
            if cls in on_path:
                raise GraphsubError("the extraction is cyclic")
            on_path.add(cls)
            stack.append((cls, True))
            stack.extend((k, False) for k in kids if k not in value_of)
            continue
        on_path.discard(cls)
        enode = eg.node(ep.enodes[pnode])
        if enode.op == PROJ:
            value_of[cls] = Value(value_of[kids[0]].node, enode.attrs["index"])
            continue
        inputs = [value_of[k] for k in kids]
        types = [nodes[v.node].outputs[v.index] for v in inputs]
        nodes[next_id] = make_node(enode.op, inputs, types, enode.attrs,
                                   eg.names.get(ep.enodes[pnode], ""))
        value_of[cls] = Value(next_id)
        next_id += 1
    outputs = [value_of[r] for r in roots]
    return Graph(nodes, list(range(len(template.inputs))), outputs, template.output_names,
                 template.facts)
