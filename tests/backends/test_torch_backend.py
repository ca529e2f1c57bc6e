"""graphsub's torch backend: every operator has a lowering (each is checked against the numpy
reference and onnxruntime in tests/ops through `check_op`), every zoo model computes what
onnxruntime computes, views stay views, and CUDA runs (with and without CUDA graphs) match the
CPU where a GPU is present."""

from __future__ import annotations

import numpy as np
import pytest

import graphsub
from graphsub import zoo
from graphsub.ir.builder import GraphBuilder
from graphsub.ops import all_ops
from graphsub.runtime import diff_arrays, graph_input_specs, random_feeds, run
from tests.onnx_io.test_roundtrip_zoo import zoo_params

torch = pytest.importorskip("torch", reason="torch is an optional extra (pip install graphsub[torch])")

from graphsub.backends.torch import (LOWERINGS, NoLoweringError, TorchCpuTarget,  # noqa: E402
                                     TorchProgram, TorchRunnable)
from graphsub.backends.torch.lowering import LowerContext, lower  # noqa: E402

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(
    not CUDA, reason=f"no CUDA device: torch {torch.__version__} "
                     f"({'CPU-only build' if torch.version.cuda is None else 'CUDA ' + torch.version.cuda})"
                     " sees no GPU, so the torch-cuda checks do not run here")


def test_every_operator_has_a_torch_lowering():
    missing = set(all_ops()) - set(LOWERINGS) - {"input", "weight"}
    assert not missing, f"operators the torch backend cannot run: {sorted(missing)}"


def assert_close(ref: dict, got: dict, rtol: float = 1e-3, atol_scale: float = 1e-3) -> None:
    for name, expected in ref.items():
        assert got[name].shape == expected.shape and got[name].dtype == expected.dtype
        scale = float(np.abs(expected).max()) if expected.size else 1.0
        d = diff_arrays(name, expected, got[name], rtol, atol_scale * max(scale, 1e-6))
        assert d.ok, d.describe()


@pytest.mark.parametrize("name", zoo_params())
def test_zoo_model_on_torch_cpu_matches_onnxruntime(name):
    graph = zoo.build(name)
    feeds = random_feeds(graph_input_specs(graph), seed=5)
    expected = run(graphsub.to_onnx(graph), feeds)
    assert_close(expected, TorchProgram(graph, "cpu").run(feeds))


@needs_cuda
@pytest.mark.parametrize("name", zoo_params(lambda n: not n.startswith("light_")))
def test_zoo_model_on_cuda_matches_cpu_with_and_without_cuda_graphs(name):
    graph = zoo.build(name)
    feeds = random_feeds(graph_input_specs(graph), seed=5)
    expected = TorchProgram(graph, "cpu").run(feeds)
    eager = TorchProgram(graph, "cuda")
    assert_close(expected, eager.run(feeds))
    runnable = TorchRunnable(eager, cuda_graphs=True)
    runnable.bind(feeds)
    outs = runnable._replay.replay()
    assert_close(expected, {n: t.cpu().numpy() for n, t in zip(eager.output_names, outs)})
    assert all(t > 0 for t in runnable.timed(3))


def test_views_stay_views_and_matmul_reads_the_transposed_layout():
    """transpose/split/reshape lower to views: a matmul of a transposed weight view and a
    split half reads them without copies, and the target reports their strides."""
    b = GraphBuilder(0)
    x = b.input("x", (8, 6))
    y = b.matmul(x, b.he_weight((6, 12)))
    left, right = b.split(y, axis=1, sizes=(6, 6))
    z = b.matmul(b.transpose(left, perm=(1, 0)), right)
    b.output(z, "z")
    g = b.build()
    target = TorchCpuTarget(threads=1)
    mm = g.outputs[0].node
    layouts = target.input_layouts(g, mm)
    assert layouts == ((1, 12), (12, 1))  # transposed view of a split, and the other half
    prog = TorchProgram(g, "cpu")
    code = prog.module.code
    assert "permute" in code and "split" in code and "contiguous" not in code
    feeds = random_feeds(graph_input_specs(g))
    np.testing.assert_allclose(prog.run(feeds)["z"], graphsub.runtime.evaluate(g, feeds)["z"],
                               rtol=1e-4, atol=1e-4)


def test_weight_only_subgraphs_are_folded_once_into_buffers():
    b = GraphBuilder(0)
    x = b.input("x", (2, 4))
    w = b.transpose(b.he_weight((3, 4)), perm=(1, 0))  # weight-only: folded at build
    b.output(b.matmul(x, w), "y")
    prog = TorchProgram(b.build(), "cpu")
    assert "permute" not in prog.module.code
    assert [tuple(t.shape) for t in prog.module.buffers()] == [(4, 3)]


def test_opaque_nodes_run_through_onnxruntime_on_cpu_and_are_refused_elsewhere():
    graph = zoo.build("light_bvlc_alexnet")  # two LRN nodes, opaque to graphsub
    feeds = random_feeds(graph_input_specs(graph), seed=1)
    assert_close(run(graphsub.to_onnx(graph), feeds), TorchProgram(graph, "cpu").run(feeds))
    node = next(graph[n] for n in graph.topo_order() if graph[n].op == "opaque")
    with pytest.raises(NoLoweringError, match="'LRN'.*only on the CPU"):
        lower(LowerContext(torch.device("meta")), "opaque", node.attrs,
              tuple(graph.type_of(v) for v in node.inputs), node.outputs)


def test_torch_runnable_times_and_runs():
    graph = zoo.build("sru")
    target = TorchCpuTarget(threads=1)
    runnable = target.prepare(graph)
    feeds = random_feeds(graph_input_specs(graph))
    runnable.bind(feeds)
    times = runnable.timed(4)
    assert len(times) == 4 and all(t > 0 for t in times)
    assert_close(graphsub.runtime.evaluate(graph, feeds), runnable.run(feeds))
