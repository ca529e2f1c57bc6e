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
from graphsub.ir.graph import Graph
from graphsub.ops import all_ops
from graphsub.runtime import graph_input_specs, random_feeds, run
from graphsub.verdicts import diff_arrays
from tests.onnx_io.test_roundtrip_zoo import zoo_params

torch = pytest.importorskip("torch", reason="torch is an optional extra (pip install graphsub[torch])")

from graphsub.targets.torch import (NoLoweringError, TorchCpuTarget, lowered_ops,  # noqa: E402
                                     TorchProgram, TorchRunnable)
from graphsub.targets.torch.lowering import LowerContext, lower  # noqa: E402

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(
    not CUDA, reason=f"no CUDA device: torch {torch.__version__} "
                     f"({'CPU-only build' if torch.version.cuda is None else 'CUDA ' + torch.version.cuda})"
                     " sees no GPU, so the torch-cuda checks do not run here")


def test_every_operator_has_a_torch_lowering():
    missing = set(all_ops()) - set(lowered_ops()) - {"input", "weight"}
    assert not missing, f"operators the torch backend cannot run: {sorted(missing)}"


def assert_close(ref: dict, got: dict, rtol: float = 1e-3, atol_scale: float = 1e-3) -> None:
    for name, expected in ref.items():
        assert got[name].shape == expected.shape and got[name].dtype == expected.dtype
        scale = float(np.abs(expected).max()) if expected.size else 1.0
        d = diff_arrays(name, expected, got[name], rtol, atol_scale * max(scale, 1e-6))
        assert d.ok, d.describe()


def with_logits(graph: Graph) -> Graph:
    """The graph with what every softmax reads as extra outputs: a softmax can hide a wrong
    computation (saturated) or invent one (logits tied by rounding), its input cannot."""
    logits = [graph[s].inputs[0] for s in graph.nodes_by_op("softmax")]
    return Graph(graph.nodes, graph.inputs, list(graph.outputs) + logits,
                 list(graph.output_names) + [f"logits{i}" for i in range(len(logits))],
                 graph.facts, graph.next_id)


@pytest.mark.parametrize("name", zoo_params())
def test_zoo_model_on_torch_cpu_matches_onnxruntime(name):
    graph = with_logits(zoo.build(name))
    feeds = random_feeds(graph_input_specs(graph), seed=5)
    expected = run(graphsub.to_onnx(graph), feeds)
    assert_close(expected, TorchProgram(graph, "cpu").run(feeds))


@pytest.mark.slow
def test_zoo_logits_are_spread_so_the_comparison_means_something():
    """Light models ship with every weight equal (every logit the same); the zoo redraws
    them, so the softmax neither saturates nor ties."""
    graph = with_logits(zoo.build("light_bvlc_alexnet"))
    out = run(graphsub.to_onnx(graph), random_feeds(graph_input_specs(graph), seed=5))
    assert 1.0 < float(np.std(out["logits0"])) < 4.0
    probs = next(v for k, v in out.items() if k != "logits0")
    assert 1e-4 < float(probs.max()) < 0.5 and len(np.unique(probs)) > 900


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


def test_an_operator_reading_an_expanded_view_is_timed():
    """Grouped-query attention's keys, expanded to every query head, are a view with stride 0
    (elements sharing memory): an operator reading them is timed on such a view, not refused
    (copying into memory laid out so raises in torch) and priced analytically."""
    b = GraphBuilder(0)
    k = b.input("k", (2, 1, 16, 8))
    q = b.input("q", (2, 4, 32, 8))
    wide = b.op("expand", k, shape=(2, 4, 16, 8))
    b.output(b.matmul(q, b.transpose(wide, perm=(0, 1, 3, 2))), "s")
    g = b.build()
    target = TorchCpuTarget(threads=1)
    mm = g.outputs[0].node
    layouts = target.input_layouts(g, mm)
    assert layouts is not None and 0 in layouts[1]
    from graphsub.cost import MeasuredCostModel

    model = MeasuredCostModel(target, cache=False)
    assert model.node_cost(g, mm) > 0 and not model.untimed


def test_weight_only_subgraphs_are_folded_once_into_buffers():
    b = GraphBuilder(0)
    x = b.input("x", (2, 4))
    w = b.transpose(b.he_weight((3, 4)), perm=(1, 0))  # weight-only: folded at build
    b.output(b.matmul(x, w), "y")
    prog = TorchProgram(b.build(), "cpu")
    assert "permute" not in prog.module.code
    assert [tuple(t.shape) for t in prog.module.buffers()] == [(4, 3)]


def test_opaque_nodes_run_through_onnxruntime_on_cpu_and_are_refused_elsewhere():
    graph = with_logits(zoo.build("light_bvlc_alexnet"))  # two LRN nodes, opaque to graphsub
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


def one_case_per_operator():
    """A small graph for every lowered operator (the hypothesis cases of tests/ops cover the
    CPU; these run where a GPU is)."""
    rng = np.random.default_rng(0)
    cases = []
    for op in sorted(set(lowered_ops()) - {"opaque"}):
        b = GraphBuilder(1)
        x4 = b.input("x", (2, 4, 6, 6))
        if op in ("conv2d",):
            y = b.conv2d(x4, b.he_weight((8, 2, 3, 3)), stride=2, padding=(0, 1, 1, 0),
                         activation="relu")
        elif op == "enlarge":
            y = b.conv2d(x4, b.enlarge(b.input("w", (4, 4, 1, 3)), kernel=(3, 3)))
        elif op in ("max_pool2d", "avg_pool2d"):
            y = b.op(op, x4, kernel=(3, 2), stride=(2, 1), padding=(1, 0, 0, 1))
        elif op == "matmul":
            y = b.matmul(b.transpose(x4, perm=(0, 1, 3, 2)), b.input("m", (2, 4, 6, 5)))
        elif op in ("add", "sub", "mul", "div", "pow"):
            y = b.op(op, b.op("sigmoid", x4), b.uniform_weight((6,), 0.5, 1.5))
        elif op == "smul":
            y = b.smul(x4, b.weight(np.array(0.5, np.float32)))
        elif op == "concat":
            y = b.concat(x4, b.input("c", (2, 3, 6, 6)), axis=1)
        elif op == "split":
            y = b.split(x4, axis=1, sizes=(1, 3))[1]
        elif op == "transpose":
            y = b.transpose(x4, perm=(3, 1, 2, 0))
        elif op in ("reshape", "flatten", "squeeze", "unsqueeze"):
            y = {"reshape": lambda: b.reshape(x4, shape=(8, 36)),
                 "flatten": lambda: b.flatten(x4, axis=2),
                 "squeeze": lambda: b.squeeze(b.reshape(x4, shape=(2, 1, 144)), axes=(1,)),
                 "unsqueeze": lambda: b.unsqueeze(x4, axes=(0,))}[op]()
        elif op == "slice":
            y = b.slice(x4, starts=(5, 0), ends=(-7, 6), axes=(2, 3), steps=(-2, 3))
        elif op == "pad":
            y = b.pad(x4, pads=(0, 1, 0, 2, 0, 0, 1, -1), mode="reflect")
        elif op in ("reduce_sum", "reduce_mean", "reduce_max"):
            y = b.op(op, x4, axes=(1, 3), keepdims=False)
        elif op in ("softmax",):
            y = b.softmax(x4, axis=1)
        elif op == "layer_norm":
            y = b.layer_norm(x4, b.uniform_weight((6,), 0.5, 1.5), b.uniform_weight((6,)), axis=-1)
        elif op == "attention":
            y = b.attention(x4, b.slice(x4, starts=(0,), ends=(2,), axes=(1,)),
                            b.slice(x4, starts=(2,), ends=(4,), axes=(1,)), causal=True)
        elif op == "fused":
            from tests.ops.test_ops_vs_ort import _softmax_times_body

            y = b.fused(x4, b.uniform_weight((6,), 0.5, 1.5), body=_softmax_times_body(4))[0]
        elif op == "rms_norm":
            y = b.rms_norm(x4, b.uniform_weight((6, 6), 0.5, 1.5), axis=-2)
        elif op == "batch_norm":
            y = b.batch_norm(x4, *(b.uniform_weight((4,), 0.5, 1.5) for _ in range(4)))
        elif op == "global_avg_pool":
            y = b.global_avg_pool(x4)
        elif op == "expand":  # a new leading axis and an axis of 1 widened
            y = b.expand(b.reduce_sum(x4, axes=(1,), keepdims=True),
                         shape=(3,) + b.type_of(x4).shape)
        elif op == "cast":
            y = b.cast(b.cast(x4, to="int32"), to="float32")
        elif op == "clip":
            y = b.clip(x4, min=-0.5, max=0.25)
        elif op == "rotary_embedding":  # 4 of 6 rotated in pairs, caches gathered by position
            caches = [b.uniform_weight((8, 2), -1.0, 1.0) for _ in range(2)]
            positions = b.weight(np.arange(12, dtype=np.int64).reshape(2, 6) % 8)
            y = b.rotary_embedding(x4, *caches, positions, interleaved=True,
                                   rotary_embedding_dim=4)
        elif op == "sizes":  # numbers here: a bound graph's sizes (symbolic in test_sizes)
            y = b.cast(b.sizes(x4, values=(2, 36), shape=(2,), sources=()), to="float32")
        elif op == "causal_mask":  # fixed sizes here (symbolic in tests/ops/test_causal_mask)
            y = b.attention(x4, x4, x4, b.causal_mask(shape=(1, 1, 6, 6), dtype="float32",
                                                      fill=-3.0e38))
        elif op in ("sqrt", "log", "reciprocal"):
            y = b.op(op, b.sigmoid(x4))
        elif op in QUANTIZED_CASES:
            y = QUANTIZED_CASES[op](b, x4, rng)
        else:
            y = b.op(op, x4)
        b.output(y, "y")
        g = b.build()
        feeds = {name: rng.standard_normal(t.shape).astype(np.float32)
                 for name, t in graph_input_specs(g)}
        cases.append(pytest.param(g, feeds, id=op))
    return cases


def _quantized(b, x4, rng):
    """x4 quantized at run time: (uint8 values, scale, zero point)."""
    return b.dynamic_quantize(x4)


def _int_weight(b, rng, shape, dtype="uint8"):
    low, high = (0, 256) if dtype == "uint8" else (-64, 64)
    return b.weight(rng.integers(low, high, shape).astype(dtype))


def _scalar(b, value, dtype="float32"):
    return b.weight(np.array(value, dtype))


def _qlinear_conv(b, x4, rng):
    q, s, z = _quantized(b, x4, rng)
    y = b.qlinear_conv(q, s, z, _int_weight(b, rng, (3, 4, 3, 3), "int8"),
                       b.uniform_weight((3,), 0.01, 0.05), b.weight(np.zeros(3, np.int8)),
                       _scalar(b, 0.2), _scalar(b, 100, "uint8"),
                       b.weight(rng.integers(-99, 99, 3).astype(np.int32)), padding=(1, 0, 1, 1))
    return b.dequantize(y, _scalar(b, 0.2), _scalar(b, 100, "uint8"))


def _qlinear_matmul(b, x4, rng):
    q, s, z = _quantized(b, x4, rng)
    y = b.qlinear_matmul(q, s, z, _int_weight(b, rng, (6, 5)), b.uniform_weight((5,), 0.01, 0.05),
                         b.weight(np.full(5, 128, np.uint8)), _scalar(b, 0.3),
                         _scalar(b, 128, "uint8"))
    return b.dequantize(y, _scalar(b, 0.3), _scalar(b, 128, "uint8"))


def _matmul_integer(b, quantized, rng):
    q, _, z = quantized
    y = b.matmul_integer(q, _int_weight(b, rng, (6, 5)), z, _int_weight(b, rng, (5,)),
                         slots=(0, 1, 2, 3))
    return b.cast(y, to="float32")


#: How each quantization operator is run: float in, float out.
QUANTIZED_CASES = {
    "quantize": lambda b, x4, rng: b.dequantize(
        b.quantize(x4, _scalar(b, 0.05), _scalar(b, 5, "int8"), dtype="int8"),
        _scalar(b, 0.05), _scalar(b, 5, "int8")),
    "dequantize": lambda b, x4, rng: b.dequantize(
        _int_weight(b, rng, (4, 6)), b.uniform_weight((4,), 0.01, 0.1),
        _int_weight(b, rng, (4,)), axis=0),
    "dynamic_quantize": lambda b, x4, rng: b.dequantize(*_quantized(b, x4, rng)),
    "matmul_integer": lambda b, x4, rng: _matmul_integer(b, _quantized(b, x4, rng), rng),
    "conv_integer": lambda b, x4, rng: b.cast(b.conv_integer(
        _quantized(b, x4, rng)[0], _int_weight(b, rng, (3, 4, 3, 3), "int8"), stride=(2, 1),
        padding=(1, 1, 0, 1)), to="float32"),
    "qlinear_conv": _qlinear_conv,
    "qlinear_matmul": _qlinear_matmul,
    "matmul_nbits": lambda b, x4, rng: b.matmul_nbits(
        x4, _int_weight(b, rng, (5, 1, 8)), b.uniform_weight((5,), 0.01, 0.1),
        _int_weight(b, rng, (5,)), K=6, N=5, bits=4, block_size=16, slots=(0, 1, 2, 3)),
}


@needs_cuda
@pytest.mark.parametrize("graph, feeds", one_case_per_operator())
def test_operators_on_cuda_match_the_reference(graph, feeds):
    assert_close(graphsub.runtime.evaluate(graph, feeds), TorchProgram(graph, "cuda").run(feeds),
                 rtol=1e-4, atol_scale=1e-5)


@pytest.mark.parametrize("graph, feeds", one_case_per_operator())
def test_operators_on_cpu_match_the_reference(graph, feeds):
    assert_close(graphsub.runtime.evaluate(graph, feeds), TorchProgram(graph, "cpu").run(feeds),
                 rtol=1e-4, atol_scale=1e-5)


# ---- sizes over symbols ------------------------------------------------------------------

def _symbolic_graph():
    """x: seq x 8 through a product with a weight, a relu, a reshape whose target is a size
    expression (2*seq x 4) and a transpose."""
    from graphsub.tensors.symbolic import size_symbol

    seq = size_symbol("seq")
    rng = np.random.default_rng(0)
    b = GraphBuilder()
    y = b.op("matmul", b.input("x", (seq, 8)), b.weight(rng.standard_normal((8, 8))
                                                         .astype(np.float32)))
    r = b.op("reshape", b.op("relu", y), shape=(2 * seq, 4))
    b.output(b.op("transpose", r, perm=(1, 0)), "out")
    return b.build()


@pytest.mark.parametrize("kind", ["one program", "per size"])
def test_a_program_over_size_symbols_runs_every_size(kind):
    from graphsub.targets.torch import SizedTorchProgram
    from graphsub.ir.binding import bind_graph
    from graphsub.runtime.reference import evaluate

    graph = _symbolic_graph()
    program = TorchCpuTarget().program(graph) if kind == "one program" \
        else SizedTorchProgram(graph)
    assert isinstance(program, TorchProgram if kind == "one program" else SizedTorchProgram)
    rng = np.random.default_rng(1)
    for seq in (3, 8, 13):
        feeds = {"x": rng.standard_normal((seq, 8)).astype(np.float32)}
        want = evaluate(bind_graph(graph, {"seq": seq}), feeds)["out"]
        np.testing.assert_allclose(program.run(feeds)["out"], want, rtol=1e-5, atol=1e-5)
        with torch.inference_mode():
            got = program.module(torch.from_numpy(feeds["x"]))[0]
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)
    if kind == "per size":  # one copy of the weight for every size
        buffers = [{t.data_ptr() for t in program.at({"seq": s}).module.buffers()}
                   for s in (3, 8)]
        assert buffers[0] and buffers[0] == buffers[1]


def test_one_program_over_size_symbols_compiles_once_with_dynamic_shapes():
    # The program reads its sizes from its inputs, so torch.compile captures it once with
    # symbolic sizes (SymInt), and that one graph runs at every size.
    program = TorchCpuTarget().program(_symbolic_graph())
    assert "sym_size" in program.module.code
    captured = []

    def backend(gm, example_inputs):
        captured.append([type(x).__name__ for x in example_inputs])
        return gm.forward

    compiled = torch.compile(program.module, backend=backend, dynamic=True)
    with torch.inference_mode():
        for seq in (3, 9, 20):
            x = torch.randn(seq, 8)
            torch.testing.assert_close(compiled(x)[0], program.module(x)[0])
    assert len(captured) == 1 and "SymInt" in captured[0]


def test_a_program_cannot_be_built_where_a_symbol_is_no_input_dimension():
    from graphsub.errors import GraphsubError
    from graphsub.tensors.symbolic import size_symbol

    seq = size_symbol("seq")
    b = GraphBuilder()
    b.output(b.op("reshape", b.input("x", (2 * seq, 4)), shape=(seq, 8)), "out")
    with pytest.raises(GraphsubError, match="seq"):
        TorchCpuTarget().program(b.build())


def test_view_strides_over_symbols_are_size_expressions():
    from graphsub.ir.graph import Value
    from graphsub.tensors.symbolic import bind_all, size_symbol

    target = TorchCpuTarget()
    seq = size_symbol("seq")
    # a stride that is a size, through a view of a view: a slice of a transposed 8 x seq
    b = GraphBuilder()
    x = b.op("transpose", b.input("x", (8, seq)), perm=(1, 0))
    s = b.op("slice", x, starts=(0,), ends=(seq - 1,), axes=(0,), steps=(1,))
    b.output(b.op("relu", s), "out")
    g = b.build()
    view = next(n for n in g.topo_order() if g[n].op == "slice")
    relu = next(n for n in g.topo_order() if g[n].op == "relu")
    got = target.strides_of(g, Value(view, 0))
    assert got == (1, seq)
    assert target.input_layouts(g, relu) == ((1, seq),)
    assert bind_all(got, {"seq": 11}) == (1, 11)


def test_one_program_over_size_symbols_runs_opaque_nodes_through_onnxruntime():
    # An operator graphsub does not model (Max of two tensors here) runs through onnxruntime
    # in a one-node model whose types carry the size symbols (found by the fuzzer).
    import onnx
    from onnx import TensorProto, helper

    from graphsub.ir.binding import bind_graph
    from graphsub.onnx_io import load
    from graphsub.runtime.reference import evaluate

    nodes = [helper.make_node("Max", ["x", "y"], ["m"]), helper.make_node("Relu", ["m"], ["out"])]
    model = helper.make_model(helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["s", 5]),
                     helper.make_tensor_value_info("y", TensorProto.FLOAT, [5])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["s", 5])]),
        opset_imports=[helper.make_opsetid("", 17)])
    graph = load(model.SerializeToString())
    assert any(graph[n].op == "opaque" for n in graph.topo_order())
    program = TorchCpuTarget().program(graph)
    assert isinstance(program, TorchProgram)
    rng = np.random.default_rng(2)
    for s in (2, 7):
        feeds = {"x": rng.standard_normal((s, 5)).astype(np.float32),
                 "y": rng.standard_normal(5).astype(np.float32)}
        want = evaluate(bind_graph(graph, {"s": s}), feeds)["out"]
        np.testing.assert_allclose(program.run(feeds)["out"], want, rtol=1e-6)
    onnx.checker.check_model(model)
