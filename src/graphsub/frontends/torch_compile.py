"""`torch.compile(model, backend="graphsub")`: graphsub as a torch.compile backend.

For each graph torch.compile captures, the backend
0. finds the inputs it writes into (a static key/value cache, a counter: side_effects), before
   running anything: from here on it works on the graph without its writes, which changes
   nothing it runs on, and what writes runs only on private copies;
1. compiles it with inductor first (the baseline; its time sets what graphsub may add:
   `_Allowance`), then traces it to ATen operators (views functionalized, shapes recorded,
   each value's node of dynamo's graph noted: fx_origins) with the example inputs;
2. splits it into the parts graphsub can express and the rest (fx_partition): the rest stays
   as torch code, the parts become graphsub Graphs, parameters and buffers as weights
   (graphsub optimizes inference: like inductor's freezing, it assumes they do not change
   after compilation);
3. optimizes each part for the device the inputs are on (`torch-cuda` or `torch-cpu`): the
   library's normal form first, unpriced; then the search (the merge form its start where
   predicted cheaper) in what the allowance leaves it, under the cost of that device as
   inductor compiles it; then fission and kernel orchestration (graphsub.fission), whose graph
   replaces the search's where it is predicted cheaper and then runs faster, timed against it
   round by round;
4. splices each part's graph into dynamo's own graph (fx_splice: the graph edited, not
   rebuilt; its writes where the program makes them), the search's graphs and the normal
   forms' alone, each as only the rewritten nodes (for inductor) and as the whole part
   graphsub's (its own program), and checks each spliced graph end to end against the
   captured one, writes included, leaving parts that break it out (the last first);
5. races them, round by round on the example inputs, against what the user would have had
   without graphsub (the captured graph run eagerly, or compiled by inductor alone) and
   returns the faster: per-part measurements cannot see how inductor fuses across the parts'
   boundaries, and graphsub's result must never be slower than going without it. On models
   inductor does not speed up, graphsub's own program can be the fastest.

Nothing here ever fails the user's model: a graph graphsub cannot handle runs unchanged (with
a warning saying why).

    import torch, graphsub.frontends.torch_compile  # the entry point makes the import optional
    fast = torch.compile(model, backend="graphsub", options={"time_limit": 20})
    with torch.no_grad():
        fast(x)
"""

from __future__ import annotations

import contextlib
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

from graphsub.budget import Budget, StageClock
from graphsub.errors import ConversionError, GraphsubError
from graphsub.targets.torch.program import symbol_sources
from graphsub.targets.torch.target import TorchTarget
from graphsub.frontends.dynamic_trace import (has_dynamic_sizes, input_symbols, inputs_at,
                                              other_bindings, trace_dynamic)
from graphsub.frontends.cuda_graphs import CudaGraphed
from graphsub.fission import stage as fission_stage
from graphsub.frontends.fx_fold import fold_constants
from graphsub.frontends.fx_equivalence import compared, disagreement, shapes
from graphsub.frontends.fx_import import CausalMask, convert_graph, symbol_ranges
from graphsub.frontends.fx_position_masks import causal_masks
from graphsub.frontends.fx_origins import traced_with_origins
from graphsub.frontends.fx_partition import partition
from graphsub.frontends.fx_splice import Rewrite, splice
from graphsub.frontends.side_effects import (PrivateInputs, Writes, find_writes,
                                             returning_writes, without_writes)
from graphsub.ir.binding import is_symbolic_graph
from graphsub.ir.graph import Graph
from graphsub.pipeline import (FISSION, SEARCH, Found, RuleSet, RunContext, Settings, Stage,
                               run_stage, start_run)
from graphsub.rules.roles import Role, with_role
from graphsub.search.normal_form import first_normal_form, with_start
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

    #: Seconds graphsub may add to inductor's own first compilation of each captured graph,
    #: with OVERHEAD_SHARE of the two together: the search (over the graph's parts) takes
    #: what the contenders' compilations, the checks and the race leave of it (_Allowance).
    time_limit: float = 10.0
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
    #: The masks the graph builds from positions that z3 proved causal at every size
    #: (frontends.fx_position_masks), by node name: parts read them as `causal_mask`.
    causal_masks: list[str] = field(default_factory=list)

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

    return cast(type[BaseException], RestartAnalysis)


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
    started = time.perf_counter()
    baseline, opts = _baseline(gm, example_inputs, opts, report)
    allowance = _Allowance(opts.time_limit, time.perf_counter() - started, opts.inductor)
    report.cost, report.mode = opts.cost_model, (opts.mode or "default") if opts.inductor else ""
    hints: dict[str, int] = {}
    if dynamic:
        aten_gm, inputs, hints = trace_dynamic(gm, example_inputs)
    else:
        traced = traced_with_origins(gm, PrivateInputs(example_inputs, writes).fresh(),
                                     functional=True)
        aten_gm, inputs = without_writes(traced, writes), list(example_inputs)
    # (state the graph writes changes from call to call: never a constant)
    constants = [i for i in _constant_positions(gm, example_inputs)
                 if i not in writes.positions]
    optimized = optimize_traced(aten_gm, inputs, constants, hints if dynamic else None,
                                target_name, opts, report, allowance.search_seconds)
    outcomes, checks, race_inputs = optimized.outcomes, optimized.checks, optimized.race_inputs
    target, programs = optimized.target, optimized.programs
    check = _Check(gm, checks, _varied(checks, constants), writes, opts.rtol)
    contenders = _contenders(gm, outcomes, example_inputs, constants, writes, opts, target,
                             programs, check, report, allowance)
    if not contenders:  # nothing changed: what the user would have had, as captured
        report.chosen = opts.baseline_name
        return baseline, report
    # without a race: the search's graph, handed on to inductor where asked
    compiled = next((contenders[name] for name in ("graphsub+inductor", "graphsub",
                                                   "normal form+inductor", "normal form")
                     if name in contenders), baseline)
    if opts.race:
        speedups = {}
        for k, (name, fn) in enumerate(contenders.items()):
            try:
                speedups[name] = _speedup(fn, baseline, PrivateInputs(inputs, writes),
                                          target.torch_device,
                                          seconds=allowance.race_seconds(len(contenders) - k))
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
                             target.torch_device, seconds=allowance.race_seconds(1),
                             min_gain=0.0)
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


@dataclass
class TracedOptimized:
    """What `optimize_traced` made of a traced graph: each part's outcome (in the parent's
    order), the input sets the result is checked on (the example's first) and raced on, and
    the parts' programs (the splice lowers regions with them)."""

    outcomes: list[_PartOutcome]
    checks: list[list[Any]]
    race_inputs: list[list[Any]]
    programs: _Programs
    target: TorchTarget


def optimize_traced(aten_gm: fx.GraphModule, inputs: list[Any], constants: Sequence[int],
                    hints: dict[str, int] | None, target_name: str, opts: BackendOptions,
                    report: CompileReport, search_time: Callable[[float], float]
                    ) -> TracedOptimized:
    """Steps 2 and 3 for a graph traced to functional ATen operators (each node that is a node
    of the program being optimized marked so: fx_origins), shared by torch.compile's backend
    and torch.export's programs (frontends.exported): its constant inputs (`constants`:
    positions of parameters and buffers) folded, split into parts, each part optimized.
    `hints`: each size symbol's value in the example (None: static sizes); `search_time`
    turns the seconds of one call into the search's seconds."""
    dynamic = hints is not None
    hints = hints or {}
    placeholders = [n for n in aten_gm.graph.nodes if n.op == "placeholder"]
    fold_constants(aten_gm, {placeholders[i]: inputs[i] for i in constants})
    propagate_shapes(aten_gm, inputs)
    # (by name: partitioning rebuilds the graph; names survive it)
    masks = {node.name: mask for node, mask in
             causal_masks(aten_gm.graph, symbol_ranges(aten_gm.graph)).items()}
    report.causal_masks = sorted(masks)
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

    # (the masks no other proven mask reads: those an attention reads)
    parent = partition(aten_gm, [n for n in aten_gm.graph.nodes if n.name in masks and not any(
        user.name in masks for user in n.users)])
    for node in parent.graph.nodes:
        if node.op == "call_function":
            report.left_in_torch[str(node.target)] = report.left_in_torch.get(str(node.target), 0) + 1
    parts = [n for n in parent.graph.nodes if n.op == "call_module"
             and n.target.startswith("fused_")]
    if not parts:
        raise GraphsubError("no operator of this graph is one graphsub models")
    names = {p.target for p in parts}
    run_started = time.perf_counter()
    captured = [_capture_part_inputs(parent, c, names) for c in checks]
    call_seconds = (time.perf_counter() - run_started) / len(checks)  # one call, about

    from graphsub.targets import get_target
    from graphsub.pipeline import load_rule_files

    target = get_target(target_name)
    assert isinstance(target, TorchTarget)  # the backend's targets: torch-cpu, torch-cuda
    rules = load_rule_files(list(opts.rules or []))
    for note in rules.notes:  # a rule file's rule used in a library rule's place, say
        warnings.warn(f"graphsub: {note}", GraphsubWarning, stacklevel=3)
    if opts.fission:
        # Read here, not out of the first part's time limit (checked numerically on a fresh
        # install once, they used it up: a float16 decoder's first compilation on an H200
        # found nothing to rewrite).
        fission_stage.preload_rules()
    sizes = {p.target: sum(1 for n in getattr(parent, p.target).graph.nodes
                           if n.op == "call_function") for p in parts}
    total = max(sum(sizes.values()), 1)
    search_seconds = search_time(call_seconds)
    programs = _Programs(target)
    outcomes: list[_PartOutcome] = []
    for part in parts:
        sub: fx.GraphModule = getattr(parent, part.target)
        part_constants = {}
        sub_placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
        for ph, arg in zip(sub_placeholders, part.args):
            if isinstance(arg, fx.Node) and arg.op in ("placeholder", "get_attr") \
                    and arg.name in known:
                part_constants[ph] = known[arg.name]
        part_masks = {ph: masks[arg.name] for ph, arg in zip(sub_placeholders, part.args)
                      if isinstance(arg, fx.Node) and arg.name in masks}
        part_masks.update({n: masks[n.name] for n in sub.graph.nodes
                           if n.op == "call_function" and n.name in masks})
        budget = search_seconds * sizes[part.target] / total
        try:
            outcome = _optimize_part(
                _Part(sub, [c[part.target] for c in captured], part_constants,
                      sub_placeholders, parent, dict(zip(sub_placeholders, part.args)),
                      part_masks),
                target, rules, opts.settings(target, budget), opts, profile, programs)
        except _restart_analysis():
            raise
        except Exception as exc:  # noqa: BLE001 - one part stays as captured, not the graph
            outcome = _part_failed(exc)
        report.parts.append(outcome.report)
        outcomes.append(outcome)
    return TracedOptimized(outcomes, checks, race_inputs, programs, target)


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


def _contenders(gm: fx.GraphModule, outcomes: Sequence[_PartOutcome],
                example_inputs: Sequence[Any], constants: Sequence[int], writes: Writes,
                opts: BackendOptions, target: TorchTarget, programs: _Programs,
                check: _Check, report: CompileReport, allowance: _Allowance
                ) -> dict[str, Callable[..., Any]]:
    """The ways of running the optimized graph that race the baseline, each dynamo's graph
    with the parts' rewrites spliced in (fx_splice): the search's graphs ("graphsub") and
    the normal forms' alone ("normal form": attention fused, nothing else rewritten, for a
    compiler whose fusions absorb the other rewrites); handed on to inductor in the
    options' mode where asked ("...+inductor": only the rewritten nodes spliced, the rest as
    captured), and as graphsub's own program (every converted part graphsub's, its library
    kernels; in CUDA graphs where the mode runs them): per-part measurements cannot see
    what inductor will make of either. Each is checked end to end against the captured
    graph, writes included, parts that break it left out (the last first). Parts the
    search's splice leaves out say why in their reports. A contender inductor would compile
    after the allowance is spent is left out (the report's `dropped` says so), but the first
    (the search's graph, or the normal form where the search's failed its checks)."""
    cuda = target.torch_device.type == "cuda" and opts.cuda_graphs
    contenders: dict[str, Callable[..., Any]] = {}
    for label, normal in (("graphsub", False), ("normal form", True)):
        chosen = [(k, rw) for k, o in enumerate(outcomes)
                  if (rw := o.normal_form if normal else o.rewrite) is not None]
        if not chosen:
            continue
        ways = ([(f"{label}+inductor", False)] if opts.inductor else []) + [(label, True)]
        for name, whole in ways:
            module, left_out = _verified_splice(gm, [rw for _, rw in chosen], whole,
                                                programs, writes, check)
            for position, why in left_out.items():
                part = report.parts[chosen[position][0]]
                if label == "graphsub" and not part.kept:
                    part.kept = why
                    warnings.warn(f"graphsub: kept a part of the graph as it was: {why}",
                                  GraphsubWarning, stacklevel=3)
            if module is None:
                continue
            if whole:
                contenders[name] = CudaGraphed(module, constants, writes.positions) if cuda \
                    else module
                continue
            if contenders and not allowance.fits_compilation():  # (the first is compiled)
                report.dropped[name] = (f"not compiled: the time limit's allowance was spent "
                                        f"({allowance.describe()})")
                continue
            try:
                compiling = time.perf_counter()
                contenders[name] = _inductor(module, example_inputs, opts.mode)
                allowance.compiled(time.perf_counter() - compiling)
            except Exception as exc:  # noqa: BLE001 - one contender, not the graph
                _drop(report, name, exc)
    return contenders


@dataclass(frozen=True)
class _Check:
    """The end-to-end check of a spliced graph against the captured one: on the example
    inputs and the sets at other sizes (`checks`), and on random values at the `varied`
    positions; what the graph writes into its inputs compared too, on private copies."""

    original: fx.GraphModule
    checks: Sequence[Sequence[Any]]
    varied: Sequence[int]
    writes: Writes
    rtol: float

    def problem(self, optimized: fx.GraphModule) -> str | None:
        return disagreement(returning_writes(self.original.forward, self.writes),
                            returning_writes(optimized.forward, self.writes), self.checks,
                            self.varied, self.rtol)


def _verified_splice(gm: fx.GraphModule, rewrites: Sequence[Rewrite], whole: bool,
                     programs: _Programs, writes: Writes, check: _Check
                     ) -> tuple[fx.GraphModule | None, dict[int, str]]:
    """dynamo's graph with the rewrites spliced in and checked end to end: rewrites that
    cannot be spliced, then (the last first) those with which the graph disagrees with the
    original, are left out (by position, with why). None: none is left."""
    left_out: dict[int, str] = {}
    kept = list(range(len(rewrites)))
    while kept:
        spliced = splice(gm, [rewrites[i] for i in kept], programs.of, whole)
        for j, why in spliced.failed.items():
            left_out[kept[j]] = f"splice: {why}"
        kept = [i for i in kept if i not in left_out]
        if not spliced.count:
            break
        problem = check.problem(spliced.module)
        if problem is None:
            return spliced.module, left_out
        left_out[kept.pop()] = f"end-to-end verification: {problem}"
    return None, left_out


def propagate_shapes(gm: fx.GraphModule, args: Sequence[Any]) -> None:
    """Each node's `tensor_meta` from running the graph on these real inputs. (torch's
    ShapeProp runs in the fake mode of the compilation under way, where static inputs meet
    dynamo's size symbols and would pin them to the example's values.)"""
    from torch.fx.node import map_aggregate
    from torch.fx.passes.shape_prop import _extract_tensor_metadata

    # (torch absent, its classes are Any: the ignore is for mypy without the extras)
    class Recorder(fx.Interpreter):  # type: ignore[misc, unused-ignore]
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


def _varied(checks: Sequence[Sequence[Any]], constants: Sequence[int]) -> list[int]:
    """The positions of the graph's inputs that are not parameters: what checks draw anew.
    A one-number tensor is kept as given: dynamo lifts Python numbers of the model into
    such inputs (a dropout probability, which must stay in [0, 1] even where dropout is
    off)."""
    fixed = set(constants)
    return [i for i, x in enumerate(checks[0]) if i not in fixed
            and not (isinstance(x, torch.Tensor) and x.dim() == 0)]


def _constant_positions(gm: fx.GraphModule, example_inputs: Sequence[torch.Tensor]) -> list[int]:
    """Which inputs are the module's parameters and buffers (dynamo passes them as inputs,
    naming them after where they live)."""
    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    out = []
    for i, (name, t) in enumerate(zip(names, example_inputs)):
        if isinstance(t, torch.nn.Parameter) or "_parameters_" in name or "_buffers_" in name:
            out.append(i)
    return out


def _capture_part_inputs(parent: fx.GraphModule, example_inputs: Sequence[torch.Tensor],
                         names: set[str]) -> dict[str, list[Any]]:
    """The real arguments each part receives when the graph runs on the example inputs."""
    captured: dict[str, list[Any]] = {}

    # (torch absent, its classes are Any: the ignore is for mypy without the extras)
    class Recorder(fx.Interpreter):  # type: ignore[misc, unused-ignore]
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


@dataclass
class _Part:
    """A captured part: its FX graph, the arguments it received on each set of inputs the
    graph is checked on (the example's first), the constant ones by placeholder, its
    placeholders in order, the traced graph it was cut from with the node of it each
    placeholder is, and the placeholders that are masks proven causal."""

    sub: fx.GraphModule
    checks: list[list[Any]]
    constants: dict[fx.Node, torch.Tensor]
    placeholders: list[fx.Node]
    owner: fx.GraphModule
    arguments: dict[fx.Node, fx.Node]
    masks: dict[fx.Node, CausalMask]


@dataclass
class _PartOutcome:
    """A part optimized: the rewrites to splice for it, the search's (or fission's) graph
    (None where the part stays as it was) and the normal form alone (None where it changed
    nothing or is the search's graph too), and the report."""

    rewrite: Rewrite | None
    normal_form: Rewrite | None
    report: PartReport


def _optimize_part(part: _Part, target: TorchTarget, rules: RuleSet, settings: Settings,
                   opts: BackendOptions, profile: Sequence[dict[str, int]],
                   programs: _Programs) -> _PartOutcome:
    """One part through the pipeline's stages: the library's normal form first, unpriced
    (search.normal_form.first_normal_form: the rewrites to fused kernels the device has
    never wait on pricing), then the search from it, fission and the race between their
    graphs. With dynamic sizes, costs are measured at the `profile`'s sizes (the
    example's first). The part's report predicts costs from the normal form on."""

    example = part.checks[0]
    propagate_shapes(part.sub, example)
    try:
        converted = convert_graph(part.sub.graph, part.constants, masks=part.masks)
        graph = converted.graph
        if is_symbolic_graph(graph):
            symbol_sources(graph)  # each size must be read from an input
            shapes = {tuple(sorted((n, b[n]) for n in graph.facts.symbols)): None
                      for b in profile}  # in order, without repeats
            settings = settings.replace(shape_profile=tuple(
                ProfileShape.of(dict(shape)) for shape in shapes))
    except (ConversionError, GraphsubError, KeyError) as exc:
        return _PartOutcome(None, None, PartReport(0, {}, 0.0, 0.0, 0.0,
                                                   kept=f"conversion: {exc}"))
    positions = [part.placeholders.index(n) for n in converted.inputs]
    # each value by the traced node whose value it is (a part's input: the node of the
    # traced graph it was cut from, so that what computes it can be found there)
    sources = {value: part.arguments.get(node, node) for value, node in
               converted.sources.items()}
    normal, steps = first_normal_form(graph, with_role(rules.rules, Role.NORMAL_FORM))
    # Generated kernels only where graphsub's program runs them: a graph handed on to
    # inductor is compiled whole by it.
    context = start_run(normal, settings, rules,
                        Budget(settings.time_limit, fission=settings.fission, measuring=False),
                        generate_kernels=not opts.inductor,
                        example_inputs=program_inputs(example, positions, target.torch_device),
                        warning=GraphsubWarning)
    found = run_stage(context, SEARCH)
    reference = profile[0] if profile else None
    fission_won = False
    if settings.fission:
        found = run_stage(context, FISSION, found)
        fission_won = run_stage(context, _race(programs, reference), found)
    result = with_start(found.result, steps, found.result.initial_cost)
    report = PartReport(len(graph), dict(result.rules_used()), result.initial_cost,
                        result.final_cost, result.stats.seconds)
    best = result.graph
    if found.fission is not None:
        report.fission = {**found.fission.as_dict(), "kept": fission_won}
        if fission_won:
            best, report.predicted_after = found.fission.graph, found.fission.cost
    report.notes = found.cost_model.notes()
    # (the search's graph even where it rewrote nothing: graphsub's own program of the part,
    # its library kernels, is a contender of its own)
    searched = Rewrite(graph, best, sources, part.owner, reference)
    alone = Rewrite(graph, normal, sources, part.owner, reference) \
        if steps and normal.structural_hash() != best.structural_hash() else None
    return _PartOutcome(searched, alone, report)


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
    """graphsub's torch program of each graph, built once per size reference (lowering
    every node, and compiling the kernels inductor generates for it, takes seconds): the
    race between a part's search and fission graphs, and the regions spliced for the
    contenders (several times over where a part is left out), share them."""

    def __init__(self, target: TorchTarget) -> None:
        self.target = target
        self._built: dict[tuple[str, tuple[tuple[str, int], ...]], Any] = {}

    def of(self, graph: Graph, reference: Mapping[str, int] | None = None) -> Any:
        key = (graph.structural_hash(), tuple(sorted((reference or {}).items())))
        if key not in self._built:
            self._built[key] = self.target.program(graph, reference=reference)
        return self._built[key]


def _race(programs: _Programs, reference: Mapping[str, int] | None) -> Stage[[Found], bool]:
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
        return _runs_faster(programs.of(outcome.graph, reference),
                            programs.of(result.graph, reference),
                            programs.target, context.example_inputs)

    return Stage("race", race_fission, skipped=lambda found: False)


#: A race between two ways of running the same graph (verdicts.speedup.sequential, one call of
#: each per round in alternating order) goes on while undecided until RACE_SECONDS have passed
#: (or its first block's time, for a graph too slow for MIN_ROUNDS rounds in RACE_SECONDS),
#: fewer where the allowance has less left (_Allowance.race_seconds).
RACE_SECONDS = 3.0
#: What graphsub plans to add to inductor's own first compilation of a graph: the time limit,
#: and this share of the two together; the target is 20% (the whole first call within
#: inductor's + the limit + 20%), and planning to 15% leaves room for estimates a second off.
OVERHEAD_SHARE = 0.15
#: One compilation by inductor of a spliced graph, as a share of its compilation of the
#: captured graph (most of its kernels are the captured graph's, in inductor's cache by
#: then): 0.16-0.34 on 2-layer Llama and Qwen2 graphs (prefill; a decode step), cold caches,
#: 2-core AMD EPYC (bench/RESULTS.md, "Compilation time (issue 58, item 6)").
CONTENDER_SHARE = 0.3
#: Seconds kept after the search for checking the spliced graphs and the final race, at
#: least; more for a graph whose one call is slow (_Allowance.after_search).
CHECK_AND_RACE_SECONDS = 3.0
#: Seconds kept after the race: the check of what writes, handing the result back.
AFTER_RACE_SECONDS = 0.5
#: The search's least time, whatever the allowance (the normal form needs no time of its own).
MIN_SEARCH_SECONDS = 1.0


class _Allowance:
    """graphsub's time beyond inductor's own compilation of the captured graph, which it
    measures first: the time limit and OVERHEAD_SHARE of the two together, for tracing the
    graph, the search, splicing and checking, inductor's compilations of the contenders and
    the race. The search gets what is left after what is expected to follow it (at most the
    time limit); a compilation is expected to take what the last one took (before the first:
    CONTENDER_SHARE of inductor's own)."""

    def __init__(self, limit: float, baseline_seconds: float, inductor: bool) -> None:
        self.deadline = time.perf_counter() + limit + OVERHEAD_SHARE * (baseline_seconds + limit)
        self.limit, self.baseline_seconds, self.inductor = limit, baseline_seconds, inductor
        #: one compilation of a spliced graph by inductor, expected (inductor may compile the
        #: baseline when it is first called: its own time is then unknown, taken as a second)
        self.compilation = CONTENDER_SHARE * max(baseline_seconds, 1.0) if inductor else 0.0
        #: one call of the graph, once measured (search_seconds)
        self.call_seconds = 0.0

    def remaining(self) -> float:
        return self.deadline - time.perf_counter()

    def search_seconds(self, call_seconds: float) -> float:
        """The search's share: what is left after what comes after it (after_search) for a
        graph one call of which takes `call_seconds`."""
        self.call_seconds = call_seconds
        left = self.remaining() - self.after_search()
        return min(self.limit, max(MIN_SEARCH_SECONDS, left))

    def after_search(self) -> float:
        """What follows the search, expected: inductor's compilations of two contenders (the
        search's graph and the normal form's), the end-to-end checks of four spliced graphs
        (each runs the original and the splice on three sets of inputs), the races and the
        check of what writes."""
        checks = 4 * 6 * self.call_seconds
        return 2 * self.compilation + checks + self.races() + CHECK_AND_RACE_SECONDS

    def races(self) -> float:
        """Four races, each at least MIN_ROUNDS rounds of a call of each, or half a second."""
        return 4 * max(0.5, 2 * MIN_ROUNDS * self.call_seconds)

    def fits_compilation(self) -> bool:
        """Whether one more compilation leaves the races their time."""
        return self.remaining() > self.compilation + self.races() + AFTER_RACE_SECONDS

    def compiled(self, seconds: float) -> None:
        """A compilation took `seconds`: what the next is expected to take."""
        self.compilation = seconds

    def race_seconds(self, races_left: int) -> float:
        """A race's share of what is left, RACE_SECONDS at most."""
        left = self.remaining() - AFTER_RACE_SECONDS
        return min(RACE_SECONDS, max(left, 0.0) / max(races_left, 1))

    def describe(self) -> str:
        return (f"inductor's own compilation took {self.baseline_seconds:.1f} s; the limit is "
                f"{self.limit:g} s")


def _speedup(challenger: Callable[..., Any], incumbent: Callable[..., Any],
             inputs: PrivateInputs, device: torch.device, seconds: float = RACE_SECONDS,
             **decide: Any) -> HeadToHead:
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
        deadline = time.perf_counter() + max(seconds, 2 * MIN_ROUNDS * once)
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
