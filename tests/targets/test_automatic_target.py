"""The target of a run whose user named none: the first of the machine's defaults that takes
the settings and can run the model. On a GPU machine the default is torch-cuda, which cannot
run an ONNX op graphsub does not model (silero's 1-D Conv, PP-OCR's HardSigmoid): such a model
is optimized for onnxruntime on the CPU, with a note, where it once ended with exit 2."""

from __future__ import annotations

import pytest
from onnx import TensorProto, helper

import graphsub
from graphsub import targets
from graphsub.targets import ort_fusions
from graphsub.pipeline import Settings
from graphsub.runtime import graph_input_specs
from graphsub.verdicts import compare_models
from tests.markers import requires_torch


def model_with(op_type: str) -> bytes:
    nodes = [helper.make_node(op_type, ["x"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [2, 8])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [2, 8])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]) \
        .SerializeToString()


@requires_torch
def test_off_the_cpu_the_torch_target_cannot_run_an_op_graphsub_does_not_model(monkeypatch):
    """The check lowers each opaque node as the program would, on a device that is not the
    CPU (a meta device stands for the GPU this machine may not have)."""
    import torch

    target = targets.get_target("torch-cpu")
    graph = graphsub.load(model_with("HardSigmoid"))
    assert graph.nodes_by_op("opaque") and target.cannot_run(graph) is None
    monkeypatch.setattr(target, "device_type", "cuda")
    monkeypatch.setattr(target, "torch_device", torch.device("meta"))
    reason = target.cannot_run(graph)
    assert reason is not None and "'HardSigmoid'" in reason and "--target" not in reason
    assert target.cannot_run(graphsub.load(model_with("Sigmoid"))) is None
    assert target.cannot_run(graphsub.load(model_with("Abs"))) is None  # opaque, torch has it


@requires_torch
def test_a_model_the_default_cannot_run_is_optimized_for_the_next_with_a_note(monkeypatch):
    from graphsub.targets.torch.target import TorchCpuTarget

    monkeypatch.setattr(targets, "DEFAULT_ORDER", ("torch-cpu", "ort-cpu"))
    monkeypatch.setattr(TorchCpuTarget, "cannot_run",
                        lambda self, graph: "stand-in: no HardSigmoid here"
                        if any(graph[n].attrs.get("op_type") == "HardSigmoid"
                               for n in graph.nodes_by_op("opaque")) else None)
    data = model_with("HardSigmoid")
    optimized, report = graphsub.optimize_model(graphsub.load(data), data, cost="analytic",
                                                time_limit=4)
    assert report.target == "ort-cpu"
    (note,) = [n for n in report.notes if "no --target was named" in n]
    assert "torch-cpu: stand-in: no HardSigmoid here" in note and "ort-cpu instead" in note
    specs = graph_input_specs(graphsub.load(data))
    assert compare_models(data, optimized, specs).equivalent

    plain = model_with("Sigmoid")
    _, report = graphsub.optimize_model(graphsub.load(plain), plain, cost="analytic",
                                        time_limit=4)
    assert report.target == "torch-cpu"
    assert not [n for n in report.notes if "no --target was named" in n]


def test_the_default_target_is_one_that_takes_the_settings(monkeypatch):
    """--ort-fusions needs onnxruntime's own operators; a target option, the target that
    declares it: where no target is named, the default is the first that takes them."""
    monkeypatch.setattr(targets, "DEFAULT_ORDER", ("torch-cpu", "ort-cpu"))
    monkeypatch.setattr(targets, "unavailable_reason", lambda name: None)
    monkeypatch.setattr(ort_fusions, "check_available", lambda: None)  # onnxscript: an extra
    assert Settings.make(ort_fusions=True).target_name == "ort-cpu"
    assert Settings.make().target_name == "torch-cpu"
    caps = targets.capabilities
    assert Settings.make().fits(caps("ort-cpu"))
    assert not Settings.make(ort_fusions=True).fits(caps("torch-cpu"))
    assert Settings.make(target="torch-cuda", target_options={"cuda_graphs": False}).fits(
        caps("torch-cuda"))
    with pytest.raises(graphsub.GraphsubError, match="cuda_graphs is an option of torch-cuda"):
        Settings.make(target_options={"cuda_graphs": False})
