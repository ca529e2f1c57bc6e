"""graphsub: a tensor-graph superoptimizer.

    import graphsub
    model = graphsub.open_model("model.onnx", input_shapes={"x": (1, 3, 224, 224)})
    data, report = graphsub.optimize_model(model)  # search, measure, choose, verify
    graphsub.save(data, "fast.onnx")               # what `graphsub optimize` writes
    report.save("report.html")                     # and its --report
    result = graphsub.optimize(model.graph)        # the search alone: .graph, .trace, .stats
    fast_ep = graphsub.optimize_exported(ep)       # a torch.export program (torch extra)

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
    "open_model": "graphsub.loaded", "LoadedModel": "graphsub.loaded",
    "use_custom_ops": "graphsub.runtime.ort_sessions",
    "optimize_exported": "graphsub.frontends.exported",
}
__all__ = ["Graph", "GraphBuilder", "GraphsubError", "LoadedModel", "Node", "TensorType", "Value",
           "load", "open_model", "optimize", "optimize_exported", "optimize_model", "save",
           "to_onnx",
           "use_custom_ops", "__version__"]
__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)

if TYPE_CHECKING:
    from graphsub.errors import GraphsubError
    from graphsub.ir import Graph, GraphBuilder, Node, TensorType, Value
    from graphsub.loaded import LoadedModel, open_model
    from graphsub.onnx_io import load, save, to_onnx
    from graphsub.optimizer import optimize, optimize_model
    from graphsub.runtime.ort_sessions import use_custom_ops
