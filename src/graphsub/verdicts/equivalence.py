"""Whether two models compute the same function: their outputs compared on random inputs,
under one tolerance policy (`SAME_FUNCTION`) that the optimizer, the candidates' screening and
the torch.compile backend share; `graphsub check` takes the user's absolute tolerances."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphsub.errors import GraphsubError
from graphsub.runtime.inputs import InputSpec, random_feeds
from graphsub.runtime.ort_sessions import make_session


@dataclass(frozen=True)
class OutputDiff:
    """How far one output of model B is from model A's."""

    name: str
    max_abs: float
    max_rel: float
    worst_index: tuple[int, ...]
    expected: float
    actual: float
    ok: bool
    #: The worst element's difference as a share of what the tolerance allows there (at most
    #: 1 when the output agrees): how close to failing the comparison came.
    used: float = 0.0

    def describe(self) -> str:
        return (f"{self.name}: max |diff| {self.max_abs:.3g}, max rel {self.max_rel:.3g} at "
                f"{list(self.worst_index)} (expected {self.expected:.6g}, got {self.actual:.6g})")


@dataclass(frozen=True)
class Tolerance:
    """When an output agrees with the reference's: element-wise |a - e| <= atol + rtol |e|
    (numpy's allclose), where atol is at least `atol_scale` times the largest magnitude in
    that output of the reference: rewrites reassociate float32 sums, so elements near zero
    of a large output differ by rounding."""

    rtol: float = 1e-4
    atol: float = 1e-5
    atol_scale: float = 0.0

    def atol_for(self, expected: np.ndarray) -> float:
        if not self.atol_scale or not np.size(expected):
            return self.atol
        finite = np.abs(np.asarray(expected, dtype=np.float64))
        peak = float(finite[np.isfinite(finite)].max(initial=0.0))
        return max(self.atol, self.atol_scale * peak)

    def as_dict(self) -> dict[str, float]:
        return {"rtol": self.rtol, "atol": self.atol, "atol_scale": self.atol_scale}

    def for_precision(self, dtypes: Iterable[str], epsilons: int | None = None) -> Tolerance:
        """This tolerance for a model that computes in `dtypes`: where one is a half
        precision, a rewrite that sums in another order (a merged matmul, a transposed
        product) moves an output by a few of that type's epsilons of its scale, which
        float32's bounds would call wrong (a float16 BERT's layer norm, 2 ulps apart)."""
        eps = max((HALF_PRECISION_EPS.get(d, 0.0) for d in dtypes), default=0.0)
        if not eps:
            return self
        scaled = (ROUNDING_EPSILONS if epsilons is None else epsilons) * eps
        return Tolerance(max(self.rtol, scaled), self.atol, max(self.atol_scale, scaled))


#: "Computes the same function", for an optimized model against its original.
SAME_FUNCTION = Tolerance(rtol=1e-3, atol=1e-6, atol_scale=1e-4)
#: Machine epsilons of the float types below float32.
HALF_PRECISION_EPS = {"float16": 2.0**-10, "bfloat16": 2.0**-7}
#: How many epsilons of an output's scale a reordered half-precision computation may move it.
ROUNDING_EPSILONS = 4


def value_dtypes(graph: Any) -> set[str]:
    """The element types a graph computes in (every value's, weights' included)."""
    return {t.dtype for node in graph.nodes.values() for t in node.outputs}


@dataclass(frozen=True)
class Comparison:
    equivalent: bool
    outputs: tuple[OutputDiff, ...]
    tolerance: Tolerance
    trials: int
    problems: tuple[str, ...] = field(default=())

    @property
    def worst(self) -> OutputDiff | None:
        if not self.outputs:
            return None
        return max(self.outputs, key=lambda d: (not d.ok, d.max_rel))

    def as_dict(self) -> dict[str, Any]:
        return {"equivalent": self.equivalent, **self.tolerance.as_dict(),
                "trials": self.trials, "problems": list(self.problems),
                "outputs": [d.__dict__ | {"worst_index": list(d.worst_index)}
                            for d in self.outputs]}


def diff_arrays(name: str, expected: np.ndarray, actual: np.ndarray, rtol: float,
                atol: float) -> OutputDiff:
    """Compare element-wise with |a - e| <= atol + rtol * |e| (numpy's allclose rule); the
    worst element is the one that most exceeds its allowance."""
    e = np.asarray(expected, dtype=np.float64)
    a = np.asarray(actual, dtype=np.float64)
    if e.size == 0:
        return OutputDiff(name, 0.0, 0.0, (), 0.0, 0.0, True)
    same = (a == e) | (np.isnan(e) & np.isnan(a))  # equal infinities and NaNs agree
    with np.errstate(invalid="ignore"):
        err = np.where(same, 0.0, np.abs(a - e))
    err = np.where(np.isnan(err), np.inf, err)
    magnitude = np.abs(np.where(np.isfinite(e), e, 0.0))
    excess = err - (atol + rtol * magnitude)
    flat = int(np.argmax(excess))
    idx = tuple(int(i) for i in np.unravel_index(flat, e.shape)) if e.ndim else ()
    rel = err / np.maximum(magnitude, atol if atol > 0 else np.finfo(np.float64).tiny)
    allowed = atol + rtol * float(magnitude.flat[flat])
    worst = float(err.flat[flat])
    used = worst / allowed if allowed > 0 else (0.0 if worst == 0 else float("inf"))
    return OutputDiff(name, float(err.max()), float(rel.max()), idx, float(e.flat[flat]),
                      float(a.flat[flat]), bool(excess.max() <= 0), used)


def compare_outputs(expected: Mapping[str, np.ndarray], actual: Mapping[str, np.ndarray],
                    tolerance: Tolerance) -> tuple[list[OutputDiff], list[str]]:
    """Each expected output against the actual one of its name: the differences, and the
    outputs missing or of another shape. Integer outputs must be equal: a quantized model's
    uint8 result one step off is a different answer, whatever its float tolerance."""
    diffs, problems = [], []
    for name, e_all in expected.items():
        if name not in actual:
            problems.append(f"output {name!r} is missing")
            continue
        pairs, problem = _leaf_pairs(name, e_all, actual[name])
        if problem is not None:
            problems.append(problem)
            continue
        for leaf, e, a in pairs:
            diff, problem = _compare_leaf(leaf, e, a, tolerance)
            if problem is not None:
                problems.append(problem)
            elif diff is not None:
                diffs.append(diff)
    return diffs, problems


def _leaf_pairs(name: str, e: Any, a: Any) -> tuple[list[tuple[str, Any, Any]], str | None]:
    """An output's tensors side by side (a sequence's elements, a map's values, an optional's
    contents), or the way the two differ in structure."""
    if isinstance(e, (list, tuple)):
        if not isinstance(a, (list, tuple)) or len(a) != len(e):
            return [], f"output {name!r} is not a sequence of {len(e)} like the original's"
        pairs: list[tuple[str, Any, Any]] = []
        for i, (x, y) in enumerate(zip(e, a)):
            more, problem = _leaf_pairs(f"{name}[{i}]", x, y)
            if problem is not None:
                return [], problem
            pairs += more
        return pairs, None
    if isinstance(e, dict):
        if not isinstance(a, dict) or set(a) != set(e):
            return [], f"output {name!r} is not a map with the original's keys"
        return [(f"{name}[{k!r}]", e[k], a[k]) for k in e], None
    if (e is None) != (a is None):
        return [], f"output {name!r} is {'empty' if a is None else 'not empty'}, unlike the " \
                   f"original's"
    return [(name, e, a)], None


def _compare_leaf(name: str, e: Any, a: Any, tolerance: Tolerance
                  ) -> tuple[OutputDiff | None, str | None]:
    """One tensor of an output against the original's: strings equal, integers equal, floats
    within the tolerance."""
    if e is None:
        return None, None
    if np.shape(a) != np.shape(e):
        return None, f"output {name!r} has shape {np.shape(a)}, expected {np.shape(e)}"
    kind = np.asarray(e).dtype.kind
    if kind in "OSU":  # strings are equal or they are not
        same = [str(x) == str(y) for x, y in zip(np.asarray(e).flat, np.asarray(a).flat)]
        return None, None if all(same) else f"output {name!r} differs in its strings"
    if kind in "iub":  # integers (quantized values, indices, masks) are equal or not
        return diff_arrays(name, e, a, 0.0, 0.0), None
    return diff_arrays(name, e, a, tolerance.rtol, tolerance.atol_for(e)), None


#: Runs a model: named inputs to named outputs.
ModelFn = Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]]


def compare_runners(a: ModelFn, b: ModelFn, specs: Sequence[InputSpec],
                    tolerance: Tolerance = Tolerance(), trials: int = 2,
                    seed: int = 0) -> Comparison:
    """Run two models (any callables from named inputs to named outputs) on `trials` sets of
    random inputs and compare every output; A is the reference. Outputs must match by name
    and shape; values must agree within the tolerances."""
    worst: dict[str, OutputDiff] = {}
    problems: list[str] = []
    names: list[str] = []
    for t in range(trials):
        feeds = random_feeds(specs, seed + t)
        ea, eb = a(feeds), b(feeds)
        names = list(ea)
        diffs, probs = compare_outputs(ea, eb, tolerance)
        problems += probs
        for d in diffs:
            prev = worst.get(d.name)
            if prev is None or (prev.ok and not d.ok) or (prev.ok == d.ok and d.max_rel > prev.max_rel):
                worst[d.name] = d
    outputs = tuple(worst[n] for n in names if n in worst)
    ok = not problems and all(d.ok for d in outputs)
    return Comparison(ok, outputs, tolerance, trials, tuple(dict.fromkeys(problems)))


def compare_models(a: Any, b: Any, specs: Sequence[InputSpec],
                   tolerance: Tolerance = Tolerance(), trials: int = 2, seed: int = 0,
                   threads: int | None = None) -> Comparison:
    """Run both ONNX models (or onnxruntime sessions of them) on `trials` sets of random
    inputs and compare every output (see `compare_runners`)."""
    sa = a if hasattr(a, "run") else make_session(a, threads)
    sb = b if hasattr(b, "run") else make_session(b, threads)
    names_a = [o.name for o in sa.get_outputs()]
    names_b = [o.name for o in sb.get_outputs()]
    if names_a != names_b:
        raise GraphsubError(f"the models have different outputs: {names_a} vs {names_b}")
    return compare_runners(lambda f: dict(zip(names_a, sa.run(names_a, dict(f)))),
                           lambda f: dict(zip(names_b, sb.run(names_b, dict(f)))),
                           specs, tolerance, trials, seed)
