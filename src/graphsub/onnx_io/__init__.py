"""ONNX import and export."""

from graphsub.onnx_io.exporter import DEFAULT_OPSET, save, to_model_data, to_onnx, to_onnx_bytes
from graphsub.onnx_io.external import write_model
from graphsub.onnx_io.files import write_atomic
from graphsub.onnx_io.importer import load

__all__ = ["DEFAULT_OPSET", "load", "save", "to_model_data", "to_onnx", "to_onnx_bytes",
           "write_atomic", "write_model"]
