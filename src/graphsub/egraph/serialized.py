"""Read e-graphs in the egraph-serialize JSON format (egg, egglog, Tensat, extraction-gym).

The format names nodes and classes by strings and lets a child name *a node* of the child
class rather than the class itself; extractors want dense indices and child classes, so the
reader maps both. A file looks like::

    {"nodes": {"3__0": {"op": "Relu(2)", "cost": 0.02, "eclass": "3", "children": ["2__0"]}},
     "root_eclasses": ["3"]}

Other top-level keys (Tensat's "comment", egglog's "class_data") are ignored.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from graphsub.egraph.problem import ExtractionProblem
from graphsub.errors import GraphsubError


def load_serialized(path: str | Path) -> ExtractionProblem:
    """Read an egraph-serialize JSON file as an ExtractionProblem.

    Classes are numbered in the order they first appear among the nodes and nodes in file
    order, so the same file always gives the same problem. `labels` are the nodes' ops.
    egraph-serialize's defaults apply: a node without "cost" costs 1, one without
    "children" is a leaf. Raises GraphsubError naming the file and the culprit for a
    missing or unreadable file, bad JSON, a malformed node, a child naming an unknown node
    and a root class with no node.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise GraphsubError(f"{path}: no such e-graph file") from None
    except OSError as err:
        raise GraphsubError(f"{path}: cannot read the e-graph file ({err.strerror})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise GraphsubError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), dict):
        raise GraphsubError(f'{path}: not an egraph-serialize file (no "nodes" object)')
    return _problem(path, data["nodes"], data.get("root_eclasses", []))


def _problem(path: Path, nodes: dict[str, Any], roots: Any) -> ExtractionProblem:
    node_index = {node_id: i for i, node_id in enumerate(nodes)}
    class_index: dict[str, int] = {}
    node_class, node_cost, labels, child_ids = [], [], [], []
    for node_id, node in nodes.items():
        if not isinstance(node, dict) or "eclass" not in node or "op" not in node:
            raise GraphsubError(f'{path}: node {node_id!r} needs an "op" and an "eclass"')
        cost = node.get("cost", 1.0)
        if isinstance(cost, bool) or not isinstance(cost, int | float) or math.isnan(cost):
            raise GraphsubError(f"{path}: node {node_id!r} has cost {cost!r}, not a number")
        children = node.get("children", [])
        if not isinstance(children, list):
            raise GraphsubError(f'{path}: node {node_id!r}: "children" must be a list')
        node_class.append(class_index.setdefault(str(node["eclass"]), len(class_index)))
        node_cost.append(float(cost))
        labels.append(str(node["op"]))
        child_ids.append(children)
    node_children = []
    for node_id, children in zip(nodes, child_ids, strict=True):
        try:
            node_children.append(tuple(node_class[node_index[child]] for child in children))
        except (KeyError, TypeError):
            unknown = next(c for c in children if not isinstance(c, str) or c not in node_index)
            raise GraphsubError(
                f"{path}: node {node_id!r} has child {unknown!r}, which is not a node") from None
    if not isinstance(roots, list):
        raise GraphsubError(f'{path}: "root_eclasses" must be a list of class ids')
    missing = [root for root in roots if str(root) not in class_index]
    if missing:
        raise GraphsubError(f"{path}: root e-class {missing[0]!r} has no node in the file")
    return ExtractionProblem(node_class=node_class, node_cost=node_cost,
                             node_children=node_children,
                             roots=[class_index[str(root)] for root in roots], labels=labels)
