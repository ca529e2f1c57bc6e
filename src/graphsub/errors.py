"""Errors graphsub raises on bad input.

Every error a user can provoke is a subclass of :class:`GraphsubError`, so the CLI can print
its message (which names the problem and what to do) instead of a traceback.
"""

from __future__ import annotations


class GraphsubError(Exception):
    """Base class of every error caused by the user's input rather than by a bug."""


class ShapeError(GraphsubError):
    """An operator was given inputs whose shapes or dtypes it cannot accept."""


class OpAttributeError(GraphsubError):
    """An operator was given an unknown, missing or malformed attribute."""


class CycleError(GraphsubError):
    """The graph has a cycle, so it has no evaluation order."""


class ModelLoadError(GraphsubError):
    """A model file could not be read or is not a usable ONNX model."""


class MissingInputShapeError(ModelLoadError):
    """A model input has symbolic or unknown dimensions and no concrete shape was given."""


class UnknownModelError(GraphsubError):
    """A model name is neither an existing file nor a zoo model."""


class ExportError(GraphsubError):
    """A graph could not be written as a valid ONNX model."""


class NoLoweringError(GraphsubError):
    """An operator has no torch lowering on this device."""


class ConversionError(GraphsubError):
    """A torch (ATen) node cannot be expressed with graphsub's operators."""
