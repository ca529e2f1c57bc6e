"""A model as a user hands it to graphsub, from the command line or from Python: its graph
(with the input sizes and values given), the ONNX onnxruntime runs as the original, and its
name for reports. `graphsub optimize` and `graphsub.optimize_model` take the same one.

    model = graphsub.open_model("vad.onnx", input_shapes={"x": (1, 512)},
                                input_values={"sr": 16000}, custom_ops=["libops.so"])
    data, report = graphsub.optimize_model(model, time_limit=60)
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from graphsub.errors import GraphsubError

if TYPE_CHECKING:
    from graphsub.ir.graph import Graph
    from graphsub.runtime.inputs import InputSpec
    from graphsub.runtime.ort_sessions import ModelData


@dataclass(frozen=True)
class LoadedModel:
    """A model as given: its graph, the ONNX of the original (bytes, or a DetachedModel
    where its weights are kept apart), and its name."""

    graph: Graph
    original: ModelData
    label: str

    @property
    def sizes(self) -> dict[str, int]:
        """The sizes a model with symbolic sizes is run at by default (the default profile's
        first shape; none for a static one)."""
        from graphsub.runtime.check_sizes import default_profile

        profile = default_profile(self.graph.facts.symbols)
        return profile[0].values if profile else {}

    def input_specs(self, sizes: Mapping[str, int] | None = None) -> list[InputSpec]:
        """The model's inputs, with their types bound at `sizes` (default: `self.sizes`)."""
        from graphsub.runtime import graph_input_specs

        return graph_input_specs(self.graph, dict(self.sizes if sizes is None else sizes))


def open_model(source: Any, input_shapes: Mapping[str, Sequence[int]] | None = None,
               input_values: Mapping[str, Any] | None = None,
               custom_ops: Sequence[str | os.PathLike[str]] = ()) -> LoadedModel:
    """The model `source` names: an ONNX file (its path), an onnx.ModelProto, ONNX bytes, or
    the name of a zoo model (graphsub.zoo). `input_shapes` fixes open sizes of inputs;
    `input_values` gives inputs the values the model is to be searched, measured and
    verified at (a number, an array, or text as on the command line: "16000", "1,2,3");
    `custom_ops` are onnxruntime custom-op libraries, registered before the model is read
    (its operators of other domains are typed by running them). The file is parsed once."""
    from graphsub.onnx_io.importer import load_with_original
    from graphsub.runtime.inputs import given_values
    from graphsub.runtime.ort_sessions import use_custom_ops

    use_custom_ops(custom_ops)
    if isinstance(source, (str, os.PathLike)) and _names_a_file(source):
        graph, original = load_with_original(source, input_shapes)
        label = Path(source).name
    elif isinstance(source, (str, os.PathLike)):
        from graphsub import zoo
        from graphsub.onnx_io import to_onnx_bytes

        if input_shapes:
            raise GraphsubError("input shapes apply to ONNX files; zoo models have fixed "
                                "shapes (use the model's parameters instead)")
        graph = zoo.build(os.fspath(source))
        original, label = to_onnx_bytes(graph), os.fspath(source)
    else:
        graph, original = load_with_original(source, input_shapes)
        label = getattr(getattr(source, "graph", None), "name", "") or "model"
    if input_values:
        graph = graph.with_facts(input_values=given_values(graph, input_values))
    return LoadedModel(graph, original, label)


def _names_a_file(source: str | os.PathLike[str]) -> bool:
    path = os.fspath(source)
    return os.path.exists(path) or path.endswith(".onnx") or isinstance(source, Path)


__all__ = ["LoadedModel", "open_model"]
