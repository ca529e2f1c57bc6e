"""torch's fused attention kernels as the torch.compile frontend reads them (issue 50): under
torch.compile, transformers' default (SDPA) attention traces to the kernel the dispatcher
chose for the example's device: the CPU's flash kernel, or on CUDA the flash kernel (no
mask), the memory-efficient kernel or cuDNN's (a mask as an additive bias), or the reference
path (products and `_safe_softmax`). Each becomes graphsub's attention operator.

The CUDA kernels cannot run here, so their graphs are built by hand, typed by the kernels'
meta implementations, and the attention graphsub reads is computed by its numpy reference
against torch's scaled_dot_product_attention on the CPU."""

from __future__ import annotations

import operator

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is an optional extra (pip install graphsub[torch])")
fx = torch.fx
F = torch.nn.functional

from graphsub.frontends.fx_import import convert_graph, unsupported_reason  # noqa: E402
from graphsub.runtime import evaluate  # noqa: E402

aten = torch.ops.aten


def typed_on_meta(gm, inputs):
    """Each node's tensor metadata from running the graph on meta tensors (what the CUDA
    kernels' meta implementations say they return)."""
    from torch.fx.node import map_aggregate
    from torch.fx.passes.shape_prop import _extract_tensor_metadata

    class Recorder(fx.Interpreter):
        def run_node(self, n):
            result = super().run_node(n)
            n.meta["tensor_meta"] = map_aggregate(
                result, lambda r: _extract_tensor_metadata(r) if isinstance(r, torch.Tensor)
                else None)
            return result

    Recorder(gm).run(*[x.to("meta") for x in inputs])


def kernel_graph(kernel, inputs, *args, **kwargs):
    graph = fx.Graph()
    names = ["q", "k", "v", "bias"][:len(inputs)]
    holders = [graph.placeholder(n) for n in names]
    call = graph.call_function(kernel, (*holders[:3], *holders[3:], *args), kwargs)
    graph.output((graph.call_function(operator.getitem, (call, 0)),))
    gm = fx.GraphModule(torch.nn.Module(), graph)
    typed_on_meta(gm, inputs)
    return gm


def read_by_graphsub(gm, inputs):
    """The graph graphsub reads, its one operator, computed by the numpy reference."""
    graph, order, _ = convert_graph(gm.graph, {})
    by_name = {n.name: x for n, x in zip(gm.graph.find_nodes(op="placeholder"), inputs)}
    feeds = {name: by_name[node.name].numpy() for name, node in zip(graph.input_names, order)}
    assert [n.op for n in graph.nodes.values() if n.op not in ("input", "output")] == \
        ["attention"]
    (out,) = evaluate(graph, feeds).values()
    return out


def qkv():
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(2, 8, 16, 32, generator=gen) for _ in range(3)]


def padding_bias():
    bias = torch.zeros(2, 1, 16, 16)
    bias[1, :, :, :5] = float("-inf")  # the second row left-padded by five keys
    return bias


@pytest.mark.parametrize("causal", [False, True])
def test_the_memory_efficient_and_cudnn_kernels_are_attention_with_their_bias(causal):
    q, k, v = qkv()
    bias = padding_bias()
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, is_causal=False, scale=0.3)
    if causal:
        want = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3)
    for kernel, args in ((aten._scaled_dot_product_efficient_attention.default, (False,)),
                         (aten._scaled_dot_product_cudnn_attention.default, (False,))):
        inputs = [q, k, v] + ([] if causal else [bias])
        if causal:  # no bias: the kernel's argument is None
            gm = kernel_graph(kernel, inputs, None, *args, 0.0, True, scale=0.3)
        else:
            gm = kernel_graph(kernel, inputs, *args, 0.0, False, scale=0.3)
        call = next(n for n in gm.graph.nodes if n.target is kernel)
        assert unsupported_reason(call) is None, kernel
        np.testing.assert_allclose(read_by_graphsub(gm, inputs), want.numpy(), rtol=1e-4,
                                   atol=1e-5, err_msg=str(kernel))


def test_the_cuda_flash_kernel_is_attention_with_its_causal_flag():
    q, k, v = qkv()
    gm = kernel_graph(aten._scaled_dot_product_flash_attention.default, [q, k, v], 0.0, True,
                      scale=0.25)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.25)
    np.testing.assert_allclose(read_by_graphsub(gm, [q, k, v]), want.numpy(), rtol=1e-4,
                               atol=1e-5)


def test_a_kernel_with_dropout_stays_in_torch():
    q, k, v = qkv()
    gm = kernel_graph(aten._scaled_dot_product_flash_attention.default, [q, k, v], 0.1, False)
    call = next(n for n in gm.graph.nodes if n.op == "call_function"
                and n.target is aten._scaled_dot_product_flash_attention.default)
    assert unsupported_reason(call) == "attention with dropout"


def test_the_reference_paths_safe_softmax_gives_zeros_on_a_fully_masked_row():
    """scaled_dot_product_attention's reference path (`_safe_softmax`): a row of -inf alone
    gives zeros, as graphsub's guarded softmax does."""
    from torch.fx.experimental.proxy_tensor import make_fx

    x = torch.randn(2, 4, 6)
    x[1, 2] = float("-inf")
    gm = make_fx(lambda t: aten._safe_softmax.default(t, -1))(x)
    from graphsub.frontends.torch_compile import propagate_shapes

    propagate_shapes(gm, [x])
    graph = convert_graph(gm.graph, {}).graph
    assert [n.op for n in graph.nodes.values() if n.op not in ("input", "output")] == \
        ["guarded_softmax"]
    (out,) = evaluate(graph, {graph.input_names[0]: x.numpy()}).values()
    want = aten._safe_softmax.default(x, -1)
    assert not np.isnan(out).any() and np.all(out[1, 2] == 0)
    np.testing.assert_allclose(out, want.numpy(), rtol=1e-5, atol=1e-6)
