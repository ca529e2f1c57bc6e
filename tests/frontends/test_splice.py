"""What the torch.compile backend hands on is dynamo's graph edited, not rebuilt (issue 58):
a graph where nothing is kept goes to inductor exactly as captured; where a rewrite is kept,
every node it does not replace is dynamo's own, in its order, with what dynamo attached to
it; a static cache's writes stay where the program makes them; and greedy decoding over a
static cache, step after step, gives eager's tokens."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch", reason="torch is an optional extra (pip install graphsub[torch])")
transformers = pytest.importorskip("transformers")

from graphsub.frontends import fx_splice, torch_compile  # noqa: E402
from graphsub.ir.builder import GraphBuilder  # noqa: E402
from graphsub.ir.graph import Value  # noqa: E402
from tests.frontends.test_torch_compile import raced  # noqa: E402


@pytest.fixture(autouse=True)
def fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHSUB_CACHE_DIR", str(tmp_path / "cache"))
    torch._dynamo.reset()


def handed_to_inductor(monkeypatch) -> list[torch.fx.GraphModule]:
    """Every graph module the backend hands to inductor, in order (the first: the graph as
    captured, for the baseline), each run as it is instead of compiled."""
    handed: list[torch.fx.GraphModule] = []

    def record(gm, example_inputs, mode=None):
        handed.append(gm)
        return gm.forward

    monkeypatch.setattr(torch_compile, "_inductor", record)
    return handed


def captured_graph(model, *args) -> tuple[torch.fx.GraphModule, list]:
    """dynamo's graph of the model and its example inputs, as a backend receives them."""
    seen = []

    def backend(gm, example_inputs):
        seen.append((gm, list(example_inputs)))
        return gm.forward

    with torch.no_grad():
        torch.compile(model, backend=backend)(*args)
    torch._dynamo.reset()
    return seen[0]


def same_node(mine: torch.fx.Node, theirs: torch.fx.Node) -> bool:
    """Whether two nodes compute alike: op, target, and arguments by their nodes' names."""
    def names(a):
        return torch.fx.node.map_arg(a, lambda n: n.name)

    return (mine.op, mine.target, names(mine.args), names(mine.kwargs)) == \
        (theirs.op, theirs.target, names(theirs.args), names(theirs.kwargs))


def llama(layers: int = 2):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=layers, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(config).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # norms away from one, so that folding them is not trivial
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn(p.shape, generator=gen) * 0.1)
    return model, config


def test_a_copy_of_the_captured_graph_keeps_what_dynamo_attached():
    model, _ = llama(1)
    gm, _ = captured_graph(model.model, torch.randint(0, 100, (1, 8)))
    copy = fx_splice.copy_captured(gm)
    assert copy is not gm and copy.graph is not gm.graph
    pairs = list(zip(copy.graph.nodes, gm.graph.nodes))
    assert len(pairs) == len(gm.graph.nodes) and all(same_node(a, b) for a, b in pairs)
    for mine, theirs in pairs:
        assert mine.meta.get("example_value") is theirs.meta.get("example_value")
        if theirs.op == "placeholder":
            assert mine._dynamo_source == theirs._dynamo_source
    assert copy.meta["dynamo_compile_id"] == gm.meta["dynamo_compile_id"]
    assert copy._param_name_to_source == gm._param_name_to_source


def test_a_graph_with_nothing_kept_is_handed_on_as_captured(monkeypatch):
    """Every contender loses the race: the graph inductor compiles is dynamo's own, node
    for node."""
    handed = handed_to_inductor(monkeypatch)
    captured = []
    backend = torch_compile.graphsub_backend

    def keep(gm, example_inputs, **kwargs):
        captured.append(gm)
        return backend(gm, example_inputs, **kwargs)

    monkeypatch.setattr(torch_compile, "_speedup", lambda *args, **kwargs: raced(0.5))
    model, _ = llama(1)
    compiled = torch.compile(model.model, backend=lambda gm, ex: keep(
        gm, ex, options={"time_limit": 2, "cost": "analytic"}))
    x = torch.randint(0, 100, (1, 8))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", torch_compile.GraphsubWarning)
        got = compiled(x).last_hidden_state
        torch.testing.assert_close(got, model.model(x).last_hidden_state)
    report = torch_compile.reports()[-1]
    assert report.chosen == "inductor" and report.race
    (gm,) = captured
    assert handed[0] is gm  # the baseline: dynamo's graph itself
    assert all(h is not gm for h in handed[1:])  # contenders: copies, never dynamo's changed


def test_a_kept_rewrite_leaves_every_other_node_as_captured(monkeypatch):
    """The attention normal form (a causal flag, grouped heads) kept: the graph handed to
    inductor is dynamo's, its other nodes untouched and in their order; what the replaced
    attention alone read (the mask, the repeated heads) is gone."""
    handed = handed_to_inductor(monkeypatch)
    monkeypatch.setattr(torch_compile, "_speedup", lambda *args, **kwargs: raced(1.5))
    model, _ = llama(2)
    x = torch.randint(0, 100, (1, 16))

    def forward(ids):
        return model.model(ids, use_cache=False).last_hidden_state

    gm, _ = captured_graph(forward, x)
    compiled = torch.compile(forward, backend="graphsub",
                             options={"time_limit": 2, "cost": "analytic", "fission": False})
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), forward(x), rtol=1e-4, atol=1e-5)
    report = torch_compile.reports()[-1]
    assert report.chosen == "normal form+inductor" or report.chosen == "graphsub+inductor"
    edited = handed[1] if report.chosen == "graphsub+inductor" else handed[2]
    rules = {r for p in report.parts for r in p.rules_used}
    assert {"attention-causal-mask", "attention-shared-key-value-heads"} <= rules
    before = {n.name: n for n in gm.graph.nodes}
    after = [n for n in edited.graph.nodes if n.name in before]
    kept = [n for n in after if same_node(n, before[n.name])]
    order = {n.name: k for k, n in enumerate(gm.graph.nodes)}
    assert [n.name for n in after] == sorted((n.name for n in after), key=order.__getitem__)
    changed = [n for n in after if n not in kept]
    # a captured node that reads something else now reads a node of the rewrite in place
    # of one it replaced, and nothing else differs
    assert changed
    for node in changed:
        theirs = before[node.name]
        assert (node.op, node.target) == (theirs.op, theirs.target)
        mine = [a for a in node.all_input_nodes if a.name not in before]
        assert mine and len(node.all_input_nodes) == len(theirs.all_input_nodes), node
    sdpa = [n for n in gm.graph.nodes if n.target is torch._C._nn.scaled_dot_product_attention]
    assert len(sdpa) == 2 and not any(n.name in {s.name for s in sdpa}
                                      for n in edited.graph.nodes)
    gone = set(before) - {n.name for n in edited.graph.nodes}
    assert any("key" in name for name in gone)  # the repeated heads
    for node in edited.graph.find_nodes(op="placeholder"):
        assert node._dynamo_source == before[node.name]._dynamo_source


def test_a_static_cache_s_writes_stay_where_the_program_makes_them(monkeypatch):
    handed = handed_to_inductor(monkeypatch)
    monkeypatch.setattr(torch_compile, "_speedup", lambda *args, **kwargs: raced(1.5))
    model, config = llama(2)
    cache = transformers.StaticCache(config=config, max_cache_len=32)
    with torch.no_grad():
        model(torch.randint(0, 100, (1, 12)), past_key_values=cache,
              cache_position=torch.arange(12))
    step = torch.compile(model.model, backend="graphsub",
                         options={"time_limit": 2, "cost": "analytic", "fission": False})
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", torch_compile.GraphsubWarning)
        step(torch.randint(0, 100, (1, 1)), past_key_values=cache,
             cache_position=torch.tensor([12]))
    report = torch_compile.reports()[-1]
    assert len(report.writes) == 3 * config.num_hidden_layers
    captured, contenders = handed[0], handed[1:]
    assert contenders

    def writes(gm):
        return [(n.target, n.args[0].name) for n in gm.graph.nodes
                if n.op == "call_method" and n.target.endswith("_")
                and isinstance(n.args[0], torch.fx.Node) and n.args[0].op == "placeholder"]

    want = writes(captured)
    assert [t for t, _ in want].count("index_copy_") == 2 * config.num_hidden_layers
    for gm in contenders:
        assert writes(gm) == want  # the same writes, in the same order, in place
        assert not any(n.target in (torch.ops.aten.copy_.default, "copy_")
                       for n in gm.graph.nodes)


def greedy_tokens(model, config, compiled, prompt, steps: int) -> tuple[list[int], list[int]]:
    """Greedy decoding over a static cache, eagerly and through `compiled` (a compilation
    of the inner model's forward), each on its own cache: the tokens each chose."""
    out = []
    for forward in (model.model, compiled):
        cache = transformers.StaticCache(config=config, max_cache_len=prompt.shape[1] + steps)
        with torch.no_grad():
            h = model.model(prompt, past_key_values=cache,
                            cache_position=torch.arange(prompt.shape[1])).last_hidden_state
            token = model.lm_head(h[:, -1]).argmax(-1, keepdim=True)
            tokens = [int(token)]
            for k in range(steps - 1):
                position = torch.tensor([prompt.shape[1] + k])
                h = forward(token, past_key_values=cache, cache_position=position
                            ).last_hidden_state
                logits = model.lm_head(h[:, -1])
                top = logits.topk(2).values[0]
                assert top[0] - top[1] > 1e-4, "a tie would make the test meaningless"
                token = logits.argmax(-1, keepdim=True)
                tokens.append(int(token))
        out.append(tokens)
    return out[0], out[1]


def test_greedy_decoding_over_a_static_cache_gives_eager_s_tokens():
    model, config = llama(2)
    prompt = torch.randint(0, 100, (1, 10), generator=torch.Generator().manual_seed(4))
    compiled = torch.compile(model.model, backend="graphsub",
                             options={"time_limit": 2, "cost": "analytic", "inductor": False})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch_compile.GraphsubWarning)
        eager, mine = greedy_tokens(model, config, compiled, prompt, 12)
    assert mine == eager and len(set(eager)) > 3
    assert any(p.nodes and not p.kept for r in torch_compile.reports() for p in r.parts)


@pytest.mark.slow
def test_greedy_decoding_compiled_as_users_compile_it_gives_eager_s_tokens():
    """No options: the normal form first, the search, the graph handed to inductor and
    raced against inductor alone."""
    model, config = llama(2)
    prompt = torch.randint(0, 100, (1, 10), generator=torch.Generator().manual_seed(4))
    compiled = torch.compile(model.model, backend="graphsub")
    before = len(torch_compile.reports())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch_compile.GraphsubWarning)
        eager, mine = greedy_tokens(model, config, compiled, prompt, 12)
    assert mine == eager
    reports = torch_compile.reports()[before:]
    assert reports and all(r.mode == "default" and not r.fallback for r in reports), \
        [(r.mode, r.fallback) for r in reports]


# ---- plan_region on graphs alone ----------------------------------------------------------

def chain():
    """x -> relu -> exp -> y, and the same with the exp replaced by a sigmoid."""
    b = GraphBuilder()
    x = b.input("x", (4, 8))
    r = b.op("relu", x)
    b.output(b.op("exp", r), "y")
    g = b.build()
    (exp,) = g.nodes_by_op("exp")
    (relu,) = g.nodes_by_op("relu")
    editor = g.edit()
    (s,) = editor.add("sigmoid", [Value(relu, 0)])
    editor.replace_uses(Value(exp, 0), s)
    return g, editor.finish(), relu, exp


def rewrite_of(original, rewritten):
    return fx_splice.Rewrite(original, rewritten, {}, torch.fx.GraphModule({}, torch.fx.Graph()))


def test_a_region_reads_what_the_program_has_and_replaces_what_changed():
    g, h, relu, exp = chain()
    region = fx_splice.plan_region(rewrite_of(g, h), lambda v: True, lambda v: True)
    assert region.reads == (Value(relu, 0),) and region.replaces == (Value(exp, 0),)
    assert sorted(n.op for n in region.graph.nodes.values()) == ["input", "sigmoid"]


def test_a_value_the_program_has_no_node_for_is_computed_again_in_the_region():
    g, h, relu, exp = chain()
    x = Value(g.inputs[0], 0)
    region = fx_splice.plan_region(rewrite_of(g, h), lambda v: v == x, lambda v: True)
    assert region.reads == (x,)
    assert sorted(n.op for n in region.graph.nodes.values()) == ["input", "relu", "sigmoid"]


def test_an_output_no_node_can_be_replaced_leaves_the_part_as_captured():
    g, h, _, _ = chain()
    with pytest.raises(fx_splice.SpliceError, match="output 0"):
        fx_splice.plan_region(rewrite_of(g, h), lambda v: True, lambda v: False)


def test_a_whole_part_is_emitted_with_its_weights_as_constants():
    b = GraphBuilder()
    x = b.input("x", (4, 8))
    w = b.weight(torch.randn(8, 3).numpy())
    b.output(b.op("matmul", x, w), "y")
    g = b.build()
    region = fx_splice.plan_region(rewrite_of(g, g), lambda v: True, lambda v: True, whole=True)
    assert region.reads == (Value(g.inputs[0], 0),)
    assert sorted(n.op for n in region.graph.nodes.values()) == ["input", "matmul", "weight"]
    empty = fx_splice.plan_region(rewrite_of(g, g), lambda v: True, lambda v: True)
    assert not empty.replaces
