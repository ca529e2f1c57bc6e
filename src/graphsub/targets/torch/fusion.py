"""Fusions the torch program makes across graphsub nodes: where several operators of a graph
are one call of a library kernel, the program calls the kernel once instead of running the
operators one by one. The graph is unchanged (the search and the exported model never see
this); each fusion computes what its operators compute, up to the rounding of the kernel.

- **Linear layers** on the CPU: a product with a constant matrix, with the bias added, a
  following activation (an operator with a `post_op`: GELU, ReLU, tanh, sigmoid) or a
  residual sum, becomes one oneDNN call (`mkldnn::_linear_pointwise`, what inductor's CPU
  freezing calls), with the matrix stored transposed once. Traced by torch.compile the call
  is plain aten ops again, for inductor to lower its own way (see `_linear`). On AMD
  processors MKL's sgemm, which `torch.matmul` and eager `nn.Linear` call, runs at half
  oneDNN's speed; and each operator left out is a pass over the output and a parallel region
  less.
- **Attention**: softmax(q k^T * s [+ mask]) v, as exporters decompose
  `scaled_dot_product_attention` (a scalar on q and on k^T, the scores, an additive mask, the
  softmax with the NaN guard `Where(IsNaN(p), 0, p)`, imported as guarded_softmax, the
  product with v), becomes one call of torch's `scaled_dot_product_attention` (a flash kernel
  on the CPU), as eager PyTorch runs it. A softmax over keys that are all masked out gives
  NaN and SDPA gives zeros; the guard turns the NaN into zeros too, so without the guard
  only a constant mask with finite values (or none) fuses. On the CPU only (SDPA's other
  kernels are not checked here).

`plan(graph, weights, device)` finds the fusions; `TorchProgram` calls each at its root node
and skips the nodes it absorbed. A node is absorbed only if everything that reads it is in
the same fusion, so no value the rest of the program reads goes missing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import is_fake

from graphsub.ir.graph import Graph, Value
from graphsub.tensors.types import EMPTY_ATTRS, Attrs
from graphsub.ops import get_op

#: Products smaller than this (m * k * n) stay torch.matmul: oneDNN's call costs ~15 us more.
LINEAR_MIN_WORK = 1 << 21


@dataclass(frozen=True)
class Fusion:
    """One kernel call standing for the nodes `absorbed` and `root` (whose first output it
    computes). `inputs` are graph values or constant arrays; `build(ctx, *proxies)` adds the
    call to the program."""

    kind: str
    root: int
    absorbed: frozenset[int]
    inputs: tuple[Value | np.ndarray, ...]
    build: Callable[..., Any]


def linear_available(device: torch.device) -> bool:
    return (device.type == "cpu"
            # (unannotated; with torch absent, Any: the ignore is unused there)
            and torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call, unused-ignore]
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


def plan(graph: Graph, weights: Mapping[Value, np.ndarray],
         device: torch.device) -> dict[int, Fusion]:
    """The fusions of a graph, by root node id. `weights` are the constant values the
    program holds (`runtime.reference.materialized_weights`)."""
    finder = _Finder(graph, weights, device)
    fusions: dict[int, Fusion] = {}
    taken: set[int] = set()
    # Attention first, so that its products do not become linear layers. Only on the CPU,
    # where SDPA's zeros for a query that sees no key are checked (tests/targets).
    searches = ([finder.attention] if device.type == "cpu" else []) + (
        [finder.linear] if linear_available(device) else [])
    for search in searches:
        for nid in graph.topo_order():
            f = search(nid) if nid not in taken else None
            if f is not None and not (f.absorbed | {f.root}) & taken:
                fusions[f.root] = f
                taken |= f.absorbed | {f.root}
    return fusions


class _Finder:
    def __init__(self, graph: Graph, weights: Mapping[Value, np.ndarray],
                 device: torch.device) -> None:
        self.g = graph
        self.weights = weights
        self.device = device
        self.users = graph.users()
        self.outputs = {v.node for v in graph.outputs}
        self.weight_only = graph.weight_only()

    # ---- helpers -------------------------------------------------------------------------
    def const(self, v: Value) -> np.ndarray | None:
        return self.weights.get(v) if v.node in self.weight_only else None

    def only_user(self, nid: int) -> tuple[int, int] | None:
        """The one (node, position) reading node `nid`, None if there are more, none, or its
        value is a graph output."""
        users = self.users.get(nid, [])
        if len(users) != 1 or nid in self.outputs or len(self.g[nid].outputs) != 1:
            return None
        return users[0]

    def computed(self, v: Value) -> bool:
        return v.node not in self.weight_only

    def scalar(self, v: Value) -> float | None:
        c = self.const(v)
        if c is None or c.size != 1 or not np.isfinite(c).all():
            return None
        return float(c.reshape(()))

    def scaled(self, v: Value) -> tuple[Value, float, set[int]]:
        """(x, s, nodes) with v = x * s for a scalar constant s: what smul/mul/div by a
        scalar hide (the nodes), walked through only where nothing else reads them."""
        s = 1.0
        nodes: set[int] = set()
        while True:
            n = self.g[v.node]
            if n.op not in ("smul", "mul", "div") or self.only_user(v.node) is None:
                return v, s, nodes
            for pos in ((0, 1) if n.op == "mul" else (0,)):
                x, factor = n.inputs[pos], self.scalar(n.inputs[1 - pos])
                if (factor is not None and factor != 0 and self.computed(x)
                        and self.g.type_of(x).shape == n.type.shape):
                    s *= 1.0 / factor if n.op == "div" else factor
                    nodes.add(v.node)
                    v = x
                    break
            else:
                return v, s, nodes

    # ---- attention -----------------------------------------------------------------------
    def attention(self, root: int) -> Fusion | None:
        """softmax(a b * s + mask) v at the final product `root`: SDPA(a, b^T, v, mask, s)."""
        out = self.g[root]
        if out.op != "matmul" or out.attrs["activation"] != "none":
            return None
        p, v = out.inputs
        absorbed: set[int] = set()
        if self.only_user(p.node) != (root, 0):
            return None
        probs = self.g[p.node]
        if (probs.op not in ("softmax", "guarded_softmax")
                or probs.attrs["axis"] not in (-1, probs.type.rank - 1)):
            return None
        guarded = probs.op == "guarded_softmax"
        absorbed.add(p.node)
        scores, mask = probs.inputs[0], None
        if self.only_user(scores.node) != (p.node, 0):
            return None
        n = self.g[scores.node]
        if n.op == "add":
            for pos in (0, 1):
                base = self.scaled(n.inputs[pos])[0]
                if (self.g[base.node].op == "matmul"
                        and self.g.type_of(n.inputs[pos]).shape == n.type.shape):
                    scores, mask = n.inputs[pos], n.inputs[1 - pos]
                    break
            else:
                return None
            absorbed.add(probs.inputs[0].node)
        scores, scale, walked = self.scaled(scores)
        absorbed |= walked
        qk = self.g[scores.node]
        if (qk.op != "matmul" or qk.attrs["activation"] != "none"
                or self.only_user(scores.node) is None):
            return None
        absorbed.add(scores.node)
        a, s_a, walked_a = self.scaled(qk.inputs[0])
        b, s_b, walked_b = self.scaled(qk.inputs[1])
        absorbed |= walked_a | walked_b
        ta, tb, tv = self.g.type_of(a), self.g.type_of(b), self.g.type_of(v)
        rank = ta.rank
        if (rank < 3 or tb.rank != rank or tv.rank != rank or ta.dtype != "float32"
                or tb.dtype != ta.dtype or tv.dtype != ta.dtype
                or ta.shape[:-2] != tb.shape[:-2] or ta.shape[:-2] != tv.shape[:-2]
                or tb.shape[-1] != tv.shape[-2] or not all(map(self.computed, (a, b, v)))):
            return None
        if mask is not None:
            tm = self.g.type_of(mask)
            scores_shape = ta.shape[:-1] + (tb.shape[-1],)
            try:
                fits = (tm.dtype == ta.dtype and tm.rank <= rank
                        and np.broadcast_shapes(tm.shape, scores_shape) == scores_shape)
            except ValueError:
                fits = False
            if not fits:
                return None
            if not guarded:  # an all-masked row: NaN from the softmax, zeros from SDPA
                c = self.const(mask)
                if c is None or not np.isfinite(c).all():
                    return None
        total = scale * s_a * s_b
        if not math.isfinite(total) or total == 0:
            return None
        inputs: tuple[Value | np.ndarray, ...] = (a, b, v) + ((mask,) if mask is not None else ())
        return Fusion("attention", root, frozenset(absorbed), inputs, _attention_builder(total))

    # ---- linear layers -------------------------------------------------------------------
    def linear(self, nid: int) -> Fusion | None:
        mm = self.g[nid]
        if mm.op != "matmul":
            return None
        x, w = mm.inputs
        weight = self.const(w)
        tx = self.g.type_of(x)
        if (weight is None or weight.ndim != 2 or weight.dtype != np.float32
                or tx.dtype != "float32" or tx.rank < 2 or not self.computed(x)):
            return None
        k, n_out = weight.shape
        m = tx.numel // max(tx.shape[-1], 1)
        if m * k * n_out < LINEAR_MIN_WORK:
            return None
        absorbed: set[int] = set()
        root, bias, post, other = nid, None, ("none", ""), None
        if mm.attrs["activation"] != "none":  # the name of an operator with a post-op
            post = _post_op(mm.attrs["activation"], EMPTY_ATTRS)
        else:
            nxt = self._next(root)
            if nxt is not None and self.g[nxt[0]].op == "add":
                c = self._bias(nxt[0], 1 - nxt[1], n_out)
                if c is not None:
                    absorbed.add(root)
                    root, bias = nxt[0], c
            nxt = self._next(root)
            if nxt is not None:
                user = self.g[nxt[0]]
                if get_op(user.op).post_op is not None:
                    absorbed.add(root)
                    root, post = nxt[0], _post_op(user.op, user.attrs)
                elif user.op == "add":
                    r = user.inputs[1 - nxt[1]]
                    tr = self.g.type_of(r)
                    if tr.shape == user.type.shape and tr.dtype == "float32" and self.computed(r):
                        absorbed.add(root)
                        root, other = nxt[0], r
        inputs: tuple[Value | np.ndarray, ...] = (x, np.ascontiguousarray(weight.T))
        inputs += ((bias,) if bias is not None else ()) + ((other,) if other is not None else ())
        return Fusion("linear", root, frozenset(absorbed), inputs,
                      _linear_builder(bias is not None, post, other is not None))

    def _next(self, nid: int) -> tuple[int, int] | None:
        user = self.only_user(nid)
        if user is None or self.g[user[0]].type.shape != self.g[nid].type.shape:
            return None
        return user

    def _bias(self, add: int, pos: int, n_out: int) -> np.ndarray | None:
        c = self.const(self.g[add].inputs[pos])
        out = self.g[add].type
        if (c is None or c.dtype != np.float32 or c.size != n_out or c.ndim > out.rank
                or (c.ndim and c.shape[-1] != n_out)):
            return None
        return np.ascontiguousarray(c.reshape(n_out))


def _post_op(op: str, attrs: Attrs) -> tuple[str, str]:
    """oneDNN's (post-op, algorithm) for an activation operator with these attributes."""
    post = get_op(op).post_op
    assert post is not None, f"{op} is not an activation a product fuses"
    return post.name, post.algorithm(attrs)


# ---- the calls -----------------------------------------------------------------------------

def _last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    """CPU flash attention reads the last dimension as contiguous (and computes garbage when
    it is not): a copy only then."""
    return x if x.stride(-1) == 1 or x.shape[-1] == 1 else x.contiguous()


def _sdpa(q: torch.Tensor, k_t: torch.Tensor, v: torch.Tensor,
          mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    if q.dim() == 3:  # torch runs 3-D attention by its slow reference path on the CPU
        wide_mask = mask.unsqueeze(0) if mask is not None and mask.dim() == 3 else mask
        return _sdpa(q.unsqueeze(0), k_t.unsqueeze(0), v.unsqueeze(0), wide_mask, scale)[0]
    k = k_t.transpose(-2, -1)
    return F.scaled_dot_product_attention(
        _last_dim_contiguous(q), _last_dim_contiguous(k), _last_dim_contiguous(v),
        attn_mask=mask, scale=scale)


def _attention_builder(scale: float) -> Callable[..., Any]:
    def build(ctx: Any, q: Any, k_t: Any, v: Any, mask: Any = None) -> Any:
        return ctx.leaf(_sdpa, q, k_t, v, mask, scale)

    return build


_POST = {"none": lambda y: y, "relu": torch.relu, "tanh": torch.tanh, "sigmoid": torch.sigmoid}


def _linear(x: torch.Tensor, w_t: torch.Tensor, b: torch.Tensor | None, attr: str,
            algorithm: str, other: torch.Tensor | None) -> torch.Tensor:
    """x w_t^T + b, then the activation `attr` or + other: one oneDNN call. Traced (by
    dynamo, or by inductor's tracing of a graph handed to it, on fake tensors) the same in
    plain aten ops, which inductor lowers and fuses its own way. Not
    `torch.compiler.is_compiling()`: that is also true while a torch.compile backend runs the
    program on real tensors (the graphsub backend's race), which must time the oneDNN call."""
    if torch.compiler.is_dynamo_compiling() or is_fake(x):
        y = F.linear(x, w_t, b)
        if other is not None:
            return y + other
        return F.gelu(y, approximate=algorithm) if attr == "gelu" else _POST[attr](y)
    x = x.contiguous()
    fused: torch.Tensor  # torch.ops' operators are untyped
    if other is not None:
        fused = torch.ops.mkldnn._linear_pointwise.binary(x, other.contiguous(), w_t, b, "add")
    else:
        fused = torch.ops.mkldnn._linear_pointwise(x, w_t, b, attr, [], algorithm)
    return fused


def _linear_builder(has_bias: bool, post: tuple[str, str], residual: bool) -> Callable[..., Any]:
    attr, algorithm = post

    def build(ctx: Any, x: Any, w_t: Any, *rest: Any) -> Any:
        b = rest[0] if has_bias else None
        return ctx.leaf(_linear, x, w_t, b, attr, algorithm, rest[-1] if residual else None)

    return build
