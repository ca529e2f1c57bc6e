"""A third, independent reference: graphsub's numpy semantics against torch's for the
operators with the most arithmetic in them (convolutions, pooling, norms, attention parts)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from graphsub.ops import get_op

torch = pytest.importorskip("torch", reason="torch is an optional extra (pip install graphsub[torch])")
F = torch.nn.functional

seeds = st.integers(0, 2 ** 31 - 1)


def ours(op: str, inputs, **attrs):
    from graphsub.tensors.types import TensorType

    opdef = get_op(op)
    types = tuple(TensorType(a.shape, str(a.dtype)) for a in inputs)
    return opdef.evaluate(opdef.make_attrs(attrs, types), inputs)[0]


def t(a):
    return torch.from_numpy(np.ascontiguousarray(a))


@given(seed=seeds, groups=st.integers(1, 3), stride=st.integers(1, 3), dilation=st.integers(1, 2),
       pad=st.integers(0, 2), k=st.integers(1, 3))
def test_conv2d_matches_torch(seed, groups, stride, dilation, pad, k):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 2 * groups, 9, 8)).astype(np.float32)
    w = rng.standard_normal((3 * groups, 2, k, k)).astype(np.float32)
    bias = rng.standard_normal(3 * groups).astype(np.float32)
    got = ours("conv2d", [x, w, bias], stride=stride, dilation=dilation, padding=(pad,) * 4)
    want = F.conv2d(t(x), t(w), t(bias), stride=stride, padding=pad, dilation=dilation,
                    groups=groups).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@given(seed=seeds, k=st.integers(1, 3), stride=st.integers(1, 3), data=st.data())
def test_pooling_matches_torch(seed, k, stride, data):
    pad = data.draw(st.integers(0, k // 2))
    x = np.random.default_rng(seed).standard_normal((1, 3, 9, 7)).astype(np.float32)
    np.testing.assert_allclose(
        ours("max_pool2d", [x], kernel=k, stride=stride, padding=(pad,) * 4),
        F.max_pool2d(t(x), k, stride, pad).numpy(), rtol=1e-6)
    for include in (True, False):
        np.testing.assert_allclose(
            ours("avg_pool2d", [x], kernel=k, stride=stride, padding=(pad,) * 4,
                 count_include_pad=include),
            F.avg_pool2d(t(x), k, stride, pad, count_include_pad=include).numpy(),
            rtol=1e-5, atol=1e-6)


@given(seed=seeds)
def test_norms_softmax_and_gelu_match_torch(seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 5, 6)).astype(np.float32)
    g, b = rng.standard_normal(6).astype(np.float32), rng.standard_normal(6).astype(np.float32)
    np.testing.assert_allclose(ours("layer_norm", [x, g, b], axis=-1),
                               F.layer_norm(t(x), (6,), t(g), t(b)).numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ours("softmax", [x], axis=1), F.softmax(t(x), dim=1).numpy(),
                               rtol=1e-5, atol=1e-7)
    for approx in ("none", "tanh"):
        np.testing.assert_allclose(ours("gelu", [x], approximate=approx),
                                   F.gelu(t(x), approximate=approx).numpy(), rtol=1e-5, atol=1e-6)
    c = 5
    stats = [rng.standard_normal(c).astype(np.float32) for _ in range(3)]
    var = rng.uniform(0.5, 2, c).astype(np.float32)
    xb = rng.standard_normal((2, c, 3, 3)).astype(np.float32)
    np.testing.assert_allclose(
        ours("batch_norm", [xb, stats[0], stats[1], stats[2], var], epsilon=1e-5),
        F.batch_norm(t(xb), t(stats[2]), t(var), t(stats[0]), t(stats[1]), False, 0.0, 1e-5).numpy(),
        rtol=1e-4, atol=1e-5)


def test_matmul_broadcasting_matches_torch():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 1, 4, 5)).astype(np.float32)
    b = rng.standard_normal((2, 5, 6)).astype(np.float32)
    np.testing.assert_allclose(ours("matmul", [a, b]), torch.matmul(t(a), t(b)).numpy(),
                               rtol=1e-5, atol=1e-5)
