"""`torch.compile(model, backend="graphsub")`: graphsub as a torch.compile backend.

For each graph torch.compile captures, the backend
0. finds the inputs it writes into (a static key/value cache, a counter: side_effects), before
   running anything: from here on it works on the graph without its writes, which changes
   nothing it runs on, and what writes runs only on private copies;
1. traces it to ATen operators (views functionalized, shapes recorded) with the example inputs;
2. splits it into the parts graphsub can express and the rest (`fx_import.supported`): the
   rest stays as torch code, the parts become graphsub Graphs, parameters and buffers as
   weights (graphsub optimizes inference: like inductor's freezing, it assumes they do not
   change after compilation);
3. optimizes each part for the device the inputs are on (`torch-cuda` or `torch-cpu`) within
   the time limit, under the measured cost of that device: the search, then fission and
   kernel orchestration (graphsub.fission), whose graph replaces the search's where it is
   predicted cheaper and then runs faster, timed against it round by round;
4. checks each optimized part against the original part on the example inputs and on random
   ones; a part that disagrees, or that fails anywhere on the way, stays as it was;
5. hands each optimized part's outputs on in the memory layout the original part gave them
   (the torch code between parts may call kernels, such as the CPU's fused attention, that
   read their operands' strides without checking them), and checks the whole assembled graph
   against the original, putting original parts back (the last first) until it agrees;
6. builds the module that runs the optimized parts with graphsub's torch backend and the
   rest as before, the graph's writes put back as its last effect; with
   `options={"inductor": True}` it hands that module on to inductor;
7. races it, round by round on the example inputs, against what the user would have had
   without graphsub (the captured graph run eagerly, or compiled by inductor alone) and
   returns the faster: per-part measurements cannot see how inductor fuses across the parts'
   boundaries, and graphsub's result must never be slower than going without it. With
   inductor, graphsub's own module (its library kernels, no inductor) runs in the race too:
   on models inductor does not speed up, it can be the fastest of the three.

Nothing here ever fails the user's model: a graph graphsub cannot handle runs unchanged (with
a warning saying why).

    import torch, graphsub.frontends.torch_compile  # the entry point makes the import optional
    fast = torch.compile(model, backend="graphsub", options={"time_limit": 20})
    with torch.no_grad():
        fast(x)
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, cast

import torch
import torch.fx as fx
from torch.fx.passes.operator_support import OperatorSupportBase

from graphsub.budget import Budget, StageClock
from graphsub.errors import ConversionError, GraphsubError
from graphsub.targets.torch.program import SizedTorchProgram, symbol_sources, symbol_values
from graphsub.targets.torch.target import TorchTarget
from graphsub.frontends.dynamic_trace import (has_dynamic_sizes, input_symbols, inputs_at,
                                              other_bindings, trace_dynamic)
from graphsub.frontends.cuda_graphs import CudaGraphed
from graphsub.fission import stage as fission_stage
from graphsub.frontends.fx_fold import fold_constants
from graphsub.frontends.fx_equivalence import compared, disagreement, restrided, shapes
from graphsub.frontends.fx_import import convert_graph, symbolic_size, unsupported_reason
from graphsub.frontends.side_effects import (PrivateInputs, Writes, find_writes,
                                             returning_writes, with_writes, without_writes)
from graphsub.ir.binding import is_symbolic_graph
from graphsub.ir.graph import Graph
from graphsub.tensors.symbolic import bind_all, evaluate_size
from graphsub.pipeline import (FISSION, SEARCH, Found, RuleSet, RunContext, Settings, Stage,
                               run_stage, start_run)
from graphsub.search.normal_form import normal_form
from graphsub.runtime.check_sizes import ProfileShape
from graphsub.verdicts.speedup import MIN_ROUNDS, Decision, HeadToHead, sequential
from graphsub.runtime.timing import CallTimer

log = logging.getLogger("graphsub.torch_compile")


class GraphsubWarning(UserWarning):
    """graphsub left (part of) a graph unoptimized; the message says why."""


#: inductor's modes, as `torch.compile(mode=...)` names them.
INDUCTOR_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
#: The modes that run compiled code in CUDA graphs.
CUDA_GRAPH_MODES = frozenset({"reduce-overhead", "max-autotune"})


@dataclass
class BackendOptions:
    """What `options=` may hold: these, and the search algorithm's own options by name (e.g.
    `{"algorithm": "mcts", "c": 1.4}`), checked when the backend is called."""

    time_limit: float = 10.0            # seconds of search per captured graph, over its parts
    target: str | None = None           # default: torch-cuda for CUDA inputs, else torch-cpu
    #: The cost model the search prices with: "compiled" (the kernels inductor builds,
    #: compiled and timed: graphsub.cost.compiled), "measured" (operator by operator) or
    #: "analytic"; by default compiled where inductor compiles the result, else measured.
    cost: str | None = None
    algorithm: str = "backtracking"
    #: Hand the optimized graph on to inductor and race it against inductor alone, so that
    #: `backend="graphsub"` is never slower than `backend="inductor"`; False: graphsub's own
    #: torch program, raced against the graph run eagerly.
    inductor: bool = True
    #: inductor's mode (INDUCTOR_MODES; None is its default mode): the optimized graph is
    #: compiled, and raced against inductor alone, in that mode; graphsub's own module runs in
    #: CUDA graphs where the mode does. `torch.compile(..., mode=M)` gives it as
    #: `options={"mode": M}` does.
    mode: str | None = None
    fission: bool = True                # fission and kernel orchestration after the search
    race: bool = True                   # keep graphsub's module only if it outruns the baseline
    rules: Sequence[str] | None = None  # rule files, added to the built-in library
    rtol: float = 1e-3                  # verification tolerance (relative; absolute scales)
    #: The algorithm's own options (alpha, k, c, seed, ...).
    search: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, options: dict[str, Any] | None, mode: str | None = None) -> BackendOptions:
        """The options as torch.compile passes them: `options=` and `mode=` (which
        torch.compile hands a backend only when it is not "default")."""
        options = dict(options or {})
        if mode is not None:
            options.setdefault("mode", mode)
        known = {f.name for f in fields(cls)} - {"search"}
        search = {k: options.pop(k) for k in sorted(set(options) - known)}
        opts = cls(**options, search=search)
        if opts.mode is not None:
            if opts.mode not in INDUCTOR_MODES:
                raise GraphsubError(f"graphsub backend options: mode {opts.mode!r} is not one of "
                                    f"inductor's modes ({', '.join(INDUCTOR_MODES)})")
            if not opts.inductor:
                raise GraphsubError(f"graphsub backend options: mode {opts.mode!r} is inductor's; "
                                    f"it cannot be given with inductor=False")
        opts.settings(opts.target or "torch-cpu", opts.time_limit)  # fails here, not per part
        return opts

    @property
    def baseline_name(self) -> str:
        """What the user would have had without graphsub, as a report names it."""
        return "inductor" if self.inductor else "eager"

    @property
    def cost_model(self) -> str:
        """The cost model's name: what prices graphs as they will run."""
        return self.cost or ("compiled" if self.inductor else "measured")

    @property
    def cuda_graphs(self) -> bool:
        """Whether the mode runs the compiled graph in CUDA graphs."""
        return self.mode in CUDA_GRAPH_MODES

    def settings(self, target: TorchTarget | str, time_limit: float) -> Settings:
        """The settings of one part's search: this budget, on this target."""
        try:
            return Settings.make(algorithm=self.algorithm, cost=self.cost_model, target=target,
                                 time_limit=time_limit, fission=self.fission,
                                 options=self.search)
        except GraphsubError as exc:
            raise GraphsubError(f"graphsub backend options: {exc} (the backend's own: "
                                f"{', '.join(f.name for f in fields(self) if f.name != 'search')})"
                                ) from None


@dataclass
class PartReport:
    nodes: int
    rules_used: dict[str, int]
    predicted_before: float
    predicted_after: float
    search_seconds: float
    kept: str = ""  # why the original part was kept, if it was
    #: Fission and orchestration of the search's best graph (graphsub.fission.stage), and
    #: whether its graph, predicted cheaper, replaced the search's.
    fission: dict[str, Any] = field(default_factory=dict)
    #: What the cost model says about its prices (operators it could not time, fused groups
    #: estimated rather than compiled in the time given).
    notes: list[str] = field(default_factory=list)


@dataclass
class CompileReport:
    """What the backend did to one captured graph (`graphsub.frontends.torch_compile.reports()`)."""

    target: str
    #: The cost model the search priced with (BackendOptions.cost_model).
    cost: str = ""
    #: inductor's mode the graph was compiled and raced in ("default", "reduce-overhead",
    #: ...); "" where graphsub's own program raced the graph run eagerly.
    mode: str = ""
    parts: list[PartReport] = field(default_factory=list)
    left_in_torch: dict[str, int] = field(default_factory=dict)  # unconverted ops, by name
    seconds: float = 0.0
    fallback: str = ""  # why the whole graph ran unchanged, if it did
    #: The final race: each contender's speedup over the baseline (the baseline's median time
    #: over the contender's; above 1: faster), the best of them (None: no race was run), and
    #: which way of running the graph was returned ("graphsub+inductor", "graphsub", or the
    #: baseline: "inductor" or "eager").
    race: dict[str, float] = field(default_factory=dict)
    #: Contenders left out of the race, and why (a compilation or CUDA-graph capture failed).
    dropped: dict[str, str] = field(default_factory=dict)
    speedup: float | None = None
    chosen: str = ""
    #: With dynamic sizes: each size symbol's range, its value in the example (what costs were
    #: measured at) and the other sizes the optimized graph was checked at.
    sizes: dict[str, Any] = field(default_factory=dict)
    #: The inputs the graph writes into (a key/value cache, a counter), by the names
    #: torch.compile gave them: the writes stay in torch as the graph's last effect, and every
    #: run graphsub made while compiling wrote copies of them, never the user's tensors.
    writes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


#: The reports of the last graphs compiled in this process: a long-lived process (a server
#: compiling model after model) keeps the newest, not all.
REPORTS_KEPT = 100
_REPORTS: deque[CompileReport] = deque(maxlen=REPORTS_KEPT)


def reports() -> list[CompileReport]:
    """Reports of the graphs compiled in this process (the last REPORTS_KEPT), oldest first."""
    return list(_REPORTS)


def graphsub_backend(gm: fx.GraphModule, example_inputs: Sequence[Any],
                     options: dict[str, Any] | None = None, mode: str | None = None
                     ) -> Callable[..., Any]:
    """The torch.compile backend (registered as "graphsub" through torch's entry point)."""
    opts = BackendOptions.parse(options, mode)
    start = time.perf_counter()
    try:
        with _global_state_kept(), _shape_guards_kept(gm, example_inputs):
            compiled, report = _compile(gm, list(example_inputs), opts)
    except _restart_analysis():
        raise  # dynamo asks to capture the graph again (and calls the backend again)
    except Exception as exc:  # noqa: BLE001 - the user's model must run whatever happened here
        report = CompileReport(opts.target or "", opts.cost_model, fallback=str(exc) or type(exc).__name__)
        warnings.warn(f"graphsub: this graph runs unoptimized: {report.fallback}", GraphsubWarning,
                      stacklevel=2)
        compiled, _ = _baseline(gm, example_inputs, opts, report)
    report.seconds = time.perf_counter() - start
    _REPORTS.append(report)
    log.info("graphsub compiled a graph: %s", report.as_dict())
    return compiled


@contextlib.contextmanager
def _global_state_kept() -> Iterator[None]:
    """torch's global settings as they were: timing on a target sets threads, cuDNN's
    autotuner and TF32, and torch.compile requires a backend to leave them unchanged."""
    threads = torch.get_num_threads()
    flags = (torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32,
             torch.backends.cudnn.allow_tf32)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        (torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32,
         torch.backends.cudnn.allow_tf32) = flags


@contextlib.contextmanager
def _shape_guards_kept(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Iterator[None]:
    """dynamo's shape environment without the guards graphsub's work left on symbols no input
    of the graph has as a size. Tracing and compiling the contenders over dynamo's symbols
    adds guards to its environment; one over a symbol made on the way (a contender's own, not
    an input's) has no source, and dynamo fails building the graph's guards on it ("list index
    out of range"), which ended the user's call. Such guards cannot be checked when the graph
    is called anyway; the ones over the inputs' sizes stay."""
    from torch._guards import TracingContext

    context = TracingContext.try_get()
    env = getattr(getattr(context, "fake_mode", None), "shape_env", None)
    before = len(env.guards) if env is not None else 0
    try:
        yield
    finally:
        if env is not None and len(env.guards) > before:
            sized = _input_symbols(gm, example_inputs)
            kept = [g for g in env.guards[before:] if g.expr.free_symbols <= sized]
            if len(kept) < len(env.guards) - before:
                log.info("dropped %d guard(s) over symbols no input has as a size: %s",
                         len(env.guards) - before - len(kept),
                         [str(g.expr) for g in env.guards[before:] if g not in kept][:5])
                env.guards[before:] = kept


def _input_symbols(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> set[Any]:
    """The symbols of dynamo's graph inputs' sizes (and of its size inputs)."""
    out: set[Any] = set()
    values = [n.meta.get("example_value") for n in gm.graph.find_nodes(op="placeholder")]
    for value in list(values) + list(example_inputs):
        sizes = [value] if isinstance(value, torch.SymInt) else \
            list(value.shape) + list(value.stride()) if isinstance(value, torch.Tensor) else []
        for size in sizes:
            if isinstance(size, torch.SymInt):
                out |= size.node.expr.free_symbols
    return out


def _restart_analysis() -> type[BaseException]:
    """The exception with which inductor asks dynamo to capture the graph again (a float
    made a tensor): not a failure, and it must reach dynamo."""
    from torch._dynamo.exc import RestartAnalysis

    return RestartAnalysis


def _baseline(gm: fx.GraphModule, example_inputs: Sequence[Any], opts: BackendOptions,
              report: CompileReport) -> tuple[Callable[..., Any], BackendOptions]:
    """What the user would have had without graphsub: the graph compiled by inductor in the
    options' mode, or run eagerly. Where inductor cannot compile it (no C++ compiler on this
    machine, an operator it does not lower), the graph runs eagerly, raced against graphsub's
    own program, with a warning; the options returned say so."""
    if not opts.inductor:
        return gm.forward, opts
    try:
        return _inductor(gm, example_inputs, opts.mode), opts
    except _restart_analysis():
        raise
    except Exception as exc:  # noqa: BLE001 - the user's model must run whatever happened here
        report.dropped["inductor"] = f"{type(exc).__name__}: {exc}"[:500]
        warnings.warn(f"graphsub: inductor could not compile this graph ({report.dropped['inductor']}"
                      f"): graphsub's own program races the graph run eagerly", GraphsubWarning,
                      stacklevel=3)
        return gm.forward, replace(opts, inductor=False, mode=None)


def _inductor(gm: fx.GraphModule, example_inputs: Sequence[Any],
              mode: str | None = None) -> Callable[..., Any]:
    """The graph compiled by inductor in `mode`, as `torch.compile(mode=mode)` compiles it
    (the mode's configuration, `torch._inductor.list_mode_options`, patched in)."""
    from torch._inductor import list_mode_options
    from torch._inductor.compile_fx import compile_fx

    patches = list_mode_options(mode) if mode else {}
    # a callable here: torch types compile_fx's result as a union of outputs
    return cast(Callable[..., Any],
                compile_fx(gm, list(example_inputs), config_patches=patches or None))


def _compile(gm: fx.GraphModule, example_inputs: list[Any],
             opts: BackendOptions) -> tuple[Callable[..., Any], CompileReport]:
    tensors = [t for t in example_inputs if isinstance(t, torch.Tensor)]
    dynamic = has_dynamic_sizes(gm, example_inputs)
    if not dynamic and len(tensors) < len(example_inputs):
        raise GraphsubError("graphsub takes tensors and sizes as inputs of a graph")
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        raise GraphsubError("graphsub optimizes inference: call the compiled model under "
                            "torch.no_grad() or torch.inference_mode()")
    devices = {t.device.type for t in tensors}
    target_name = opts.target or ("torch-cuda" if "cuda" in devices else "torch-cpu")
    report = CompileReport(target_name, opts.cost_model)
    # Found before anything runs: every run below that writes gets private copies.
    writes = find_writes(gm, example_inputs, dynamic)
    report.writes = list(writes.names)

    # inductor's own compilation first: it may ask dynamo to capture the graph again, which
    # is better asked before the search than after it.
    baseline, opts = _baseline(gm, example_inputs, opts, report)
    report.cost, report.mode = opts.cost_model, (opts.mode or "default") if opts.inductor else ""
    hints: dict[str, int] = {}
    if dynamic:
        aten_gm, inputs, hints = trace_dynamic(gm, example_inputs)
    else:
        traced = _trace_static(gm, PrivateInputs(example_inputs, writes).fresh())
        aten_gm, inputs = without_writes(traced, writes), list(example_inputs)
    # (state the graph writes changes from call to call: never a constant)
    constants = [i for i in _constant_positions(gm, example_inputs)
                 if i not in writes.positions]
    placeholders = [n for n in aten_gm.graph.nodes if n.op == "placeholder"]
    fold_constants(aten_gm, {placeholders[i]: inputs[i] for i in constants})
    propagate_shapes(aten_gm, inputs)
    # The inputs the optimized graph is checked on: the example, and with dynamic sizes the
    # same graph at other sizes (where the original runs at all).
    checks, race_inputs = [inputs], [inputs]
    profile: list[dict[str, int]] = []
    if dynamic:
        symbols = input_symbols(aten_gm.graph)
        hints = {name: hints[name] for name in symbols}
        profile.append(hints)
        checks += _runnable_inputs(aten_gm, inputs, other_bindings(aten_gm, hints), constants)
        checked = [_binding_of(aten_gm, c) for c in checks[1:]]
        # Costs are measured, and the result raced, at the example's sizes and at the
        # largest the graph was checked at: a choice made for short sequences alone can
        # lose on long ones.
        largest = max(range(len(checked)), key=lambda i: math.prod(checked[i].values()),
                      default=None)
        if largest is not None:
            profile.append(checked[largest])
            race_inputs.append(checks[1 + largest])
        report.sizes = {"symbols": {name: str(r) for name, r in symbols.items()},
                        "example": hints, "checked_at": checked, "profile": profile}
    # Constant values by node name (partitioning rebuilds the graph; names survive it).
    placeholders = [n for n in aten_gm.graph.nodes if n.op == "placeholder"]
    known: dict[str, torch.Tensor] = {placeholders[i].name: inputs[i] for i in constants}
    for node in aten_gm.graph.nodes:
        if node.op == "get_attr":
            value = getattr(aten_gm, node.target)
            if isinstance(value, torch.Tensor):
                known[node.name] = value

    parent = _partition(aten_gm)
    for node in parent.graph.nodes:
        if node.op == "call_function":
            report.left_in_torch[str(node.target)] = report.left_in_torch.get(str(node.target), 0) + 1
    parts = [n for n in parent.graph.nodes if n.op == "call_module"
             and n.target.startswith("fused_")]
    if not parts:
        raise GraphsubError("no operator of this graph is one graphsub models")
    names = {p.target for p in parts}
    captured = [_capture_part_inputs(parent, c, names) for c in checks]

    from graphsub.targets import get_target
    from graphsub.pipeline import load_rule_files

    target = get_target(target_name)
    assert isinstance(target, TorchTarget)  # the backend's targets: torch-cpu, torch-cuda
    rules = load_rule_files(list(opts.rules or []))
    for note in rules.notes:  # a rule file's rule used in a library rule's place, say
        warnings.warn(f"graphsub: {note}", GraphsubWarning, stacklevel=3)
    if opts.fission:
        # Checked numerically on a fresh install (seconds): here, not out of the first part's
        # time limit, which it used up (a float16 decoder's first compilation on an H200
        # found nothing to rewrite).
        fission_stage.load_rules()
    sizes = {p.target: sum(1 for n in getattr(parent, p.target).graph.nodes
                           if n.op == "call_function") for p in parts}
    total = max(sum(sizes.values()), 1)
    # The optimized graph shares the original's weights and parts until a part is replaced;
    # the original stays whole as the reference for the end-to-end check.
    optimized = fx.GraphModule(parent, copy.deepcopy(parent.graph))
    normal = fx.GraphModule(parent, copy.deepcopy(parent.graph))
    replaced: list[tuple[str, PartReport]] = []
    normal_parts: list[str] = []
    for part in parts:
        sub: fx.GraphModule = getattr(parent, part.target)
        part_constants = {}
        sub_placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
        for ph, arg in zip(sub_placeholders, part.args):
            if isinstance(arg, fx.Node) and arg.op in ("placeholder", "get_attr") \
                    and arg.name in known:
                part_constants[ph] = known[arg.name]
        budget = opts.time_limit * sizes[part.target] / total
        try:
            outcome = _optimize_part(
                _Part(sub, [c[part.target] for c in captured], part_constants,
                      sub_placeholders), target, rules, opts.settings(target, budget), opts,
                profile)
        except _restart_analysis():
            raise
        except Exception as exc:  # noqa: BLE001 - one part stays as captured, not the graph
            outcome = _part_failed(exc)
        report.parts.append(outcome.report)
        if outcome.module is not None:
            setattr(optimized, part.target, outcome.module)
            replaced.append((part.target, outcome.report))
        if outcome.normal_form is not None:
            setattr(normal, part.target, outcome.normal_form)
            normal_parts.append(part.target)
    optimized.recompile()
    normal.recompile()
    _undo_until_equal(parent, optimized, replaced, checks, constants, opts.rtol)
    if normal_parts and disagreement(parent, normal, checks, _varied(checks, constants),
                                     opts.rtol) is not None:
        normal_parts = []
    if not (replaced or normal_parts):  # nothing changed: what the user would have had
        report.chosen = opts.baseline_name
        return baseline, report
    contenders = _contenders(optimized, normal if normal_parts else None, replaced,
                             normal_parts, example_inputs, constants, writes, opts, target,
                             report)
    # without a race: the search's graph, handed on to inductor where asked
    compiled = next((contenders[name] for name in ("graphsub+inductor", "graphsub",
                                                   "normal form+inductor", "normal form")
                     if name in contenders), baseline)
    if opts.race and contenders:
        speedups = {}
        for name, fn in contenders.items():
            try:
                speedups[name] = _speedup(fn, baseline, PrivateInputs(inputs, writes),
                                          target.torch_device)
            except Exception as exc:  # noqa: BLE001 - one contender, not the graph
                _drop(report, name, exc)
        report.race = {name: round(x.speedup, 4) for name, x in speedups.items()}
        if not speedups:
            report.chosen = opts.baseline_name
            return baseline, report
        best = max(speedups, key=lambda name: speedups[name].speedup)
        report.speedup = speedups[best].speedup
        faster = speedups[best].decision is Decision.FASTER
        for other in race_inputs[1:] if faster else ():
            # not slower at the other sizes either (decided with no margin, as the
            # optimizer's profile shapes are)
            there = _speedup(contenders[best], baseline, PrivateInputs(other, writes),
                             target.torch_device, min_gain=0.0)
            varied = [other[i] for i in _varied([other], constants)]
            report.race[f"{best} at {shapes(varied)}"] = round(there.speedup, 4)
            faster = there.decision is not Decision.NOT_FASTER
        if not faster:
            report.chosen = opts.baseline_name
            return baseline, report
        report.chosen, compiled = best, contenders[best]
    if writes:
        problem = _writes_disagree(gm, compiled, PrivateInputs(inputs, writes), opts.rtol)
        if problem is not None:
            warnings.warn(f"graphsub: this graph runs unoptimized: with its writes into its "
                          f"inputs, the optimized graph disagreed with the original ({problem})",
                          GraphsubWarning, stacklevel=3)
            report.fallback = f"end-to-end verification with the graph's writes: {problem}"
            report.chosen = opts.baseline_name
            return baseline, report
    return compiled, report


def _writes_disagree(original: fx.GraphModule, compiled: Callable[..., Any],
                     inputs: PrivateInputs, rtol: float) -> str | None:
    """Where the module handed back, run as the user will run it (writes included, on
    private copies), differs from the captured graph in its outputs or in what it leaves in
    the inputs it writes (None: nowhere)."""
    return compared(returning_writes(original.forward, inputs.writes),
                    returning_writes(compiled, inputs.writes), inputs.fresh(), rtol)


def _drop(report: CompileReport, name: str, exc: BaseException) -> None:
    """A way of running the graph that failed (to compile, to be captured in a CUDA graph,
    to run) leaves the race with a warning; the others race on."""
    if isinstance(exc, _restart_analysis()):
        raise exc
    report.dropped[name] = f"{type(exc).__name__}: {exc}"[:500]
    warnings.warn(f"graphsub: {name} was left out of the race: it failed with "
                  f"{report.dropped[name]}", GraphsubWarning, stacklevel=3)


def _contenders(optimized: fx.GraphModule, normal: fx.GraphModule | None,
                replaced: Sequence[tuple[str, PartReport]], normal_parts: Sequence[str],
                example_inputs: Sequence[Any], constants: Sequence[int], writes: Writes,
                opts: BackendOptions, target: TorchTarget, report: CompileReport
                ) -> dict[str, Callable[..., Any]]:
    """The ways of running the optimized graph that race the baseline: graphsub's module
    with the search's graphs ("graphsub") and with the normal forms' alone ("normal form":
    attention fused, nothing else rewritten, for a compiler whose fusions absorb the other
    rewrites), each handed on to inductor in the options' mode where asked
    ("...+inductor"), and run as it is (in CUDA graphs where the mode runs them): per-part
    measurements cannot see what inductor will make of either.

    With dynamic sizes inductor traces graphsub's parts over the symbols: only parts that are
    one program for every size can be traced so (a part lowered per size would pin
    inductor's graph to the example's sizes).

    The modules take the graph's writes into its inputs back as their last effect
    (side_effects.with_writes)."""
    cuda = target.torch_device.type == "cuda" and opts.cuda_graphs

    def own(module: fx.GraphModule) -> Callable[..., Any]:
        return CudaGraphed(module, constants, writes.positions) if cuda else module

    modules: dict[str, tuple[fx.GraphModule, Sequence[str]]] = {}
    if replaced:
        modules["graphsub"] = (with_writes(optimized, writes) if writes else optimized,
                               [name for name, _ in replaced])
    if normal is not None:
        modules["normal form"] = (with_writes(normal, writes) if writes else normal,
                                  normal_parts)
    contenders: dict[str, Callable[..., Any]] = {}
    for name, (module, names) in modules.items():
        if opts.inductor and all(getattr(module, n).one_program for n in names):
            try:
                contenders[f"{name}+inductor"] = _inductor(module, example_inputs, opts.mode)
            except Exception as exc:  # noqa: BLE001 - one contender, not the graph
                _drop(report, f"{name}+inductor", exc)
        contenders[name] = own(module)
    return contenders


def _trace_static(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> fx.GraphModule:
    """The graph at the ATen level at the example's sizes, views functionalized."""
    from torch.fx.experimental.proxy_tensor import make_fx

    with torch.no_grad():
        aten_gm = make_fx(torch.func.functionalize(gm, remove="mutations_and_views"),
                          decomposition_table={})(*example_inputs)
    aten_gm.graph.eliminate_dead_code()  # unused outputs: batch norm's statistics, ...
    aten_gm.recompile()
    return aten_gm


def propagate_shapes(gm: fx.GraphModule, args: Sequence[Any]) -> None:
    """Each node's `tensor_meta` from running the graph on these real inputs. (torch's
    ShapeProp runs in the fake mode of the compilation under way, where static inputs meet
    dynamo's size symbols and would pin them to the example's values.)"""
    from torch.fx.node import map_aggregate
    from torch.fx.passes.shape_prop import _extract_tensor_metadata

    class Recorder(fx.Interpreter):
        def run_node(self, n: fx.Node) -> Any:
            result = super().run_node(n)
            tensors: list[torch.Tensor] = []

            def record(r: Any) -> Any:
                if not isinstance(r, torch.Tensor):
                    return r
                tensors.append(r)
                return _extract_tensor_metadata(r)

            meta = map_aggregate(result, record)
            if tensors:
                n.meta["tensor_meta"] = meta
                n.meta["device"] = str(tensors[0].device)
            return result

    with torch.no_grad():
        Recorder(gm).run(*args)


def _runnable_inputs(gm: fx.GraphModule, example: list[Any], bindings: list[dict[str, int]],
                     constants: Sequence[int]) -> list[list[Any]]:
    """The graph's inputs at each of these sizes where the original graph runs (a model may
    be defined for fewer sizes than torch.compile's ranges say: a table of 512 positions)."""
    gen = torch.Generator().manual_seed(0)
    out = []
    for binding in bindings:
        args = inputs_at(gm, example, binding, constants, gen)
        try:
            with torch.no_grad():
                gm(*args)
        except Exception:  # noqa: BLE001 - not defined at these sizes: nothing to check there
            log.info("the graph does not run at %s: not checked there", binding)
            continue
        out.append(args)
    return out


def _binding_of(gm: fx.GraphModule, args: Sequence[Any]) -> dict[str, int]:
    """The symbols' values these inputs give (for the report)."""
    out: dict[str, int] = {}
    for node, arg in zip(gm.graph.find_nodes(op="placeholder"), args):
        val = node.meta.get("val")
        dims = [(val, arg)] if isinstance(val, torch.SymInt) else \
            list(zip(val.shape, arg.shape)) if isinstance(val, torch.Tensor) else []
        for d, given in dims:
            if isinstance(d, torch.SymInt) and d.node.expr.is_Symbol:
                out[d.node.expr.name] = int(given)
    return out


def _undo_until_equal(original: fx.GraphModule, optimized: fx.GraphModule,
                      replaced: list[tuple[str, PartReport]], checks: Sequence[Sequence[Any]],
                      constants: Sequence[int], rtol: float) -> None:
    """Check the assembled graph end to end, since each part was checked alone and the torch
    code between parts sees only their outputs' values; put original parts back, the last
    first, until it agrees with the original on every set of inputs in `checks`."""
    varied = _varied(checks, constants)
    problem = disagreement(original, optimized, checks, varied, rtol)
    while problem is not None and replaced:
        name, part_report = replaced.pop()
        part_report.kept = f"end-to-end verification: {problem}"
        warnings.warn(f"graphsub: kept a part of the graph as it was: with it, the whole graph "
                      f"disagreed with the original ({problem})", GraphsubWarning, stacklevel=4)
        setattr(optimized, name, getattr(original, name))
        optimized.recompile()
        problem = disagreement(original, optimized, checks, varied, rtol)


def _varied(checks: Sequence[Sequence[Any]], constants: Sequence[int]) -> list[int]:
    """The positions of the graph's inputs that are not parameters: what checks draw anew."""
    return [i for i in range(len(checks[0])) if i not in set(constants)]


def _constant_positions(gm: fx.GraphModule, example_inputs: Sequence[torch.Tensor]) -> list[int]:
    """Which inputs are the module's parameters and buffers (dynamo passes them as inputs,
    naming them after where they live)."""
    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    out = []
    for i, (name, t) in enumerate(zip(names, example_inputs)):
        if isinstance(t, torch.nn.Parameter) or "_parameters_" in name or "_buffers_" in name:
            out.append(i)
    return out


class _Support(OperatorSupportBase):
    """The partitioner's question: can graphsub express this node?"""

    def is_node_supported(self, submodules: Any, node: fx.Node) -> bool:
        return unsupported_reason(node) is None


def _partition(gm: fx.GraphModule) -> fx.GraphModule:
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner

    partitioner = CapabilityBasedPartitioner(gm, _Support(), allows_single_node_partition=True)
    return partitioner.fuse_partitions(partitioner.propose_partitions())


def _capture_part_inputs(parent: fx.GraphModule, example_inputs: Sequence[torch.Tensor],
                         names: set[str]) -> dict[str, list[Any]]:
    """The real arguments each part receives when the graph runs on the example inputs."""
    captured: dict[str, list[Any]] = {}

    class Recorder(fx.Interpreter):
        def call_module(self, target: Any, args: Any, kwargs: Any) -> Any:
            if target in names:
                captured[target] = list(args)
            return super().call_module(target, args, kwargs)

    with torch.no_grad():
        Recorder(parent).run(*example_inputs)
    return captured


def program_inputs(args: Sequence[Any], positions: Sequence[int],
                   device: torch.device) -> list[Any]:
    """The arguments of a part that its graphsub program takes, in its inputs' order: the
    tensors as they are, a size (an int, or a SymInt while torch traces) as the empty tensor
    of that length that carries it (fx_import._size_carriers)."""
    return [args[i] if isinstance(args[i], torch.Tensor) else
            torch.empty(args[i], dtype=torch.uint8, device=device) for i in positions]


class GraphsubPart(torch.nn.Module):
    """An optimized part: takes the part's arguments, feeds the non-constant ones to the
    graphsub program (parameters are baked into it), returns what the part returned, laid out
    as the original part laid it out.

    The layout matters because a rewrite changes it (a merged Q/K/V projection hands out
    slices of one product, a transposed product hands out a transposed view) while the ATen
    operators left in torch are the ones the dispatcher picked for the original layout: the
    CPU's flash attention, for one, computes garbage from operands whose last dimension is not
    contiguous instead of failing.

    With dynamic sizes the original's strides are expressions over the size symbols,
    computed once for each binding the part meets; a size argument the program reads as a
    carrier (fx_import.SIZE_CARRIER_DTYPE) is handed in as an empty tensor of that length."""

    def __init__(self, program: Any, positions: Sequence[int], single: bool,
                 strides: Sequence[tuple[Any, ...] | None], device: torch.device) -> None:
        super().__init__()
        self.program = program.module
        self.device = device
        self._sizes = program if program.sources else None  # reads the symbols' values
        self.positions = list(positions)
        self.single = single
        self.strides = list(strides)
        self._strides_at: dict[tuple[int, ...], list[tuple[int, ...] | None]] = {}

    @property
    def one_program(self) -> bool:
        """Whether one program serves every size (so that torch can trace this part with
        dynamic sizes, as inductor does), rather than one lowering per size."""
        return not isinstance(self._sizes, SizedTorchProgram)

    def forward(self, *args: Any) -> Any:
        inputs = program_inputs(args, self.positions, self.device)
        strides = self.strides
        if self._sizes is not None:
            sizes = symbol_values(self._sizes.sources, inputs)
            if any(isinstance(v, torch.SymInt) for v in sizes.values()):  # traced by torch
                strides = [None if s is None else tuple(evaluate_size(d, sizes) for d in s)
                           for s in self.strides]
            else:
                key = tuple(sizes.values())
                if key not in self._strides_at:
                    self._strides_at[key] = [None if s is None else bind_all(s, sizes)
                                             for s in self.strides]
                strides = self._strides_at[key]
        outs = self.program(*inputs)
        outs = [restrided(o, s) for o, s in zip(outs, strides)]
        return outs[0] if self.single else tuple(outs)


def _output_strides(sub: fx.GraphModule, args: list[Any]) -> list[tuple[Any, ...] | None]:
    """The strides of what the original part returns (None where an output is not a tensor
    or is broadcast, which a fresh tensor cannot reproduce): on the example arguments, or as
    size expressions where the part was traced with dynamic sizes."""
    output = next(n for n in sub.graph.nodes if n.op == "output")
    results = output.args[0] if isinstance(output.args[0], (tuple, list)) else (output.args[0],)
    vals = [r.meta.get("val") if isinstance(r, fx.Node) else None for r in results]
    if any(isinstance(v, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in v.shape)
           for v in vals):
        outs: Sequence[Any] = vals
    else:
        with torch.no_grad():
            outs = sub(*args)
        outs = outs if isinstance(outs, (tuple, list)) else (outs,)
    strides: list[tuple[Any, ...] | None] = []
    for o in outs:
        if not isinstance(o, torch.Tensor):
            strides.append(None)
            continue
        shape = [symbolic_size(d) for d in o.shape]
        stride = tuple(symbolic_size(d) for d in o.stride())
        broadcast = any(step == 0 and n != 1 for n, step in zip(shape, stride))
        strides.append(None if broadcast else stride)
    return strides


@dataclass
class _Part:
    """A captured part: its FX graph, the arguments it received on each set of inputs the
    graph is checked on (the example's first), the constant ones by placeholder, and its
    placeholders in order."""

    sub: fx.GraphModule
    checks: list[list[Any]]
    constants: dict[fx.Node, torch.Tensor]
    placeholders: list[fx.Node]


@dataclass
class _PartOutcome:
    """A part optimized: graphsub's module of the search's graph and of the normal form alone
    (None where it stays as it was, or the normal form changed nothing or is the search's
    graph too), and the report."""

    module: GraphsubPart | None
    normal_form: GraphsubPart | None
    report: PartReport


def _optimize_part(part: _Part, target: TorchTarget, rules: RuleSet, settings: Settings,
                   opts: BackendOptions, profile: Sequence[dict[str, int]]) -> _PartOutcome:
    """One part through the pipeline's stages (search, fission and the race between their
    graphs), then checked against the original part. With dynamic sizes, costs are measured
    at the `profile`'s sizes (the example's first)."""

    example = part.checks[0]
    propagate_shapes(part.sub, example)
    try:
        graph, inputs = convert_graph(part.sub.graph, part.constants)
        if is_symbolic_graph(graph):
            symbol_sources(graph)  # each size must be read from an input
            shapes = {tuple(sorted((n, b[n]) for n in graph.facts.symbols)): None
                      for b in profile}  # in order, without repeats
            settings = settings.replace(shape_profile=tuple(
                ProfileShape.of(dict(shape)) for shape in shapes))
    except (ConversionError, GraphsubError, KeyError) as exc:
        return _PartOutcome(None, None, PartReport(0, {}, 0.0, 0.0, 0.0,
                                                   kept=f"conversion: {exc}"))
    positions = [part.placeholders.index(n) for n in inputs]
    # Generated kernels only where graphsub's program runs them: a graph handed on to
    # inductor is compiled whole by it.
    context = start_run(graph, settings, rules,
                        Budget(settings.time_limit, fission=settings.fission, measuring=False),
                        generate_kernels=not opts.inductor,
                        example_inputs=program_inputs(example, positions, target.torch_device),
                        warning=GraphsubWarning)
    found = run_stage(context, SEARCH)
    programs = _Programs(target, profile[0] if profile else None)
    fission_won = False
    if settings.fission:
        found = run_stage(context, FISSION, found)
        fission_won = run_stage(context, _race(programs), found)
    result = found.result
    report = PartReport(len(graph), dict(result.rules_used()), result.initial_cost,
                        result.final_cost, result.stats.seconds)
    best = result.graph
    if found.fission is not None:
        report.fission = {**found.fission.as_dict(), "kept": fission_won}
        if fission_won:
            best, report.predicted_after = found.fission.graph, found.fission.cost
    normal, steps = (found.normal_form, found.normal_steps) if found.normal_form is not None \
        else normal_form(graph, context.normal_form_rules, found.cost_model)
    report.notes = found.cost_model.notes()
    output = next(n for n in part.sub.graph.nodes if n.op == "output")
    single = not isinstance(output.args[0], (tuple, list))
    strides = _output_strides(part.sub, example)

    def module_of(g: Any) -> GraphsubPart:
        return GraphsubPart(programs.of(g), positions, single, strides, target.torch_device)

    normal_module = None
    if steps and normal.structural_hash() != best.structural_hash():
        normal_module = module_of(normal)
        if disagreement(part.sub, normal_module, part.checks, positions, opts.rtol) is not None:
            normal_module = None
    module = module_of(best)
    problem = disagreement(part.sub, module, part.checks, positions, opts.rtol)
    if problem is not None:
        report.kept = f"verification: {problem}"
        warnings.warn(f"graphsub: kept a part of the graph as it was: {problem}", GraphsubWarning,
                      stacklevel=3)
        return _PartOutcome(None, normal_module, report)
    return _PartOutcome(module, normal_module, report)


def _part_failed(exc: BaseException) -> _PartOutcome:
    """A part whose optimization failed anywhere (conversion, search, building its program)
    stays in torch as captured, with the reason in its report and a warning; the graph's
    other parts are optimized as if it had been left in torch from the start."""
    reason = f"{type(exc).__name__}: {exc}"[:500]
    log.info("a part stays as captured: %s", reason, exc_info=exc)
    warnings.warn(f"graphsub: kept a part of the graph as it was: optimizing it failed "
                  f"({reason})", GraphsubWarning, stacklevel=3)
    return _PartOutcome(None, None, PartReport(0, {}, 0.0, 0.0, 0.0, kept=f"failed: {reason}"))


class _Programs:
    """graphsub's torch program of each graph a part may become, built once (lowering every
    node, and compiling the kernels inductor generates for it, takes seconds): the race
    between the search's and fission's graphs and the module the part becomes run the same
    programs, built for the part's reference sizes."""

    def __init__(self, target: TorchTarget, reference: Mapping[str, int] | None) -> None:
        self.target, self.reference = target, reference
        self._built: dict[str, Any] = {}

    def of(self, graph: Graph) -> Any:
        key = graph.structural_hash()
        if key not in self._built:
            self._built[key] = self.target.program(graph, reference=self.reference)
        return self._built[key]


def _race(programs: _Programs) -> Stage[[Found], bool]:
    """The race stage of one part, on its programs. After a Ctrl-C, fission did not run: the
    search's graph stays."""

    def race_fission(context: RunContext, clock: StageClock, found: Found) -> bool:
        """Whether fission's graph replaces the search's: only where it is predicted cheaper
        and graphsub's program of it runs faster on the part's inputs (per-operator timings
        can prefer a library kernel, attention, that is slower end to end than what it
        replaces). The race's seconds (RACE_SECONDS at most, while undecided) come on top of
        the part's time limit."""
        result, outcome = found.result, found.fission
        if outcome is None or not outcome.cost < result.final_cost:
            return False
        assert context.example_inputs is not None  # a part's run: torch.compile's inputs
        return _runs_faster(programs.of(outcome.graph), programs.of(result.graph),
                            programs.target, context.example_inputs)

    return Stage("race", race_fission, skipped=lambda found: False)


#: A race between two ways of running the same graph (verdicts.speedup.sequential, one call of
#: each per round in alternating order) goes on while undecided until RACE_SECONDS have passed
#: (or its first block's time, for a graph too slow for MIN_ROUNDS rounds in RACE_SECONDS).
RACE_SECONDS = 3.0


def _speedup(challenger: Callable[..., Any], incumbent: Callable[..., Any],
             inputs: PrivateInputs, device: torch.device, **decide: Any) -> HeadToHead:
    """The challenger against the incumbent on `inputs`, decided as the optimizer decides
    (verdicts.speedup: the median round's speedup, above 1 when the challenger is faster, its
    interval, and whether that clears MIN_GAIN), so that a slow spell of this machine hits
    both alike and a tie is never called a win. Each runs on inputs of its own, the tensors
    it writes put back as they were before every call, outside its time."""
    sync = torch.cuda.synchronize if device.type == "cuda" else None
    timers = []
    for fn in (incumbent, challenger):
        args = inputs.fresh()
        call: Callable[..., object] = lambda fn=fn, args=args: fn(*args)
        timers.append(CallTimer(call, sync, setup=inputs.restorer(args)))
    # no_grad, not inference_mode: tensors a first call makes (CUDA-graph trees' static
    # buffers) would be inference tensors, which the user's later calls outside inference
    # mode cannot write into
    with torch.no_grad():
        for timer in timers:  # first calls may compile or allocate
            timer.timed(1)
        once = max(timer.timed(1)[0] for timer in timers)  # the pace
        deadline = time.perf_counter() + max(RACE_SECONDS, 2 * MIN_ROUNDS * once)
        _, result = sequential(timers[0], timers[1], {}, deadline, warmup=0, block=1, pause=0.0,
                               **decide)
    return result


def _runs_faster(candidate: Any, incumbent: Any, target: TorchTarget, inputs: Sequence[Any]
                 ) -> bool:
    """Whether graphsub's program `candidate` runs faster than the program `incumbent` on the
    part's inputs: per-operator timings can prefer a library kernel (attention) that is slower
    end to end than what it replaces."""
    return _speedup(candidate.module, incumbent.module, PrivateInputs(inputs, Writes()),
                    target.torch_device).decision is Decision.FASTER
