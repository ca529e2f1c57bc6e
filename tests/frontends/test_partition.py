"""The parts graphsub converts (frontends/fx_partition.py): siblings in one part where no cycle
forbids it (a decode step's q, k and v projections, which the capability-based partitioner
left in two parts), and never a cycle through the operators left in torch."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is an optional extra (pip install graphsub[torch])")
transformers = pytest.importorskip("transformers")

from graphsub.frontends.fx_origins import ORIGIN, traced_with_origins  # noqa: E402
from graphsub.frontends.fx_partition import partition  # noqa: E402
from tests.frontends.test_splice import captured_graph, llama  # noqa: E402


def decode_step_parts():
    """The ATen graph of one decode step of a 1-layer Llama over a static cache, cut into
    parts; each part's submodule by name, and the traced graph."""
    model, config = llama(1)
    cache = transformers.StaticCache(config=config, max_cache_len=24)
    with torch.no_grad():
        model(torch.randint(0, 100, (1, 12)), past_key_values=cache,
              cache_position=torch.arange(12))

    def step(token, position):
        return model.model(token, past_key_values=cache, cache_position=position
                           ).last_hidden_state

    gm, inputs = captured_graph(step, torch.randint(0, 100, (1, 1)), torch.tensor([12]))
    aten = traced_with_origins(gm, [x.clone() if isinstance(x, torch.Tensor) else x
                                    for x in inputs], functional=True)
    parent = partition(aten)
    return {n.target: getattr(parent, n.target) for n in parent.graph.nodes
            if n.op == "call_module"}, gm


def test_a_decode_step_s_projections_share_a_part():
    parts, gm = decode_step_parts()
    linears = [n.name for n in gm.graph.nodes if n.target is torch._C._nn.linear]
    assert len(linears) == 7  # q, k, v, o, gate, up, down
    where = {}
    for name, sub in parts.items():
        for node in sub.graph.nodes:
            if node.meta.get(ORIGIN) in linears:
                where[node.meta[ORIGIN]] = name
    q, k, v = linears[:3]
    assert where[q] == where[k] == where[v], where


def test_a_part_taken_whole_closes_a_cycle_its_operators_alone_do_not():
    """P = {a, c} and R = {r1, r2}: a feeds r1 and r2 feeds c, with no path from r1 to r2.
    Operator by operator nothing leaves P and comes back; as calls, P runs before R (a) and
    after it (c): a cycle, which the move and merge checks must see."""
    from graphsub.frontends.fx_partition import _leaves_and_returns

    g = torch.fx.Graph()
    x = g.placeholder("x")
    a = g.call_function(torch.relu, (x,))
    r1 = g.call_function(torch.neg, (a,))
    r2 = g.call_function(torch.exp, (x,))
    c = g.call_function(torch.sigmoid, (r2,))
    g.output((r1, c))
    p, r = {a, c}, {r1, r2}
    assert _leaves_and_returns(p, [p, r])
    assert not _leaves_and_returns(p, [p, {r1}, {r2}])


def test_layout_operators_join_the_part_that_reads_them():
    """A value head's copies (an expand and a view after its projection) go to the part of
    the attention that reads them, along their chain; a layout operator both parts read
    stays where it is."""
    from graphsub.frontends.fx_partition import _views_sunk

    aten = torch.ops.aten
    g = torch.fx.Graph()
    x = g.placeholder("x")
    projected = g.call_function(aten.relu.default, (x,))
    copies = g.call_function(aten.expand.default, (projected, [2, 4]))
    heads = g.call_function(aten.view.default, (copies, [8]))
    shared = g.call_function(aten.view.default, (projected, [4]))
    kept = g.call_function(aten.sigmoid.default, (shared,))
    attention = g.call_function(aten.neg.default, (heads,))
    read_too = g.call_function(aten.exp.default, (shared,))
    g.output((attention, kept, read_too))
    for node in g.nodes:
        node.meta[ORIGIN] = node.name
    parts = _views_sunk([{projected, copies, heads, shared, kept}, {attention, read_too}])
    assert parts == [{projected, shared, kept}, {copies, heads, attention, read_too}]
