"""Marks shared by the test modules."""

from __future__ import annotations

import importlib.util

import pytest

HAVE_TORCH = importlib.util.find_spec("torch") is not None
#: Tests of the torch targets and frontend: they skip, saying why, on an install without the
#: torch extra (graphsub's core needs no torch).
requires_torch = pytest.mark.skipif(
    not HAVE_TORCH, reason="needs PyTorch, graphsub's torch extra: pip install torch==2.13.0")


def targets(*names: str) -> list:
    """Target names as parameters, the torch ones marked requires_torch."""
    return [pytest.param(n, marks=requires_torch) if n.startswith("torch-") else n
            for n in names]

HAVE_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
#: Tests on models exported from transformers: they skip, saying why, without it (it comes
#: with graphsub's test extra).
requires_transformers = pytest.mark.skipif(
    not HAVE_TRANSFORMERS, reason="needs transformers, in graphsub's test extra: "
                                  "pip install -e '.[test]'")

HAVE_ORT_EXTENSIONS = importlib.util.find_spec("onnxruntime_extensions") is not None
#: Tests of custom-op libraries: they use onnxruntime-extensions' (in graphsub's test extra).
requires_ort_extensions = pytest.mark.skipif(
    not HAVE_ORT_EXTENSIONS, reason="needs onnxruntime-extensions, in graphsub's test extra: "
                                    "pip install -e '.[test]'")
