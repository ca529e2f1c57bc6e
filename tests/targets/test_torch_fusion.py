"""The torch program's kernels for groups of nodes (targets/torch/fusion.py: linear layers on
oneDNN, attention as SDPA) and the ONNX ops it runs in torch instead of onnxruntime
(ops/opaque.py): each computes what the nodes compute, and the program neither fuses what
it must not nor leaves a value another node reads uncomputed."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphsub.ir.builder import GraphBuilder
from graphsub.onnx_io import load
from graphsub.runtime import evaluate, graph_input_specs, random_feeds, run

torch = pytest.importorskip("torch", reason="torch is an optional extra (pip install graphsub[torch])")

from graphsub.targets.torch import TorchProgram  # noqa: E402
from graphsub.targets.torch.fusion import linear_available  # noqa: E402

needs_onednn = pytest.mark.skipif(not linear_available(torch.device("cpu")),
                                  reason="this torch build has no oneDNN linear kernel")


def close(expected: dict, got: dict, rtol: float = 1e-4) -> None:
    for name, want in expected.items():
        assert got[name].shape == want.shape and got[name].dtype == want.dtype, name
        scale = max(float(np.abs(want).max()), 1e-6) if want.size else 1.0
        np.testing.assert_allclose(got[name], want, rtol=rtol, atol=rtol * scale, err_msg=name)


def both(graph, feeds):
    fused, plain = TorchProgram(graph, "cpu"), TorchProgram(graph, "cpu", fuse=False)
    return fused, fused.run(feeds), plain.run(feeds)


# ---- linear layers ---------------------------------------------------------------------------

def mlp(residual_is_output: bool = False, activation: str = "gelu"):
    b = GraphBuilder(3)
    x = b.input("x", (1, 64, 128))
    h = b.add(b.matmul(x, b.he_weight((128, 256))), b.uniform_weight((256,), -0.5, 0.5))
    h = b.gelu(h) if activation == "gelu" else b.op(activation, h)
    y = b.add(b.matmul(h, b.he_weight((256, 128))), b.uniform_weight((1, 1, 128), -0.5, 0.5))
    out = b.add(y, x)
    b.output(out, "y")
    if residual_is_output:
        b.output(y, "before_residual")
    return b.build()


@needs_onednn
@pytest.mark.parametrize("activation", ["gelu", "relu", "tanh", "sigmoid"])
def test_linear_layers_fuse_bias_activation_and_residual(activation):
    graph = mlp(activation=activation)
    feeds = random_feeds(graph_input_specs(graph), seed=1)
    program, fused, plain = both(graph, feeds)
    assert program.fusions == ["linear", "linear"]
    code = program.module.code
    assert code.count("fusion__linear(") == 2 and "torch." not in code  # nothing else runs
    close(evaluate(graph, feeds), fused)
    close(plain, fused)


@needs_onednn
def test_a_value_read_elsewhere_is_not_absorbed():
    """The second layer's sum before the residual is a graph output: the bias is fused, the
    residual sum stays a node of its own."""
    graph = mlp(residual_is_output=True)
    feeds = random_feeds(graph_input_specs(graph), seed=2)
    program, fused, plain = both(graph, feeds)
    close(plain, fused)
    assert program.fusions == ["linear", "linear"]
    assert program.module.code.count("torch.add(") == 1
    close(evaluate(graph, feeds), fused)


def test_small_products_and_products_of_activations_stay_matmuls():
    b = GraphBuilder(0)
    x = b.input("x", (4, 16))
    y = b.add(b.matmul(x, b.he_weight((16, 8))), b.uniform_weight((8,)))  # 512 flops: small
    z = b.matmul(b.transpose(y, perm=(1, 0)), y)
    b.output(z, "z")
    graph = b.build()
    program = TorchProgram(graph, "cpu")
    assert program.fusions == [] and program.module.code.count("torch.matmul") == 2


@needs_onednn
def test_fused_activation_attribute_of_matmul():
    b = GraphBuilder(1)
    x = b.input("x", (128, 128))
    b.output(b.matmul(x, b.he_weight((128, 256)), activation="relu"), "y")
    graph = b.build()
    feeds = random_feeds(graph_input_specs(graph))
    program, fused, _ = both(graph, feeds)
    assert program.fusions == ["linear"]
    close(evaluate(graph, feeds), fused)


# ---- attention -----------------------------------------------------------------------------

def attention_model(guard: bool, mask: str, scale_scores: bool = False) -> bytes:
    """softmax(q*s k^T*s + mask) v as torch.onnx(dynamo) exports scaled_dot_product_attention:
    a scalar on q and on k^T (or one on the scores), an additive mask (an input, a constant
    or none), the softmax, the NaN guard Where(IsNaN(p), 0, p)."""
    h, n, e = 4, 16, 8
    nodes, inits = [], [numpy_helper.from_array(np.array(e ** -0.25, np.float32), "s"),
                        numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
                        numpy_helper.from_array(np.array([0, 1, 3, 2], np.int64), "perm")]
    inputs = [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, h, n, e])
              for x in ("q", "k", "v")]
    nodes.append(helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]))
    if scale_scores:
        nodes += [helper.make_node("MatMul", ["q", "kt"], ["raw"]),
                  helper.make_node("Mul", ["raw", "s"], ["half"]),
                  helper.make_node("Mul", ["half", "s"], ["scores"])]
    else:
        nodes += [helper.make_node("Mul", ["q", "s"], ["qs"]),
                  helper.make_node("Mul", ["kt", "s"], ["ks"]),
                  helper.make_node("MatMul", ["qs", "ks"], ["scores"])]
    logits = "scores"
    if mask == "input":
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.FLOAT, [1, 1, n, n]))
    elif mask == "constant":
        inits.append(numpy_helper.from_array(
            np.random.default_rng(0).uniform(-2, 0, (h, n, n)).astype(np.float32), "mask"))
    if mask != "none":
        nodes.append(helper.make_node("Add", ["scores", "mask"], ["masked"]))
        logits = "masked"
    nodes.append(helper.make_node("Softmax", [logits], ["p"], axis=-1))
    probs = "p"
    if guard:
        nodes += [helper.make_node("IsNaN", ["p"], ["nan"]),
                  helper.make_node("Where", ["nan", "zero", "p"], ["pg"])]
        probs = "pg"
    nodes.append(helper.make_node("MatMul", [probs, "v"], ["y"]))
    graph = helper.make_graph(nodes, "attention", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return model.SerializeToString()


def attention_feeds(mask_row_hidden: bool = False) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(4)
    feeds = {x: rng.standard_normal((1, 4, 16, 8)).astype(np.float32) for x in "qkv"}
    mask = np.where(rng.random((1, 1, 16, 16)) < 0.3, -np.inf, 0).astype(np.float32)
    mask[..., 0] = 0
    if mask_row_hidden:
        mask[..., 5, :] = -np.inf  # query 5 sees no key: NaN, which the guard makes zeros
    feeds["mask"] = mask
    return feeds


@pytest.mark.parametrize("guard,mask,scale_scores", [
    (True, "input", False), (True, "none", False), (False, "constant", False),
    (False, "none", True), (True, "constant", True)])
def test_attention_runs_as_one_sdpa_call(guard, mask, scale_scores):
    data = attention_model(guard, mask, scale_scores)
    graph = load(data)
    feeds = {k: v for k, v in attention_feeds(mask_row_hidden=guard).items()
             if k in graph.input_names}
    program, fused, plain = both(graph, feeds)
    assert program.fusions == ["attention"]
    code = program.module.code
    assert "_sdpa" in code and "softmax" not in code and "run_in_onnxruntime" not in code
    expected = run(data, feeds)
    close(expected, fused)
    close(plain, fused)
    if guard and mask == "input":
        assert np.all(fused["y"][0, :, 5] == 0) and np.all(expected["y"][0, :, 5] == 0)


def test_attention_without_the_guard_and_a_mask_given_at_run_time_is_not_fused():
    """A query whose keys are all masked gives NaN through the softmax, zeros through SDPA:
    without the guard, only a constant mask known to be finite may fuse."""
    data = attention_model(guard=False, mask="input")
    graph = load(data)
    feeds = attention_feeds(mask_row_hidden=True)
    program = TorchProgram(graph, "cpu")
    assert program.fusions == []
    got, expected = program.run(feeds), run(data, feeds)
    assert np.isnan(got["y"][0, :, 5]).all() and np.isnan(expected["y"][0, :, 5]).all()


def test_attention_whose_probabilities_are_read_elsewhere_is_not_fused():
    b = GraphBuilder(0)
    q, k, v = (b.input(x, (2, 8, 4)) for x in "qkv")
    p = b.softmax(b.matmul(q, b.transpose(k, perm=(0, 2, 1))), axis=-1)
    b.output(b.matmul(p, v), "y")
    b.output(p, "p")
    graph = b.build()
    assert TorchProgram(graph, "cpu").fusions == []
    b2 = GraphBuilder(0)
    q, k, v = (b2.input(x, (2, 8, 4)) for x in "qkv")
    p = b2.softmax(b2.matmul(q, b2.transpose(k, perm=(0, 2, 1))), axis=-1)
    b2.output(b2.matmul(p, v), "y")
    graph = b2.build()
    feeds = random_feeds(graph_input_specs(graph))
    program, fused, _ = both(graph, feeds)
    assert program.fusions == ["attention"]
    close(evaluate(graph, feeds), fused)


# ---- ONNX ops run in torch -----------------------------------------------------------------

def mask_ops_model() -> bytes:
    """The ops exported transformers leave opaque: embedding and pooler Gathers (negative
    indices, a scalar index), GatherND, boolean mask arithmetic, Where, IsNaN; and Expand,
    which is graphsub's expand."""
    f, i64, b = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
    inputs = [helper.make_tensor_value_info("ids", i64, [1, 6]),
              helper.make_tensor_value_info("keep", b, [1, 6]),
              helper.make_tensor_value_info("x", f, [1, 6, 5]),
              helper.make_tensor_value_info("idx", i64, [1, 6, 2])]
    table = np.random.default_rng(0).standard_normal((10, 5)).astype(np.float32)
    inits = [numpy_helper.from_array(table, "table"),
             numpy_helper.from_array(np.array(-1, np.int64), "last"),
             numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
             numpy_helper.from_array(np.array(-1e9, np.float32), "low"),
             numpy_helper.from_array(np.array([2, 1, 6, 5], np.int64), "shape")]
    nodes = [helper.make_node("Gather", ["table", "ids"], ["emb"], axis=0),
             helper.make_node("Gather", ["x", "last"], ["pooled"], axis=1),
             helper.make_node("GatherND", ["keep", "idx"], ["picked"]),
             helper.make_node("Not", ["picked"], ["hidden"]),
             helper.make_node("And", ["keep", "hidden"], ["both"]),
             helper.make_node("Less", ["emb", "x"], ["less"]),
             helper.make_node("Equal", ["ids", "ids"], ["same"]),
             helper.make_node("GreaterOrEqual", ["x", "emb"], ["more"]),
             helper.make_node("Or", ["less", "more"], ["either"]),
             helper.make_node("Where", ["both", "zero", "low"], ["additive"]),
             helper.make_node("IsNaN", ["x"], ["nan"]),
             helper.make_node("Where", ["nan", "zero", "x"], ["guarded"]),
             helper.make_node("Expand", ["guarded", "shape"], ["wide"])]
    outs = [helper.make_tensor_value_info(n, t, None) for n, t in
            [("emb", f), ("pooled", f), ("additive", f), ("either", b), ("same", b),
             ("wide", f)]]
    graph = helper.make_graph(nodes, "masks", inputs, outs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return model.SerializeToString()


def test_onnx_ops_transformers_leave_opaque_run_in_torch():
    data = mask_ops_model()
    graph = load(data)
    ops = Counter(graph[n].attrs["op_type"] for n in graph.topo_order()
                  if graph[n].op == "opaque")
    assert {"Gather", "GatherND", "Not", "And", "Where", "IsNaN"} <= set(ops)
    assert "Expand" not in ops and graph.nodes_by_op("expand")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 6, 5)).astype(np.float32)
    x[0, 2, 3] = np.nan
    feeds = {"ids": np.array([[0, 3, -1, 9, -10, 4]], np.int64),
             "keep": np.array([[1, 0, 1, 1, 0, 1]], bool), "x": x,
             "idx": np.stack([np.zeros(6, np.int64), np.array([5, 4, 3, -1, 1, 0])], -1)[None]}
    program = TorchProgram(graph, "cpu")
    assert "run_in_onnxruntime" not in program.module.code
    expected = run(data, feeds)
    got = program.run(feeds)
    for name, want in expected.items():
        assert got[name].dtype == want.dtype and got[name].shape == want.shape, name
        np.testing.assert_array_equal(got[name], want, err_msg=name)
    if torch.cuda.is_available():
        cuda = TorchProgram(graph, "cuda").run(feeds)
        for name, want in expected.items():
            np.testing.assert_array_equal(cuda[name], want, err_msg=name)


def test_zero_pads_are_not_copies():
    b = GraphBuilder(0)
    x = b.input("x", (1, 4, 4, 3))
    b.output(b.relu(b.pad(x, pads=(0,) * 8)), "y")
    graph = b.build()
    program = TorchProgram(graph, "cpu")
    assert "pad" not in program.module.code
    feeds = random_feeds(graph_input_specs(graph))
    close(evaluate(graph, feeds), program.run(feeds))


@needs_onednn
@pytest.mark.slow
def test_the_fused_program_compiles_with_inductor():
    """Handed to inductor (torch.compile's `inductor` option), the linear layers are plain
    aten ops inductor lowers itself: its lowering of oneDNN's call wants packed weights."""
    graph = mlp()
    program = TorchProgram(graph, "cpu")
    x = torch.randn(1, 64, 128)
    with torch.no_grad():
        want = program.module(x)
        got = torch.compile(program.module)(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@needs_onednn
def test_inside_a_compile_the_program_still_runs_onednn_on_real_tensors(monkeypatch):
    """A torch.compile backend runs on real tensors while `torch.compiler.is_compiling()` is
    true (graphsub's backend races its module there): the linear layers must still be the
    oneDNN calls, or the race times plain ops and misjudges graphsub's program."""
    from torch.profiler import profile

    program = TorchProgram(mlp(), "cpu")
    monkeypatch.setattr(torch.compiler, "_is_compiling_flag", True)
    assert torch.compiler.is_compiling()
    with torch.no_grad(), profile() as prof:
        program.module(torch.randn(1, 64, 128))
    assert any("_linear_pointwise" in e.key for e in prof.key_averages())
