"""graphsub: a tensor-graph superoptimizer.

    import graphsub
    graph = graphsub.load("model.onnx", input_shapes={"x": (1, 3, 224, 224)})
    result = graphsub.optimize(graph)            # search: result.graph, .trace, .stats
    data, report = graphsub.optimize_model(graph)  # search, measure, choose, verify
    graphsub.save(result.graph, "fast.onnx")

The names are imported when first used (graphsub.lazy).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from graphsub.lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "GraphsubError": "graphsub.errors",
    "Graph": "graphsub.ir.graph", "Node": "graphsub.ir.graph", "Value": "graphsub.ir.graph",
    "GraphBuilder": "graphsub.ir.builder", "TensorType": "graphsub.tensors.types",
    "load": "graphsub.onnx_io", "save": "graphsub.onnx_io", "to_onnx": "graphsub.onnx_io",
    "optimize": "graphsub.optimizer", "optimize_model": "graphsub.optimizer",
}
__all__ = ["Graph", "GraphBuilder", "GraphsubError", "Node", "TensorType", "Value", "load",
           "optimize", "optimize_model", "save", "to_onnx", "__version__"]
__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)

if TYPE_CHECKING:
    from graphsub.errors import GraphsubError
    from graphsub.ir import Graph, GraphBuilder, Node, TensorType, Value
    from graphsub.onnx_io import load, save, to_onnx
    from graphsub.optimizer import optimize, optimize_model
