"""An e-graph reduced to what extraction needs: classes, nodes, costs, children, roots.

Extraction does not care where an e-graph came from (graphsub's own e-graph after saturation,
or a serialized one from another tool), so extractors take this plain, index-based form. Nodes
and classes are numbered densely from 0; a node's children are class indices.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ExtractionProblem:
    """The input of every extractor.

    `node_cost[i]` is what node i costs when it is part of the extracted graph; a graph costs
    the sum over the *distinct* nodes it uses (its DAG cost: a shared subgraph is computed
    once). `labels` name the nodes for display only.
    """

    node_class: list[int]
    node_cost: list[float]
    node_children: list[tuple[int, ...]]
    roots: list[int]
    labels: list[str] = field(default_factory=list)
    class_nodes: list[list[int]] = field(init=False)

    def __post_init__(self) -> None:
        n_classes = max(self.node_class, default=-1) + 1
        self.class_nodes = [[] for _ in range(n_classes)]
        for node, cls in enumerate(self.node_class):
            self.class_nodes[cls].append(node)

    @property
    def num_nodes(self) -> int:
        return len(self.node_class)

    @property
    def num_classes(self) -> int:
        return len(self.class_nodes)
