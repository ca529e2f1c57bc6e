"""ONNX import and export."""

from graphsub.onnx_io.exporter import DEFAULT_OPSET, save, to_onnx, to_onnx_bytes, write_atomic
from graphsub.onnx_io.importer import load

__all__ = ["DEFAULT_OPSET", "load", "save", "to_onnx", "to_onnx_bytes", "write_atomic"]
