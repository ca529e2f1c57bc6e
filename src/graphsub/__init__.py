"""graphsub: a tensor-graph superoptimizer.

    import graphsub
    graph = graphsub.load("model.onnx", input_shapes={"x": (1, 3, 224, 224)})
    graphsub.save(graph, "copy.onnx")
"""

from graphsub.errors import GraphsubError
from graphsub.ir import Graph, GraphBuilder, Node, TensorType, Value
from graphsub.onnx_io import load, save, to_onnx

__version__ = "0.1.0"

__all__ = ["Graph", "GraphBuilder", "GraphsubError", "Node", "TensorType", "Value", "load",
           "save", "to_onnx", "__version__"]
