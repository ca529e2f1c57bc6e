"""What is known of a graph besides what it computes: where it came from, how its model
declared its inputs and outputs, the ranges of its size symbols, and the inputs it runs at.

Every graph made from another (an edit, a rewrite, a part, a binding of its sizes) carries its
facts, so a candidate the search found is written, measured and verified as the user's model
would be. They are a frozen record: a stage that learns one (the probe: the input values the
model runs at) makes a new graph with `Graph.with_facts`, never changes a graph that others
hold. They do not enter the graph's hash.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from graphsub.tensors.symbolic import SymbolRange

#: A value's dimensions as its model declared them: numbers, dim_param names, None where the
#: model wrote neither; None for a value declared without a shape.
DeclaredDims = tuple[int | str | None, ...] | None


@dataclass(frozen=True)
class GraphFacts:
    """The facts of one graph (all optional: a graph built by hand has none)."""

    #: The ONNX opset the graph's operators are in, and the one its model was written in
    #: (they differ where the importer converted an old model).
    opset: int | None = None
    source_opset: int | None = None
    #: Why the model's own opset was kept rather than converted ("": it was not).
    opset_kept: str = ""
    #: The opsets of the other domains the model imports (custom operators).
    domain_opsets: Mapping[str, int] = field(default_factory=dict)
    #: The program that wrote the model (ModelProto.producer_name).
    producer: str = ""
    #: Whether the model kept its weights in external files.
    external_data: bool = False
    #: Each size symbol's range (empty: a static graph).
    symbols: Mapping[str, SymbolRange] = field(default_factory=dict)
    #: How the model declared the inputs whose sizes the user fixed (--input-shape), and its
    #: outputs where it has symbolic sizes: what an export writes back.
    input_dims: Mapping[str, DeclaredDims] = field(default_factory=dict)
    output_dims: Mapping[str, DeclaredDims] = field(default_factory=dict)
    #: The values given to inputs (--input-value, or found by the probe): fed as given
    #: wherever graphsub runs the graph (runtime.inputs.GivenInput).
    input_values: Mapping[str, np.ndarray] = field(default_factory=dict)
    #: Whether an export declares the inputs as the model did rather than at the sizes fixed
    #: (control flow onnxruntime cannot type at fixed sizes: pipeline.probe_stage).
    inputs_as_declared: bool = False


#: The facts of a graph that has none.
NO_FACTS = GraphFacts()

__all__ = ["DeclaredDims", "GraphFacts", "NO_FACTS"]
