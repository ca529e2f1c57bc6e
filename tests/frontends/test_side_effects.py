"""Programs that write into their inputs and buffers, compiled with graphsub (issue 49): the
writes are found before anything runs, every run graphsub makes while compiling writes
private copies (never a tensor the user passed), the user's call writes exactly once, in
the program's order, and under `no_grad` and `inference_mode` alike."""

from __future__ import annotations

import copy
import warnings

import pytest

torch = pytest.importorskip("torch", reason="torch is an optional extra (pip install graphsub[torch])")
fx = torch.fx

from graphsub.errors import GraphsubError  # noqa: E402
from graphsub.frontends import side_effects, torch_compile  # noqa: E402
from graphsub.runtime.timing import CallTimer  # noqa: E402
from tests.frontends.stateful_programs import (WRITES, State, StatefulProgram,  # noqa: E402
                                               choices, program, state_of)

#: Quick options: the point here is what is written, not how fast the result runs.
QUICK = {"time_limit": 1, "cost": "analytic", "inductor": False}


@pytest.fixture(autouse=True)
def fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHSUB_CACHE_DIR", str(tmp_path / "cache"))
    torch._dynamo.reset()
    torch.manual_seed(0)


def aten_graph(fn, *args):
    """fn traced to ATen operators and functionalized, as the backend traces a graph."""
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(torch.func.functionalize(fn, remove="mutations_and_views"),
                   decomposition_table={})(*[a.clone() for a in args])


def arguments(model):
    """A call's arguments: the input, and the state where the program takes it as one."""
    x = torch.randn(2, 16)
    return (x, State(2)) if model.c.state_as_argument else (x,)


def captured(model, *args):
    """The graph dynamo captures of `model` on these arguments, and its example inputs."""
    graphs = []

    def keep(gm, example_inputs):
        graphs.append((gm, list(example_inputs)))
        return gm.forward

    with torch.no_grad():
        torch.compile(model, backend=keep)(*args)
    torch._dynamo.reset()
    return graphs[0]


# ---- finding the writes ---------------------------------------------------------------------

def test_the_writes_of_every_kind_are_found_without_running_the_program():
    for writes in [(w,) for w in WRITES]:
        model = program(0, writes)
        gm, example = captured(model, *arguments(model))
        before = [t.clone() for t in example]
        found = side_effects.find_writes(gm, example)
        names = set(found.names)
        assert all(torch.equal(a, b) for a, b in zip(example, before)), writes
        expected = {"counter": {"count"}, "index_copy": {"count", "cache"},
                    "setitem": {"count", "cache"}, "running_mean": {"mean"},
                    "argument": {"x"}, "view": {"acc"}, "iadd": {"acc"}}[writes[0]]
        assert {next(e for e in expected if e in n) for n in names} == expected, (writes, names)


def test_a_program_that_writes_nothing_has_no_writes():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
    gm, example = captured(model, torch.randn(2, 8))
    assert not side_effects.find_writes(gm, example)


def test_a_change_of_an_inputs_size_is_refused_by_name():
    graph = fx.Graph()
    x = graph.placeholder("x")
    graph.call_function(torch.ops.aten.resize_.default, (x, [8]))
    graph.output((x,))
    with pytest.raises(GraphsubError, match="resize_"):
        side_effects.written_inputs(fx.GraphModule(torch.nn.Module(), graph))


# ---- the program without its writes ----------------------------------------------------------

def cache_step(count, cache, x):
    position = count.clone().reshape(1)
    count.add_(1)
    cache.index_copy_(0, position, x)
    return ((x @ cache.t()).softmax(-1) @ cache,)


def test_the_program_without_its_writes_returns_them_and_changes_nothing():
    count, cache, x = torch.tensor(2), torch.randn(6, 4), torch.randn(1, 4)
    gm = aten_graph(cache_step, count, cache, x)
    writes = side_effects.Writes(side_effects.written_inputs(gm), ("count", "cache"))
    assert writes.positions == (0, 1)
    functional = side_effects.without_writes(gm, writes)
    args = [count.clone(), cache.clone(), x]
    out, new_count, new_cache = functional(*args)
    assert torch.equal(args[0], count) and torch.equal(args[1], cache)  # nothing written
    want_count, want_cache = count.clone(), cache.clone()
    (want,) = cache_step(want_count, want_cache, x)
    torch.testing.assert_close(out, want)
    assert torch.equal(new_count, want_count) and torch.equal(new_cache, want_cache)


def test_private_inputs_are_copies_restored_before_each_timed_call():
    count, x = torch.tensor(0), torch.randn(3)
    private = side_effects.PrivateInputs([count, x], side_effects.Writes((0,), ("count",)))
    args = private.fresh()
    assert args[0] is not count and args[1] is x
    seen = []

    def step(c, _):
        seen.append(int(c))
        c.add_(1)

    timer = CallTimer(lambda: step(*args), setup=private.restorer(args))
    timer.timed(5)
    assert seen == [0] * 5 and int(count) == 0


# ---- the backend on programs that write -------------------------------------------------------

def run_both(model, compiled, calls, state=None, grad_mode=torch.no_grad):
    """Eager and compiled side by side for `calls` calls, each on its own copy of the state
    and of the arguments; asserts that outputs and every written tensor agree after each."""
    eager_model = program_copy(model)
    mine, theirs = (state.copy() if state else None), (state.copy() if state else None)
    gen = torch.Generator().manual_seed(7)
    for call in range(calls):
        x = torch.randn(2, 16, generator=gen)
        with grad_mode():
            xa, xb = x.clone(), x.clone()
            want = eager_model(xa, theirs) if theirs is not None else eager_model(xa)
            got = compiled(xb, mine) if mine is not None else compiled(xb)
        where = f"call {call}: {model.c.text()}"
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=lambda m: f"{where}: {m}")
        torch.testing.assert_close(xb, xa, msg=lambda m: f"{where}: argument: {m}")
        for name, t in state_of(eager_model, theirs).items():
            torch.testing.assert_close(state_of(model, mine)[name], t,
                                       msg=lambda m, name=name: f"{where}: {name}: {m}")


def program_copy(model):
    twin = StatefulProgram(model.c)
    twin.load_state_dict(model.state_dict())
    return twin.eval()


def check_stateful_program(seed, writes=None, calls=3, grad_mode=torch.no_grad, **options):
    torch._dynamo.reset()
    model = program(seed, writes)
    state = State(2) if model.c.state_as_argument else None
    before = len(torch_compile.reports())
    compiled = torch.compile(model, backend="graphsub", options={**QUICK, **options})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch_compile.GraphsubWarning)  # asserted below
        run_both(model, compiled, calls, state, grad_mode)
    reports = torch_compile.reports()[before:]
    assert reports and not any(r.fallback for r in reports), \
        (model.c.text(), [r.fallback for r in reports])
    assert any(r.writes for r in reports), model.c.text()
    assert any(p.nodes and not p.kept for r in reports for p in r.parts), model.c.text()
    return reports


@pytest.mark.parametrize("grad_mode", [torch.no_grad, torch.inference_mode])
def test_a_cache_and_a_counter_are_written_once_per_call(grad_mode):
    """The race runs both ways of the graph dozens of times: with the user's tensors the
    counter would run past the cache (an IndexError) and the cache would differ."""
    check_stateful_program(0, ("index_copy",), calls=4, grad_mode=grad_mode, race=True)


@pytest.mark.parametrize("writes", [("setitem", "running_mean"), ("argument", "view", "iadd")])
def test_every_kind_of_write_is_kept_exactly(writes):
    check_stateful_program(1, writes, race=False)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(2, 14))
def test_random_stateful_programs_equal_eager_call_after_call(seed):
    check_stateful_program(seed, calls=4, race=seed % 3 == 0)


def test_the_fuzzed_programs_cover_every_write_and_where_state_lives():
    drawn = [choices(seed) for seed in range(2, 14)]
    assert {w for c in drawn for w in c.writes} == set(WRITES)
    assert {c.state_as_argument for c in drawn} == {True, False}
    assert {c.read_before_write for c in drawn} == {True, False}


def test_compiling_writes_no_tensor_the_user_passed():
    """The backend alone (what torch.compile runs before the user's first call): every
    tensor it was handed has the same version and value after it as before."""
    model = program(0, ("index_copy", "running_mean", "argument"))
    gm, example = captured(model, *arguments(model))
    versions = [t._version for t in example]
    values = [t.clone() for t in example]
    with warnings.catch_warnings():
        warnings.simplefilter("error", torch_compile.GraphsubWarning)
        with torch.no_grad():
            torch_compile.graphsub_backend(gm, example, {**QUICK, "race": True})
    report = torch_compile.reports()[-1]
    assert not report.fallback and len(report.writes) == 4  # count, cache, mean, x
    assert [t._version for t in example] == versions
    assert all(torch.equal(a, b) for a, b in zip(example, values))


def test_a_written_buffer_is_state_not_a_constant():
    """graphsub folds parameters and buffers as constants; a buffer the program writes
    changes from call to call and must be read anew each time."""
    model = program(0, ("running_mean",))
    gm, example = captured(model, *arguments(model))
    mean = next(i for i, n in enumerate(gm.graph.find_nodes(op="placeholder"))
                if "mean" in n.name)
    writes = side_effects.find_writes(gm, example)
    assert mean in writes.positions
    assert mean not in [i for i in torch_compile._constant_positions(gm, example)
                        if i not in writes.positions]


def test_an_augmented_assignment_to_an_argument_is_a_write():
    class Adds(torch.nn.Module):
        def forward(self, x, y):
            x += y
            return x * 2

    gm, example = captured(Adds(), torch.randn(3), torch.randn(3))
    assert side_effects.find_writes(gm, example).positions == (0,)


@pytest.mark.slow
def test_a_program_that_writes_races_inductor_in_its_mode(monkeypatch):
    """With inductor, dynamo's graph with graphsub's rewrite spliced in (its writes where
    the program makes them) is compiled by it too, and the race against inductor alone runs
    both on private copies. (The rewrite is forced: which one a search finds is not this
    test's matter.)"""
    from tests.frontends.test_torch_compile import force_rewrites

    applied = force_rewrites(monkeypatch, ["matmul-as-transposed-product"])
    reports = check_stateful_program(0, ("index_copy", "running_mean"), calls=4,
                                     inductor=True, mode="default", race=True,
                                     algorithm="forced")
    assert applied and any("graphsub+inductor" in r.race for r in reports)


@pytest.mark.parametrize("grad_mode", [torch.no_grad, torch.inference_mode])
def test_a_failure_while_compiling_leaves_the_state_as_one_call_leaves_it(monkeypatch, grad_mode):
    """The graph falls back to running as captured after graphsub traced and ran it: the
    user's state is then what one eager call makes of it, not what graphsub's runs did."""
    def fails(*args, **kwargs):
        raise RuntimeError("a failure late in the backend")

    monkeypatch.setattr(torch_compile, "_contenders", fails)
    model = program(0, ("index_copy", "iadd"))
    state = State(2) if model.c.state_as_argument else None
    compiled = torch.compile(model, backend="graphsub", options=QUICK)
    with pytest.warns(torch_compile.GraphsubWarning, match="a failure late in the backend"):
        run_both(model, compiled, 2, state, grad_mode)
    assert "a failure late" in torch_compile.reports()[-1].fallback


def test_a_program_that_writes_with_dynamic_sizes_runs_as_captured_saying_why():
    model = program(0, ("index_copy",))
    state = State(2) if model.c.state_as_argument else None
    compiled = torch.compile(model, backend="graphsub", dynamic=True, options=QUICK)
    with pytest.warns(torch_compile.GraphsubWarning, match="write into tensors in place"):
        run_both(model, compiled, 3, state)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (CUDA graphs)")
def test_cuda_graphs_write_the_callers_tensors_once_per_call():
    """Warm-up calls before a capture run on copies; the replay writes the caller's tensors,
    read and written where they are."""
    from graphsub.frontends.cuda_graphs import CudaGraphed

    def step(count, cache, x):
        position = count.clone().reshape(1)
        count.add_(1)
        cache.index_copy_(0, position, x)
        return cache.sum(0) * x

    wrapped = CudaGraphed(step, written=(0, 1))
    count, cache = torch.zeros((), dtype=torch.long, device="cuda"), \
        torch.zeros(8, 4, device="cuda")
    want_count, want_cache = count.clone(), cache.clone()
    for call in range(4):
        x = torch.randn(1, 4, device="cuda")
        torch.testing.assert_close(wrapped(count, cache, x), step(want_count, want_cache, x))
        assert int(count) == call + 1
        torch.testing.assert_close(cache, want_cache)


def test_a_graph_whose_in_place_operations_write_only_its_own_tensors_is_not_traced_again(
        monkeypatch):
    """ResNet's `ReLU(inplace=True)` writes what a convolution made, never an input: the
    look at dynamo's graph settles it, without a second trace."""
    class InPlace(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x):
            y = self.lin(x)
            torch.nn.functional.relu(y, True)
            y.mul_(2)
            return y

    gm, example = captured(InPlace().eval(), torch.randn(2, 8))
    assert not side_effects.may_write_inputs(gm)
    monkeypatch.setattr(torch.func, "functionalize", None)  # a trace would fail
    assert not side_effects.find_writes(gm, example)


def test_an_in_place_relu_of_an_argument_is_a_write():
    class Relu(torch.nn.Module):
        def forward(self, x):
            torch.nn.functional.relu(x, True)
            return x + 1

    gm, example = captured(Relu(), torch.randn(4))
    assert side_effects.may_write_inputs(gm)
    assert side_effects.find_writes(gm, example).positions == (0,)


def test_batch_norm_in_training_is_refused_before_anything_runs():
    """No trailing underscore says so, and functionalization does not show it: batch norm
    computing with the batch's statistics updates its running ones in place (a model left in
    training mode under no_grad). The graph runs as captured, its statistics updated once
    per call, and the warning says what to do."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)).train()
    twin = copy.deepcopy(model)
    compiled = torch.compile(model, backend="graphsub", options=QUICK)
    x = torch.randn(3, 4)
    with torch.no_grad(), pytest.warns(torch_compile.GraphsubWarning, match="model.eval"):
        torch.testing.assert_close(compiled(x), twin(x))
    torch.testing.assert_close(model[1].running_mean, twin[1].running_mean)
    assert int(model[1].num_batches_tracked) == 1
    gm, example = captured(torch.nn.BatchNorm1d(4).eval(), torch.randn(3, 4))
    assert not side_effects.may_write_inputs(gm)
