"""Run one ONNX model through every graphsub path and compare each with onnxruntime.

The reference is onnxruntime's CPU provider on the ORIGINAL model with every graph
optimization turned off (`models.run_reference`): onnxruntime's own rewrites have bugs of their
own (fusions that break valid models), and a reference that carries them would blame graphsub
for them. Every model graphsub writes is run the same way, so a difference is graphsub's.

Stages, each giving one `Outcome` per path:

- `roundtrip`: `graphsub.load` then `to_onnx_bytes`, unchanged.
- `search:<algorithm>`: `graphsub.optimize` with each search algorithm, the built-in rules
  plus TASO's, the analytic cost model; the best graph and every candidate exported and
  compared. A search that overruns its time limit by more than max(1 s, 10%) is a `timeout`.
- `fission`: the imported graph split into primitives (`graphsub.fission.fission`), and that
  graph orchestrated into onnxruntime's library kernels by Korch's program on analytic costs;
  both exported and compared.
- `numpy`, `torch-cpu`: the imported graph, and the best graph of each search (and of
  fission), run by graphsub's numpy reference evaluator (which the rule checker trusts) and
  its torch backend.
- `pipeline`: `graphsub.optimize_model` on the ort-cpu target (search, measure, choose,
  verify); the bytes it returns compared. Its own VerificationError is `caught`: graphsub
  refused to hand back a wrong model, which is right, but a candidate was wrong somewhere.

Statuses: `equal`; `wrong` (values beyond the optimizer's tolerances, or a different shape,
dtype, input or output); `error` (an exception); `timeout`; `refused` (a GraphsubError while
loading a model onnxruntime runs: graphsub imports unknown ops as opaque nodes, so this is
normally a bug); `caught`; `skipped` (the stage cannot run here: no torch, or torch has no
tensor for one of the model's values, a sequence or strings).
"""

from __future__ import annotations

import gc
import re
import time
import traceback
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache, partial
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from graphsub.targets import TargetUnavailableError, get_target
from graphsub.budget import Budget
from graphsub.errors import GraphsubError
from graphsub.fission import fission
from graphsub.fuzz.models import fuzz_sizes, other_sizes, random_inputs, run_reference
from graphsub.ir.graph import Graph
from graphsub.onnx_io import load, to_onnx_bytes
from graphsub.optimizer import optimize, optimize_model
from graphsub.pipeline import FISSION, Found, Settings, run_stage, start_run
from graphsub.pipeline.rule_sets import RuleSet
from graphsub.rules import Rule, builtin_rules, load_rules
from graphsub.runtime.check_sizes import ProfileShape
from graphsub.verdicts.equivalence import SAME_FUNCTION, ModelFn, Tolerance, compare_outputs
from graphsub.runtime.reference import evaluate
from graphsub.search import ALGORITHMS
from graphsub.search.result import Step, StopReason

#: TASO's rule file, next to the repository (../shared/data/taso/graph_subst.pb).
TASO_RULES = (Path(__file__).resolve().parents[3].parent / "shared" / "data" / "taso"
              / "graph_subst.pb")
STAGES = ("roundtrip", "search", "fission", "numpy", "torch-cpu", "pipeline")
DEFAULT_STAGES = ("roundtrip", "search", "fission", "numpy", "torch-cpu")
#: Every status an outcome can have, and those that are findings (caught and skipped are not).
STATUSES = ("equal", "wrong", "error", "timeout", "refused", "caught", "skipped")
FAILURES = ("wrong", "error", "timeout", "refused")
#: Input sets each comparison runs on.
TRIALS = 2
#: Seconds fission and orchestration get (Korch's program of a fuzzed model solves in less).
FISSION_SECONDS = 10.0

#: The kind of a wrong outcome whose values match the unchanged graph's export: the import
#: or export is wrong (the roundtrip stage shows it), not the stage that reported it.
INHERITED = "as roundtrip"
#: The kind of a search timeout that full garbage collections during the search explain.
GC_OVERRUN = "overrun: garbage collection"
#: The kind of a caught pipeline outcome whose search candidates were all right.
ORT_OPTIMIZER = "candidates right with onnxruntime optimizations off"

Outputs = dict[str, np.ndarray]
Listener = Callable[[str, "Outcome | None"], None]


@dataclass
class Outcome:
    """What one path did with the model. `kind` groups outcomes with the same likely cause
    (exception type and graphsub frame, or the rules a wrong candidate applied); `detail`
    keeps the end of a traceback; `via` names the search whose graph a backend stage failed
    on (empty: the imported graph)."""

    stage: str
    status: str
    message: str = ""
    seconds: float = 0.0
    kind: str = ""
    detail: str = ""
    via: str = ""

    @property
    def failed(self) -> bool:
        return self.status in FAILURES


@dataclass
class ModelReport:
    outcomes: list[Outcome] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.failed]

    def outcome(self, stage: str) -> Outcome | None:
        return next((o for o in self.outcomes if o.stage == stage), None)

    def as_dict(self) -> dict[str, Any]:
        return {"outcomes": [asdict(o) for o in self.outcomes], "notes": list(self.notes)}


@lru_cache(maxsize=4)
def default_rules(taso: Path | None = TASO_RULES) -> RuleSet:
    """The built-in rules plus TASO's (when its file is there: a note says when not). Cached:
    TASO's rules are checked numerically on load, which takes seconds."""
    rules = list(builtin_rules())
    if taso is None:
        return RuleSet(tuple(rules), ("TASO's rules not used",))
    if not taso.exists():
        return RuleSet(tuple(rules), (f"TASO's rules not used: {taso} is absent",))
    return RuleSet(tuple(rules + load_rules([taso])))


# ---- the reference and comparisons --------------------------------------------------------

@dataclass(frozen=True)
class Reference:
    """The original model's interface and its outputs on TRIALS input sets, compared under
    the optimizer's own tolerance policy (SAME_FUNCTION)."""

    inputs: tuple[tuple[str, tuple[int | str, ...]], ...]
    outputs: tuple[str, ...]
    feeds: tuple[dict[str, np.ndarray], ...]
    expected: tuple[Outputs, ...]
    #: SAME_FUNCTION at the precision the model computes in (float16's when it does)
    tolerance: Tolerance = SAME_FUNCTION
    #: what graphsub's own evaluators (numpy, torch) are held to: onnxruntime's float16
    #: kernels differ from a float32 computation by more than a reordering does (its float16
    #: LayerNormalization by 3.5% in campaign 28000, where numpy and torch agreed)
    evaluator_tolerance: Tolerance = SAME_FUNCTION
    #: a half-precision model's outputs computed in float32 (`widened`), one per input set;
    #: empty for other models
    truth: tuple[Outputs, ...] = ()
    #: a half-precision model's own rounding, per input set and output: the most it is off
    #: its float32 computation, or moves when its inputs move by an ulp (`_rounding_noise`)
    noise: tuple[Mapping[str, float], ...] = ()

    @classmethod
    def of(cls, model: onnx.ModelProto, seed: int) -> Reference:
        """TRIALS input sets at the sizes the model was built with; a model with a size
        symbol gets one more at each of its other sizes (fuzz.models.other_sizes)."""
        feeds = tuple(random_inputs(model, seed + t) for t in range(TRIALS)) + tuple(
            random_inputs(model, seed, sizes) for sizes in other_sizes(model))
        expected = tuple(run_reference(model, f) for f in feeds)
        tolerance = SAME_FUNCTION.for_precision(_float_types(model.graph))
        step = max(_quantization_step(model.graph), _dynamic_step(model, feeds[0]))
        if step:
            # graphsub's own evaluators (numpy, torch) sum the float operators between a
            # dequantization and a quantization in another order than onnxruntime: a value on
            # a rounding boundary then lands one quantization step away
            tolerance = replace(tolerance, atol=max(tolerance.atol, 1.01 * step))
        evaluators = replace(SAME_FUNCTION.for_precision(_float_types(model.graph),
                                                         EVALUATOR_EPSILONS),
                             atol=tolerance.atol)
        truth: tuple[Outputs, ...] = ()
        noise: tuple[Mapping[str, float], ...] = ()
        if "float16" in _float_types(model.graph):
            try:
                truth = tuple(run_reference(widened(model), _widened_feeds(f)) for f in feeds)
                noise = _rounding_noise(model, feeds, expected, truth, seed)
            except Exception:  # noqa: BLE001 (a model that does not widen: compared as is)
                truth = ()
        return cls(_inputs_of(model), tuple(o.name for o in model.graph.output), feeds,
                   expected, tolerance, evaluators, truth, noise)

    def compare(self, run: ModelFn, tolerance: Tolerance | None = None) -> tuple[str, str]:
        """(status, message): `wrong` with the first problem or the worst output, else `equal`
        (under `tolerance`, by default the reference's own)."""
        truths = self.truth or (None,) * len(self.feeds)
        noises = self.noise or ({},) * len(self.feeds)
        for feeds, expected, truth, noise in zip(self.feeds, self.expected, truths, noises):
            actual = run(feeds)
            problems = [f"output {name!r} has dtype {actual[name].dtype}, expected {e.dtype}"
                        for name, e in expected.items()
                        if name in actual and np.asarray(actual[name]).dtype != e.dtype]
            diffs, shape_problems = compare_outputs(expected, actual,
                                                    tolerance or self.tolerance)
            problems = shape_problems + problems
            if problems:
                return "wrong", problems[0]
            bad = [d for d in diffs if not d.ok and not (truth is not None and _as_accurate(
                actual[d.name], truth[d.name], noise.get(d.name, 0.0),
                (tolerance or self.tolerance).atol_for(expected[d.name])))]
            if bad:
                return "wrong", max(bad, key=lambda d: d.max_rel).describe()
        return "equal", ""

    def compare_onnx(self, data: bytes) -> tuple[str, str]:
        """Compare an ONNX model graphsub wrote: same inputs and outputs, same values."""
        model = onnx.load_from_string(data)
        inputs = _inputs_of(model)
        if inputs != self.inputs:
            return "wrong", f"the inputs changed: {list(self.inputs)} -> {list(inputs)}"
        outputs = tuple(o.name for o in model.graph.output)
        if outputs != self.outputs:
            return "wrong", f"the outputs changed: {list(self.outputs)} -> {list(outputs)}"
        return self.compare(lambda feeds: run_reference(data, dict(feeds)))


#: How much further from the float32 computation than the model itself a half-precision
#: output may land: a rewrite's rounding errors add to the model's own.
HALF_ERROR_FACTOR = 4


def _as_accurate(actual: np.ndarray, truth: np.ndarray, noise: float, atol: float) -> bool:
    """Whether a half-precision output is as accurate as the model's own, measured against
    the model computed in float32: an output that cancels (two terms near 0.2 whose sum is
    0.003) is off by a large share of itself in float16 already, and an operand rounded the
    other way moves it by one of the operands' ulps (campaign 28000's seed 100130: 3.6% of the
    value); a wrong rewrite lands much further than the model's own rounding."""
    truth = np.asarray(truth, np.float64)
    if np.shape(truth) != np.shape(actual):
        return False
    off = np.max(np.abs(np.asarray(actual, np.float64) - truth), initial=0.0)
    return bool(off <= HALF_ERROR_FACTOR * noise + atol)


def _rounding_noise(model: onnx.ModelProto, feeds: Sequence[Mapping[str, np.ndarray]],
                    expected: Sequence[Outputs], truth: Sequence[Outputs], seed: int
                    ) -> tuple[dict[str, float], ...]:
    """Per input set and output, the most the half-precision model is off its float32
    computation, or moves when each float input moves by one float16 ulp (either way): the
    size of the rounding the model's own operators do, which a reordered computation
    redoes."""
    rng = np.random.default_rng([seed, 16])
    noises: list[dict[str, float]] = []
    for f, e, t in zip(feeds, expected, truth):
        noise: dict[str, float] = {}
        noises.append(noise)
        nudged = {k: (v * (1 + rng.choice([-1, 1], v.shape) * 2.0 ** -10)).astype(v.dtype)
                  if v.dtype.kind == "f" else v for k, v in f.items()}
        moved = run_reference(model, nudged)
        for name, value in e.items():
            value = np.asarray(value, np.float64)
            if not value.size:
                continue
            found = max(np.max(np.abs(value - np.asarray(t[name], np.float64))),
                        np.max(np.abs(value - np.asarray(moved[name], np.float64))))
            if np.isfinite(found):
                noise[name] = float(found)
    return tuple(noises)


def widened(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with every float16 tensor, cast and declared type made float32: what a
    half-precision model computes without its rounding (its bodies too)."""
    wide = onnx.ModelProto()
    wide.CopyFrom(model)
    _widen_graph(wide.graph)
    return wide


def _widen_tensor(tensor: onnx.TensorProto) -> None:
    if tensor.data_type == onnx.TensorProto.FLOAT16:
        tensor.CopyFrom(numpy_helper.from_array(
            numpy_helper.to_array(tensor).astype(np.float32), tensor.name))


def _widen_graph(graph: onnx.GraphProto) -> None:
    for tensor in graph.initializer:
        _widen_tensor(tensor)
    for info in (*graph.input, *graph.output, *graph.value_info):
        if info.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16:
            info.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                _widen_tensor(attr.t)
            elif attr.type == onnx.AttributeProto.GRAPH:
                _widen_graph(attr.g)
            elif attr.name in ("to", "dtype") and attr.i == onnx.TensorProto.FLOAT16:
                attr.i = onnx.TensorProto.FLOAT


def _widened_feeds(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: v.astype(np.float32) if v.dtype == np.float16 else v for k, v in feeds.items()}


#: Epsilons of a half precision that graphsub's evaluators may differ from onnxruntime by.
EVALUATOR_EPSILONS = 64


def _quantization_step(graph: onnx.GraphProto) -> float:
    """The largest scale of the model's static quantizations (0 without any): a
    (de)quantization's, and the float scalars a QLinear operator reads (its scales)."""
    inits = {t.name: t for t in graph.initializer}
    scales = [float(np.max(np.abs(numpy_helper.to_array(inits[n.input[1]]))))
              for n in graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")
              and len(n.input) > 1 and n.input[1] in inits]
    for node in graph.node:
        if node.op_type.startswith(("QLinear", "QGemm")):
            scales += [float(abs(a)) for a in (numpy_helper.to_array(inits[name])
                                                for name in node.input if name in inits)
                       if a.dtype == np.float32 and a.size == 1]
    return max(scales, default=0.0)


def _dynamic_step(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> float:
    """What one step of a dynamically quantized activation moves an output by: for each
    MatMulInteger or ConvInteger whose result quantize_dynamic rescales (Cast, then Mul by
    activation scale x weight scale, computed at run time), that product times the largest
    integer weight less its zero point (0 for a model without dynamic quantization)."""
    graph = model.graph
    inits = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    users: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            users.setdefault(name, []).append(node)
    products: dict[str, float] = {}  # scale product's name -> the weight's largest step count
    for node in graph.node:
        if node.op_type not in ("MatMulInteger", "ConvInteger") or node.input[1] not in inits:
            continue
        zero = inits.get(node.input[3], 0) if len(node.input) > 3 else 0
        counts = float(np.max(np.abs(inits[node.input[1]].astype(np.int64) - np.int64(
            np.max(zero))))) if inits[node.input[1]].size else 0.0
        for cast in users.get(node.output[0], []):
            for mul in users.get(cast.output[0], []) if cast.op_type == "Cast" else []:
                if mul.op_type == "Mul":
                    other = [n for n in mul.input if n != cast.output[0]]
                    if other:
                        products[other[0]] = max(products.get(other[0], 0.0), counts)
    if not products:
        return 0.0
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    known = {o.name for o in probe.graph.output}
    for name in products:
        if name not in known:
            probe.graph.output.append(onnx.helper.make_tensor_value_info(
                name, onnx.TensorProto.FLOAT, None))
    values = run_reference(probe, dict(feeds))
    return max(float(np.max(np.abs(values[name]))) * counts for name, counts in products.items())


def _float_types(graph: onnx.GraphProto) -> set[str]:
    """The element types a graph's weights, inputs, outputs and casts have, bodies included."""
    codes = {t.data_type for t in graph.initializer}
    codes |= {v.type.tensor_type.elem_type for v in (*graph.input, *graph.output)}
    found = set()
    for node in graph.node:
        for attr in node.attribute:
            if node.op_type == "Cast" and attr.name == "to":
                codes.add(attr.i)
            elif attr.type == onnx.AttributeProto.GRAPH:
                found |= _float_types(attr.g)
    return found | {onnx.helper.tensor_dtype_to_np_dtype(c).name if c != onnx.TensorProto.BFLOAT16
                    else "bfloat16" for c in codes if c}


def _inputs_of(model: onnx.ModelProto) -> tuple[tuple[str, tuple[int | str, ...]], ...]:
    """Each input's name and dimensions (a size symbol by its name: the written model must
    keep it)."""
    inits = {i.name for i in model.graph.initializer}
    return tuple((i.name, tuple(d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim))
                 for i in model.graph.input if i.name not in inits)


# ---- exceptions as outcomes --------------------------------------------------------------

def _where(exc: BaseException) -> str:
    """The innermost graphsub frame (outside this package) that the exception passed
    through, as path:line (function): where to start looking."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if "/graphsub/" in f.filename and "/graphsub/fuzz/" not in f.filename]
    if not frames:
        return ""
    f = frames[-1]
    path = f.filename[f.filename.rindex("/graphsub/") + 1:]
    return f"{path}:{f.lineno} ({f.name})"


def _failure(stage: str, exc: BaseException, status: str, seconds: float) -> Outcome:
    first = (str(exc).splitlines() or [""])[0][:300]
    where = _where(exc)
    tail = "".join(traceback.format_exception(exc)[-4:])[-2000:]
    message = f"{type(exc).__name__}: {first}" + (f" [{where}]" if where else "")
    return Outcome(stage, status, message, seconds, f"{type(exc).__name__} at {where or '?'}", tail)


def _run_stage(stage: str, body: Callable[[], Outcome]) -> Outcome:
    """Run one stage; whatever it raises becomes its outcome, never the caller's problem."""
    start = time.perf_counter()
    try:
        outcome = body()
    except Exception as exc:  # any exception is a finding of this stage, not of the others
        return _failure(stage, exc, "error", time.perf_counter() - start)
    if not outcome.seconds:
        outcome.seconds = time.perf_counter() - start
    return outcome


# ---- stages ---------------------------------------------------------------------------------

@dataclass
class _Subject:
    """The model under test as every stage needs it: the imported graph, the original bytes,
    the reference, and (computed on first use) the baseline."""

    graph: Graph
    data: bytes
    ref: Reference
    seed: int
    #: The distinct best graphs the searches found, by the algorithm that found them first:
    #: the backend stages run them too (rewrites make operators imports never do, such as
    #: fused activations, grouped or enlarged convolutions, scalar multiplications).
    found: dict[str, tuple[Graph, tuple[str, ...]]] = field(default_factory=dict)
    _baseline: list[Reference | None] = field(default_factory=list)

    def profile(self) -> tuple[ProfileShape, ...]:
        """A model with a size symbol is priced at the sizes it was built with."""
        sizes = fuzz_sizes(onnx.load_from_string(self.data))
        return (ProfileShape.of(sizes),) if sizes else ()

    def add_found(self, algorithm: str, graph: Graph, rules: Sequence[str]) -> None:
        hashes = {g.structural_hash() for g, _ in self.found.values()}
        if graph.structural_hash() not in hashes | {self.graph.structural_hash()}:
            self.found[algorithm] = (graph, tuple(rules))

    def baseline(self) -> Reference | None:
        """The unchanged graph as graphsub exports it, run as a second reference; None when
        that export fails or does not run."""
        if not self._baseline:
            try:
                exported = onnx.load_from_string(to_onnx_bytes(self.graph))
                self._baseline.append(Reference.of(exported, self.seed))
            except Exception:  # the roundtrip stage reports this failure
                self._baseline.append(None)
        return self._baseline[0]

    def wrong_kind(self, matches: Callable[[Reference], tuple[str, str]], own: str) -> str:
        """The kind of a wrong outcome: INHERITED when what the stage computed matches the
        unchanged graph's export (the import or the export is wrong, not this stage), else
        `own`."""
        baseline = self.baseline()
        try:
            inherited = baseline is not None and matches(baseline)[0] == "equal"
        except Exception:  # a run that fails here does not match the baseline
            inherited = False
        return INHERITED if inherited else own


def _roundtrip(subject: _Subject) -> Outcome:
    status, message = subject.ref.compare_onnx(to_onnx_bytes(subject.graph))
    return Outcome("roundtrip", status, message, kind="roundtrip" if status != "equal" else "")


def _search(subject: _Subject, algorithm: str, rules: Sequence[Rule], time_limit: float,
            options: Mapping[str, Any]) -> Outcome:
    """One search; its best graph and candidates exported and compared. `options` bound
    every search at once: each gets the budget and the ones it has."""
    stage = f"search:{algorithm}"
    own = {name: value for name, value in options.items()
           if name == "budget" or name in ALGORITHMS[algorithm].option_names()}
    with _GcClock() as gc_clock:
        start = time.perf_counter()
        # exactly these rules (the library is among the defaults): minimize_rules narrows
        # them down to the culprits, which an added library would put back
        result = optimize(subject.graph, rules, algorithm=algorithm, rules_only=True,
                          time_limit=time_limit, cost="analytic", target="ort-cpu", threads=1,
                          shape_profile=subject.profile(), **own)
        seconds = time.perf_counter() - start
    found = [("best", result.graph, result.trace)]
    found += [(f"candidate {i}", c.graph, c.trace) for i, c in enumerate(result.candidates)]
    for label, candidate, trace in _distinct(found):
        outcome = _check_candidate(subject, stage, label, candidate, [s.rule for s in trace])
        if outcome is not None:
            outcome.seconds = seconds
            return outcome
    subject.add_found(algorithm, result.graph, [s.rule for s in result.trace])
    return _timing_outcome(stage, seconds, time_limit, gc_clock.seconds, result.stats.stopped_by)


def _timing_outcome(stage: str, seconds: float, time_limit: float, gc_seconds: float,
                    stopped_by: StopReason) -> Outcome:
    """`equal`, or `timeout` for a search past its limit by more than max(1 s, 10%); the kind
    tells an overrun that full garbage collections explain (the process's heap, not the
    algorithm) from the algorithm's own."""
    allowed = time_limit + max(1.0, 0.1 * time_limit)
    if seconds <= allowed:
        return Outcome(stage, "equal", "", seconds)
    kind = GC_OVERRUN if seconds - gc_seconds <= allowed else f"overrun: {stage.split(':')[1]}"
    return Outcome(stage, "timeout", f"{seconds:.2f} s for a {time_limit:g} s limit, "
                   f"{gc_seconds:.2f} s of it in full garbage collections (stopped by "
                   f"{stopped_by})", seconds, kind)


class _GcClock:
    """Seconds spent in full (generation 2) garbage collections while the block runs."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._started = 0.0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started:
            self.seconds += time.perf_counter() - self._started
            self._started = 0.0

    def __enter__(self) -> _GcClock:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)


def _rules_kind(rules: Iterable[str]) -> str:
    return "rules " + ",".join(sorted(set(rules)))


def _distinct(found: Iterable[tuple[str, Graph, tuple[Step, ...]]]
              ) -> list[tuple[str, Graph, tuple[Step, ...]]]:
    seen, out = set(), []
    for label, g, trace in found:
        h = g.structural_hash()
        if h not in seen:
            seen.add(h)
            out.append((label, g, trace))
    return out


def _check_candidate(subject: _Subject, stage: str, label: str, candidate: Graph,
                     rules: list[str]) -> Outcome | None:
    """None when the candidate computes the reference; else its wrong or error outcome,
    naming the rules that made it (the likely culprits)."""
    applied = ", ".join(rules) or "no rules"
    try:
        data = to_onnx_bytes(candidate)
        status, message = subject.ref.compare_onnx(data)
    except Exception as exc:  # an export or run failure of this candidate
        outcome = _failure(stage, exc, "error", 0.0)
        outcome.message = f"{label} after [{applied}]: {outcome.message}"
        return outcome
    if status == "equal":
        return None
    kind = subject.wrong_kind(lambda b: b.compare_onnx(data), _rules_kind(rules))
    return Outcome(stage, status, f"{label} after [{applied}]: {message}", kind=kind)


def _fission(subject: _Subject) -> Outcome:
    """Fission, then fission and orchestration into onnxruntime's kernel library."""
    start = time.perf_counter()
    primitive = fission(subject.graph)
    outcome = _check_candidate(subject, "fission", "primitive graph", primitive, ["fission"])
    if outcome is not None:
        return outcome
    subject.add_found("fission", primitive, ["fission"])
    context = start_run(subject.graph,
                        Settings.make(cost="analytic", target="ort-cpu", threads=1,
                                      shape_profile=subject.profile()),
                        budget=Budget(FISSION_SECONDS, measuring=False))
    with warnings.catch_warnings():  # a failure inside is this stage's finding, not a warning
        warnings.simplefilter("ignore", RuntimeWarning)
        found = run_stage(context, FISSION, Found.unsearched(context))
    if found.fission is None:
        return Outcome("fission", "error", "; ".join(context.log.notes)[:500],
                       kind="orchestration failed")
    orchestrated = found.fission.graph
    trace = ["fission", "orchestration"]
    outcome = _check_candidate(subject, "fission", "orchestrated graph", orchestrated, trace)
    if outcome is not None:
        return outcome
    subject.add_found("orchestration", orchestrated, trace)
    return Outcome("fission", "equal", "", time.perf_counter() - start)


def _numpy(subject: _Subject) -> Outcome:
    """graphsub's numpy reference evaluator, which the rule checker trusts."""
    return _run_graphs(subject, "numpy", lambda graph: (lambda feeds: evaluate(graph, feeds)))


def _torch_cpu(subject: _Subject) -> Outcome:
    """graphsub's torch backend."""
    try:
        target = get_target("torch-cpu", threads=1)
    except TargetUnavailableError as exc:
        return Outcome("torch-cpu", "skipped", str(exc))
    if any(t.is_opaque for node in subject.graph.nodes.values() for t in node.outputs):
        # refused up front by optimize too; any other refusal stays a finding
        return Outcome("torch-cpu", "skipped", target.cannot_run(subject.graph) or "")

    def runner(graph: Graph) -> ModelFn:
        # over size symbols, one program for every size the inputs have (TorchTarget.program)
        runnable = target.prepare(graph, subject.data if graph is subject.graph else None)
        return runnable.run

    return _run_graphs(subject, "torch-cpu", runner)


def _run_graphs(subject: _Subject, stage: str, runner: Callable[[Graph], ModelFn]) -> Outcome:
    """Run the imported graph, then each best graph the searches found, with a backend;
    the first that differs from the reference (or raises) is the outcome."""
    graphs: list[tuple[str, str, Graph, tuple[str, ...]]] = [("original", "", subject.graph, ())]
    graphs += [(f"best of {a}", a, g, rules) for a, (g, rules) in subject.found.items()]
    for label, algorithm, graph, rules in graphs:
        try:
            run = runner(graph)
            status, message = subject.ref.compare(run, subject.ref.evaluator_tolerance)
        except Exception as exc:  # a backend failure on this graph
            outcome = _failure(stage, exc, "error", 0.0)
            outcome.message, outcome.via = f"{label}: {outcome.message}", algorithm
            return outcome
        if status != "equal":
            kind = (subject.wrong_kind(lambda b: b.compare(run, b.evaluator_tolerance), stage)
                    if not algorithm
                    else f"{stage} after {_rules_kind(rules)}")
            return Outcome(stage, status, f"{label} after [{', '.join(rules)}]: {message}"
                           if algorithm else message, kind=kind, via=algorithm)
    return Outcome(stage, "equal", f"{len(graphs)} graphs")


def _pipeline(subject: _Subject, rules: Sequence[Rule], time_limit: float,
              measure_seconds: float) -> Outcome:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a failure is in the report
        written, report = optimize_model(subject.graph, subject.data, rules=rules,
                                         rules_only=True, cost="analytic", time_limit=time_limit,
                                         target="ort-cpu", threads=1,
                                         measure_seconds=measure_seconds, evidence=False,
                                         shape_profile=subject.profile())
    failed = report.verification.get("failed_candidate")
    if failed is not None:
        message = next((n for n in report.notes if "verification failed" in n), "")
        return Outcome("pipeline", "caught", message[:500],
                       kind="rules " + ",".join(sorted(set(failed.get("rules", [])))))
    assert isinstance(written, bytes)  # a fuzzed model is never large enough to detach
    status, message = subject.ref.compare_onnx(written)
    kind = "" if status == "equal" else subject.wrong_kind(lambda b: b.compare_onnx(written),
                                                           "pipeline")
    return Outcome("pipeline", status, message, kind=kind)


# ---- one model --------------------------------------------------------------------------------

def check_model(model: onnx.ModelProto | bytes, *, seed: int = 0, time_limit: float = 1.0,
                algorithms: Sequence[str] | None = None,
                stages: Sequence[str] = DEFAULT_STAGES, rules: Sequence[Rule] | None = None,
                measure_seconds: float = 0.05, search_options: Mapping[str, Any] | None = None,
                listener: Listener | None = None) -> ModelReport:
    """Every stage named in `stages` (see STAGES; `search` runs each of `algorithms`, by
    default all of graphsub.search.ALGORITHMS) on the model, with inputs drawn from `seed`.
    `rules` defaults to the built-in rules plus TASO's. `search_options` go to
    graphsub.optimize (budget, k, node_limit: bounds that, unlike the time limit, make a
    search the same on any machine). A stage's exception is that stage's outcome; a model
    graphsub cannot load gives the roundtrip outcome alone. `listener` is told when each
    stage starts (outcome None) and ends, so that a supervisor can tell which stage hangs.
    A wrong outcome whose values match the unchanged graph's export has kind INHERITED."""
    unknown = set(stages) - set(STAGES)
    if unknown:
        raise ValueError(f"unknown stages {sorted(unknown)}; use {STAGES}")
    proto = model if isinstance(model, onnx.ModelProto) else onnx.load_from_string(model)
    data = proto.SerializeToString()
    report = ModelReport()
    if rules is None:
        rule_set = default_rules()
        rules, report.notes = rule_set.rules, list(rule_set.notes)
    try:
        ref = Reference.of(proto, seed)
    except Exception as exc:  # not a graphsub problem: the model itself does not run
        report.notes.append(f"the reference run failed, nothing checked: {exc}")
        return report
    graph = _load(data, report)
    if graph is None:
        return report
    subject = _Subject(graph, data, ref, seed)
    bodies: list[tuple[str, Callable[[], Outcome]]] = []
    if "roundtrip" in stages:
        bodies.append(("roundtrip", lambda: _roundtrip(subject)))
    if "search" in stages:
        for algorithm in algorithms if algorithms is not None else list(ALGORITHMS):
            bodies.append((f"search:{algorithm}", partial(
                _search, subject, algorithm, rules, time_limit, search_options or {})))
    if "fission" in stages:
        bodies.append(("fission", lambda: _fission(subject)))
    if "numpy" in stages:
        bodies.append(("numpy", lambda: _numpy(subject)))
    if "torch-cpu" in stages:
        bodies.append(("torch-cpu", lambda: _torch_cpu(subject)))
    if "pipeline" in stages:
        bodies.append(("pipeline", lambda: _pipeline(subject, rules, time_limit,
                                                     measure_seconds)))
    for stage, body in bodies:
        if listener is not None:
            listener(stage, None)
        outcome = _run_stage(stage, body)
        report.outcomes.append(outcome)
        if listener is not None:
            listener(stage, outcome)
    _explain_caught(report)
    return report


def _explain_caught(report: ModelReport) -> None:
    """When the pipeline caught a wrong model although every candidate of its search
    (backtracking) computed the reference with onnxruntime's optimizations off, the model
    was broken by onnxruntime's optimizer, which graphsub's verification runs with."""
    pipeline, search = report.outcome("pipeline"), report.outcome("search:backtracking")
    if pipeline is not None and pipeline.status == "caught" and search is not None \
            and search.status == "equal":
        pipeline.kind = ORT_OPTIMIZER


def _load(data: bytes, report: ModelReport) -> Graph | None:
    """The imported graph, or None with a `roundtrip` outcome saying why not."""
    start = time.perf_counter()
    try:
        return load(data)
    except GraphsubError as exc:
        outcome = _failure("roundtrip", exc, "refused", time.perf_counter() - start)
        outcome.kind = f"refused: {_strip_numbers(str(exc))[:120]}"
    except Exception as exc:  # a crash in the importer
        outcome = _failure("roundtrip", exc, "error", time.perf_counter() - start)
    report.outcomes.append(outcome)
    report.notes.append("graphsub could not load the model: no other stage ran")
    return None


def _strip_numbers(text: str) -> str:
    """The message with names and numbers blanked, so that one cause gives one kind."""
    return re.sub(r"'[^']*'|\d+", "#", text)
