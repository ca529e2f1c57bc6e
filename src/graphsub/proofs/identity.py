"""Exact randomized identity tests of rules, for what Z3 over the axioms cannot say.

The axioms model no shapes, reshapes, casts, softmax or attention, so most rules of the
library are beyond `graphsub.proofs.prover`. Such a rule is tested here as Mirage tests its
kernels: both sides are evaluated exactly (`graphsub.proofs.exact`: rational arithmetic, random
functions for what it cannot compute) at random points (eighths), on instances (shapes,
attributes, the values its conditions fix) drawn as the numerical check draws them
(`rules.check`). Where the two sides are rational functions of the points and of the random
functions' values, Schwartz-Zippel bounds the chance that they differ yet agree at one point
by their degree over the number of integers drawn from; independent instances multiply.

A failure through a random function is no refutation: a rule may rely on a property of a
function the test makes random (relu is idempotent), and then stays unknown, with the reason.
A failure through none is: both sides are then checked against graphsub's numpy reference,
and exact values that differ are a counterexample (TASO's rule 130 differs where its two
convolutions have different numbers of output channels).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphsub.errors import GraphsubError
from graphsub.ir import Graph
from graphsub.proofs.exact import (EIGHTHS, NEG_INF, POINTS, SPREAD, NotExact, exact_run,
                                   to_floats)
from graphsub.rules.ast import Rule
from graphsub.rules.check import (PLAN_ATTEMPTS, RuleCheckError, _rank_plans, conv_images,
                                  rewritten_example)
from graphsub.runtime.reference import evaluate
from graphsub.verdicts.equivalence import diff_arrays

#: Distinct instances (shapes and attributes) a rule is tested on, and draws tried to find
#: them: the numerical check's three examples can all miss a wrong case (TASO's rule 98 is
#: wrong only where its convolutions are grouped, 1 draw in 4 or so).
INSTANCES, DRAWS = 12, 400


class _Points:
    """The numerical check's random generator with its normal draws replaced by the test's
    points: the instances it builds are the same kind, their values drawn from POINTS."""

    def __init__(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)

    def standard_normal(self, shape: Any = None) -> np.ndarray:
        whole: np.ndarray = self._rng.integers(-SPREAD * EIGHTHS, SPREAD * EIGHTHS + 1, shape)
        return whole.astype(np.float64) / EIGHTHS

    def __getattr__(self, name: str) -> Any:
        return getattr(self._rng, name)


@dataclass(frozen=True)
class IdentityTest:
    """What the exact test found: `passed` (every instance's two sides equal), `refutes` (an
    instance through no random function where they are not: a counterexample), `differs`
    (one where they are not, through a random function: a rule may rely on a property the
    random function lacks) or `not tested`, with the reason."""

    status: str
    instances: int = 0
    #: Chance that a rule whose sides differ passed anyway (Schwartz-Zippel, multiplied over
    #: the instances).
    error_bound: float = 1.0
    reason: str = ""

    def describe(self) -> str:
        if self.status == "passed":
            return (f"exact identity test: equal on {self.instances} random instances "
                    f"(chance of a false pass at most {self.error_bound:.0e} over the values "
                    "drawn, at the shapes and attributes drawn)")
        return self.reason


def identity_test(rule: Rule, seed: int = 0) -> IdentityTest:
    """Test `rule` exactly on the instances the numerical check would draw: for every
    combination of operand ranks its roles allow, a square draw, one of odd sizes and one of
    distinct shapes, or where none fits up to PLAN_ATTEMPTS others (TASO's convolution merges are wrong only where a convolution is grouped, which
    some combinations alone give), then random draws up to INSTANCES in all."""
    rng = _Points(seed)
    tested = _Tally()
    # (_Points is numpy's Generator with its normal draws replaced: the check's draws by
    # __getattr__, a duck the annotation does not name)
    for plan in _rank_plans(rule, rng):  # type: ignore[arg-type]
        if plan is None:
            continue
        fitted = False
        kinds = [("square", 1, 1), ("odd", PLAN_ATTEMPTS, 1), ("distinct", 3 * PLAN_ATTEMPTS, 3)]
        if conv_images(rule):
            kinds.append(("grouped", 40 * PLAN_ATTEMPTS, 10))
        for kind, tries, wanted in kinds + [("", PLAN_ATTEMPTS, 1)]:
            if fitted and not kind:
                break  # random draws only where none of the three kinds fits
            got = 0
            for _ in range(tries):
                found = tested.add(_instance(rule, rng, plan, kind))
                if found is not None:
                    if found.status != "passed":
                        return found
                    fitted, got = True, got + 1
                    if got == wanted:
                        break
    for draw in range(DRAWS):
        if tested.instances >= INSTANCES:
            break
        # distinct instances first; then, where a rule's instances have few shapes, new
        # points at shapes tested already (independent trials all the same)
        found = tested.add(_instance(rule, rng), repeat=draw >= DRAWS // 2)
        if found is not None and found.status != "passed":
            return found
    if tested.instances == 0 or tested.untestable:
        # An instance the exact semantics cannot evaluate is one the test cannot vouch for: a
        # pass on the others would say nothing of it (explicit pads without counting them).
        return IdentityTest("not tested", reason=tested.untestable or
                            "no instance of its source could be drawn")
    return IdentityTest("passed", tested.instances, tested.bound)


class _Tally:
    """The instances tested so far and the bound they give."""

    def __init__(self) -> None:
        self.instances, self.bound = 0, 1.0
        self.seen: set[tuple[Any, ...]] = set()
        self.untestable = ""

    def add(self, instance: tuple[Graph, Graph, dict[str, np.ndarray]] | IdentityTest | None,
            repeat: bool = False) -> IdentityTest | None:
        """None where there is no instance (one of shapes tested already, unless `repeat`;
        one the exact semantics do not cover, whose reason is kept; a divisor vanished
        there); else the outcome of testing it: passed (counted), refutes, differs or not
        tested."""
        if instance is None or isinstance(instance, IdentityTest):
            return instance
        before, after, feeds = instance
        if _shapes(before) in self.seen and not repeat:
            return None
        self.seen.add(_shapes(before))
        try:
            (want, random_before), (got, random_after) = (exact_run(before, feeds),
                                                          exact_run(after, feeds))
        except NotExact as exc:
            self.untestable = f"no exact semantics for {exc}"
            return None
        except ZeroDivisionError:
            return None  # a point where a divisor vanishes: draw another
        disagree = (not random_before and _disagrees_with_reference(before, feeds, want)) or \
            (not random_after and _disagrees_with_reference(after, feeds, got))
        if disagree:
            return IdentityTest("not tested", self.instances, reason=disagree)
        for name in want:
            if want[name].shape != got[name].shape or not _equal(want[name], got[name]):
                # Through no random function, and each side equal to the numpy reference to
                # rounding: exact values that differ are a counterexample, not a doubt; through
                # one, the instance is a counterexample where the reference's values differ.
                exact_only = not (random_before or random_after)
                if exact_only or _differ_numerically(before, after, feeds):
                    return IdentityTest("refutes", self.instances,
                                        reason=f"the two sides differ (output {name}) on "
                                               f"{_describe(before, feeds)}")
                return IdentityTest("differs", self.instances,
                                    reason=f"the two sides differ (output {name})")
        self.instances += 1
        self.bound *= min(1.0, (_degree(before) + _degree(after)) /
                         _smallest_set(before, feeds))
        return IdentityTest("passed", self.instances, self.bound)


def _differ_numerically(before: Graph, after: Graph, feeds: Mapping[str, np.ndarray]) -> bool:
    """Whether graphsub's numpy reference gives the two sides of an instance different values
    (beyond the numerical check's tolerance): a rule wrong there, whatever the exact test's
    random functions made of it."""
    with np.errstate(all="ignore"):
        want, got = evaluate(before, feeds), evaluate(after, feeds)
    for name, expected in want.items():
        actual = got[name]
        if expected.shape != actual.shape:
            return True
        finite = np.abs(expected[np.isfinite(expected)])
        scale = float(finite.max()) if finite.size else 0.0
        if expected.dtype.kind == "f":  # both undefined: agreeing, as in rules.check
            actual = np.where(~np.isfinite(expected) & ~np.isfinite(actual), expected, actual)
        if not diff_arrays(name, expected, actual, 1e-4, max(1e-4 * scale, 1e-6)).ok:
            return True
    return False


def _describe(graph: Graph, feeds: Mapping[str, np.ndarray]) -> str:
    """An instance in words: its operands' shapes and the attributes of its operators."""
    shapes = ", ".join(f"{name} {list(np.shape(value))}" for name, value in feeds.items())
    ops = "; ".join(f"{node.op} {dict(node.attrs)}" for node in graph.nodes.values()
                    if node.op not in ("input", "weight") and node.attrs)
    return f"{shapes}" + (f" ({ops})" if ops else "")


def _shapes(graph: Graph) -> tuple[Any, ...]:
    """An instance as its operators, shapes and attributes, whatever its values."""
    return tuple(sorted((node.op, tuple(t.shape for t in node.outputs),
                         repr(sorted((k, v) for k, v in node.attrs.items() if k != "value")))
                        for node in graph.nodes.values()))


def _equal(a: np.ndarray, b: np.ndarray) -> bool:
    return all(x is y if NEG_INF in (x, y) else x == y for x, y in zip(a.flat, b.flat))


def _instance(rule: Rule, rng: _Points, ranks: dict[str, int] | None = None, kind: str = ""
              ) -> tuple[Graph, Graph, dict[str, np.ndarray]] | IdentityTest | None:
    """An instance drawn as the numerical check draws one of `kind` (square, odd, distinct or
    grouped shapes; "" any), its values finite (the exact semantics have no infinity but a mask's);
    a refutation where its target's type is not its source's."""
    try:
        # (_Points for numpy's Generator, as above)
        drawn = rewritten_example(rule, rng, ranks,  # type: ignore[arg-type]
                                  square=kind == "square", edges=False, odd=kind == "odd",
                                  distinct=kind == "distinct", grouped=kind == "grouped")
    except RuleCheckError as exc:
        if "is wrong" in str(exc):
            return IdentityTest("refutes", reason=str(exc).splitlines()[0])
        return None
    except GraphsubError:  # an instance the rewrite cannot build: draw another
        return None
    if drawn is None:
        return None
    example, after = drawn
    return example.graph, after, dict(example.feeds)


def _disagrees_with_reference(graph: Graph, feeds: Mapping[str, np.ndarray],
                              exact: Mapping[str, np.ndarray]) -> str:
    """Why the exact values of an instance disagree with graphsub's numpy reference ("": they
    agree to rounding). Checked on every instance whose evaluation went through no random
    function: the exact evaluator is only as right as this."""
    reference = evaluate(graph, feeds)
    for name, value in exact.items():
        want = np.asarray(reference[name], dtype=np.float64)
        got = to_floats(value)
        both_inf = np.isneginf(want) & np.isneginf(got)
        diff = np.where(both_inf, 0.0, np.abs(np.where(both_inf, 0.0, got - want)))
        scale = max(float(np.abs(np.where(both_inf, 0.0, want)).max(initial=0.0)), 1.0)
        if got.shape != want.shape or not (diff <= 1e-3 * scale).all():
            return (f"the exact semantics disagree with the numpy reference on output {name} "
                    f"(operators {', '.join(sorted({n.op for n in graph.nodes.values()}))})")
    return ""


#: Operators whose value is a random function's (a fresh variable of degree 1).
_RANDOM = frozenset({"softmax", "guarded_softmax", "relu", "sigmoid", "tanh", "erf", "sqrt",
                     "exp"})
#: Operators that move or sum values without raising the degree: data movement, casts,
#: average pooling (a sum of one operand's values over a constant).
_LINEAR = frozenset({"concat", "split", "reshape", "transpose", "expand", "squeeze",
                     "unsqueeze", "identity", "enlarge", "slice", "flatten", "dropout", "cast",
                     "neg", "avg_pool2d"})


def _degree(graph: Graph) -> int:
    """A bound on the degree of the graph's outputs (numerator plus denominator) as
    rational functions of the drawn points and the random functions' values (each a
    variable): a sum, product or quotient of two operands at most adds their degrees, and so
    does a matmul or convolution whose operands' elements share their denominators (every
    instance of the library: polynomials, or scaled by one weight). A fused operator adds
    one for the random value inside it; quantization counts its exact branch."""
    degree: dict[int, int] = {}
    for nid in graph.topo_order():
        node = graph[nid]
        ins = [degree[v.node] for v in node.inputs]
        if node.op in ("input", "weight") or node.op in _RANDOM:
            degree[nid] = 1
        elif node.op in _LINEAR:
            degree[nid] = max(ins, default=1)
        else:
            degree[nid] = sum(ins) + (1 if node.op in ("attention", "batch_norm", "gelu")
                                      else 0)
    return max((degree[v.node] for v in graph.outputs), default=1)


def _smallest_set(graph: Graph, feeds: Mapping[str, np.ndarray]) -> int:
    """How many values the smallest-drawn operand takes: the points' grid, or fewer for an
    8-bit quantized input or weight. (A mask's -inf and zeros, a constant a condition fixes,
    are part of the instance, like its shapes: the bound holds for each.)"""
    sizes = [POINTS]
    drawn = [np.asarray(a) for a in feeds.values()]
    drawn += [graph[n].attrs["value"].array for n in graph.nodes_by_op("weight")]
    for array in drawn:
        if array.dtype.kind in "iu":
            info = np.iinfo(array.dtype)
            sizes.append(min(int(info.max) - int(info.min) + 1, POINTS))
    return min(sizes)


__all__ = ["IdentityTest", "identity_test"]
