"""graphsub: a tensor-graph superoptimizer.

    import graphsub
    graph = graphsub.load("model.onnx", input_shapes={"x": (1, 3, 224, 224)})
    result = graphsub.optimize(graph)            # search: result.graph, .trace, .stats
    data, report = graphsub.optimize_model(graph)  # search, measure, choose, verify
    graphsub.save(result.graph, "fast.onnx")
"""

from graphsub.errors import GraphsubError
from graphsub.ir import Graph, GraphBuilder, Node, TensorType, Value
from graphsub.onnx_io import load, save, to_onnx
from graphsub.optimizer import optimize, optimize_model

__version__ = "0.1.0"

__all__ = ["Graph", "GraphBuilder", "GraphsubError", "Node", "TensorType", "Value", "load",
           "optimize", "optimize_model", "save", "to_onnx", "__version__"]
