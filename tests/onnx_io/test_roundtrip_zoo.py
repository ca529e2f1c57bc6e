"""Round trip of every zoo model (the papers' models and the onnx wheel's light models):
export, import, export again; both ONNX models agree in onnxruntime within 1e-4 relative.
The builder models are also checked against the numpy reference evaluator."""

from __future__ import annotations

import numpy as np
import pytest

import graphsub
from graphsub import zoo
from graphsub.runtime import evaluate, graph_input_specs, random_feeds, run
from graphsub.verdicts import compare_models
from graphsub.verdicts.equivalence import Tolerance

#: Models that build, export and run in well under a few seconds on 2 cores.
FAST = {"nasrnn", "sru", "squeezenet", "mobilenet_v2", "resnet_blocks", "inception_e_blocks",
        "light_inception_v1", "light_squeezenet", "light_resnet50", "light_shufflenet"}


def zoo_params(filter_fn=lambda name: True):
    return [pytest.param(n, marks=() if n in FAST else pytest.mark.slow)
            for n in zoo.names() if filter_fn(n)]


@pytest.mark.parametrize("name", zoo_params())
def test_round_trip_preserves_outputs(name):
    graph = zoo.build(name)
    first = graphsub.to_onnx(graph)
    reloaded = graphsub.load(first)
    second = graphsub.to_onnx(reloaded)
    specs = graph_input_specs(graph)
    assert graph_input_specs(reloaded) == specs
    result = compare_models(first.SerializeToString(), second.SerializeToString(), specs,
                            Tolerance(1e-4, 1e-5), trials=1)
    assert result.equivalent, [d.describe() for d in result.outputs] + list(result.problems)


@pytest.mark.parametrize("name", zoo_params(lambda n: not n.startswith("light_")))
def test_reference_evaluator_agrees_with_onnxruntime(name):
    graph = zoo.build(name)
    feeds = random_feeds(graph_input_specs(graph), seed=3)
    ref = evaluate(graph, feeds)
    got = run(graphsub.to_onnx(graph), feeds)
    for out in graph.output_names:
        assert np.isfinite(ref[out]).all()
        assert float(np.std(ref[out])) > 1e-6, "degenerate (constant) output"
        np.testing.assert_allclose(got[out], ref[out], rtol=1e-3, atol=1e-3 * float(np.abs(ref[out]).max()))


def test_light_models_are_in_the_zoo_and_convert_from_opset_9():
    names = [n for n in zoo.names() if n.startswith("light_")]
    assert len(names) == 9
    g = zoo.build("light_bvlc_alexnet")
    assert g.facts.source_opset == 9 and g.facts.opset == 13
    assert [g[n].attrs["op_type"] for n in g.topo_order() if g[n].op == "opaque"] == ["LRN", "LRN"]


@pytest.mark.parametrize("spec", ["bert:layers=1,seq=8,hidden=32,heads=4", "vit:layers=1", "sru",
                                  "mobilenet_v2"])
def test_round_trip_gives_back_the_same_graph(spec):
    """Where export neither folds weight-only nodes nor splits fused activations, import
    rebuilds the very same graph: scalar Mul is smul again, float attributes keep their
    float32 values, Gelu (opset 20+) stays gelu."""
    graph = zoo.build(spec)
    again = graphsub.load(graphsub.to_onnx(graph, opset=23))
    assert again.structural_hash() == graph.structural_hash()
