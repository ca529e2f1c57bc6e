"""The ONNX operator test corpus through graphsub: every operator at the opsets the onnx package
tests it at, with the inputs and expected outputs its authors wrote (`onnx.backend.test.case.
node`, the generators of onnx/backend/test/data/node), as a differential test.

For each case:
- the reference is onnxruntime running the original on the case's inputs, with its own
  rewrites off (`models.run_reference`); where onnxruntime cannot run it (an operator or an
  opset it has no kernel for), the case's expected outputs;
- graphsub imports the model: a refusal must be a `GraphsubError` of one line naming what it
  refuses, anything else a traceback;
- graphsub's re-export of the unchanged graph (`roundtrip`), and the best graph of a short
  search (`search`, the analytic cost, the built-in rules), run in onnxruntime and must give
  the reference's values (the optimizer's tolerance, SAME_FUNCTION, at the model's
  precision); where onnxruntime cannot run the original, a re-export it cannot run either is
  no finding (`outside`), one it does run is compared with the expected outputs.

Statuses: `equal`, `wrong`, `traceback`, `refused` (one line: a clean refusal), `outside`
(nothing onnxruntime runs to compare with), `ort-differs` (onnxruntime's own run of the
original is not the expected output: the reference is then onnxruntime's).
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from graphsub.errors import GraphsubError
from graphsub.fuzz.models import run_reference
from graphsub.onnx_io import load, to_onnx_bytes
from graphsub.verdicts.equivalence import SAME_FUNCTION, compare_outputs

STATUSES = ("equal", "wrong", "traceback", "refused", "outside", "ort-differs")


@dataclass(frozen=True)
class Case:
    """One node test: its model, its inputs by name and its expected outputs by name."""

    name: str
    model: onnx.ModelProto
    inputs: Mapping[str, Any]
    expected: Mapping[str, Any]


@dataclass
class CaseOutcome:
    name: str
    #: One status per path ("import", "roundtrip", "search").
    statuses: dict[str, str] = field(default_factory=dict)
    messages: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def worst(self) -> str:
        for status in ("traceback", "wrong"):
            if status in self.statuses.values():
                return status
        return "refused" if "refused" in self.statuses.values() else next(
            iter(self.statuses.values()), "equal")


def node_cases(names: Iterable[str] | None = None) -> list[Case]:
    """The corpus (all of it, or the cases named), in the onnx package's order."""
    from onnx.backend.test.case.node import collect_testcases

    wanted = set(names) if names is not None else None
    out = []
    for case in collect_testcases(None):
        if wanted is not None and case.name not in wanted:
            continue
        if not case.data_sets:
            continue
        assert case.model is not None  # every node case is built with its model
        inputs, outputs = case.data_sets[0]
        graph = case.model.graph
        feeds = {vi.name: value for vi, value in zip(graph.input, inputs)}
        expected = {vi.name: value for vi, value in zip(graph.output, outputs)}
        out.append(Case(case.name, case.model, feeds, expected))
    return out


def check_case(case: Case, search_seconds: float = 0.3) -> CaseOutcome:
    """The case through graphsub's import, re-export and a short search (see the module's
    docstring)."""
    start = time.perf_counter()
    outcome = CaseOutcome(case.name)
    data = case.model.SerializeToString()
    reference, ort_runs = _reference(case, data, outcome)
    try:
        graph = load(data)
    except GraphsubError as exc:
        _refused(outcome, "import", exc)
        outcome.seconds = time.perf_counter() - start
        return outcome
    except Exception as exc:  # noqa: BLE001 - a traceback is this harness's finding
        outcome.statuses["import"], outcome.messages["import"] = "traceback", _trace(exc)
        outcome.seconds = time.perf_counter() - start
        return outcome
    outcome.statuses["import"] = "equal"
    _compare_export(outcome, "roundtrip", lambda: to_onnx_bytes(graph), case.inputs,
                    reference, ort_runs)
    if search_seconds:
        _compare_export(outcome, "search", lambda: _searched(graph, search_seconds),
                        case.inputs, reference, ort_runs)
    outcome.seconds = time.perf_counter() - start
    return outcome


def _reference(case: Case, data: bytes, outcome: CaseOutcome
               ) -> tuple[Mapping[str, Any], bool]:
    """What graphsub's outputs are compared with, and whether onnxruntime ran the original."""
    try:
        got = run_reference(data, dict(case.inputs))
    except Exception as exc:  # noqa: BLE001 - onnxruntime has no kernel or no such opset
        outcome.messages["reference"] = f"onnxruntime: {_first_line(exc)}"
        return case.expected, False
    problem = _difference(case.expected, got)
    if problem is not None:
        outcome.statuses["reference"] = "ort-differs"
        outcome.messages["reference"] = problem
    return got, True


def _searched(graph: Any, seconds: float) -> bytes:
    from graphsub.optimizer import optimize
    from graphsub.rules import builtin_rules

    result = optimize(graph, builtin_rules(), algorithm="greedy", time_limit=seconds,
                      cost="analytic", target="ort-cpu", threads=1)
    return to_onnx_bytes(result.graph)


def _compare_export(outcome: CaseOutcome, path: str, export: Any, inputs: Mapping[str, Any],
                    reference: Mapping[str, Any], ort_runs: bool) -> None:
    """`export`'s model run in onnxruntime on the case's inputs, against the reference."""
    try:
        data = export()
    except GraphsubError as exc:
        _refused(outcome, path, exc)
        return
    except Exception as exc:  # noqa: BLE001
        outcome.statuses[path], outcome.messages[path] = "traceback", _trace(exc)
        return
    try:
        got = run_reference(data, dict(inputs))
    except Exception as exc:  # noqa: BLE001
        if ort_runs:
            outcome.statuses[path] = "wrong"
            outcome.messages[path] = f"onnxruntime ran the original, not this: {_first_line(exc)}"
        else:
            outcome.statuses[path] = "outside"
            outcome.messages[path] = f"onnxruntime: {_first_line(exc)}"
        return
    problem = _difference(reference, got)
    outcome.statuses[path] = "equal" if problem is None else "wrong"
    if problem is not None:
        outcome.messages[path] = problem


def _difference(expected: Mapping[str, Any], got: Mapping[str, Any]) -> str | None:
    """The first way `got` differs from `expected` (None: it does not), under the
    optimizer's tolerance at the outputs' precision; sequences, optionals and strings are
    compared element by element, exactly for strings."""
    for name, want in expected.items():
        if name not in got:
            return f"output {name!r} is missing"
        problem = _value_difference(name, want, got[name])
        if problem is not None:
            return problem
    return None


def _value_difference(name: str, want: Any, have: Any) -> str | None:
    if want is None or have is None:
        return None if want is None and have is None else \
            f"{name}: expected {'nothing' if want is None else 'a value'}, got the other"
    if isinstance(want, (list, tuple)):
        if not isinstance(have, (list, tuple)) or len(have) != len(want):
            return f"{name}: expected a sequence of {len(want)}, got {type(have).__name__}"
        for i, (w, h) in enumerate(zip(want, have)):
            problem = _value_difference(f"{name}[{i}]", w, h)
            if problem is not None:
                return problem
        return None
    if isinstance(want, dict):
        if not isinstance(have, dict) or set(want) != set(have):
            return f"{name}: the map's keys differ"
        return next((p for k in want if (p := _value_difference(f"{name}[{k!r}]", want[k],
                                                               have[k])) is not None), None)
    want, have = np.asarray(want), np.asarray(have)
    if want.dtype == object or want.dtype.kind in "SU":
        return None if want.shape == have.shape and all(
            str(a) == str(b) for a, b in zip(want.flat, have.flat)) else \
            f"{name}: strings differ"
    tolerance = SAME_FUNCTION.for_precision([str(want.dtype)]) \
        if want.dtype.kind == "f" else SAME_FUNCTION
    diffs, problems = compare_outputs({name: want}, {name: have}, tolerance)
    if problems:
        return problems[0]
    bad = [d for d in diffs if not d.ok]
    return bad[0].describe() if bad else None


def _refused(outcome: CaseOutcome, path: str, exc: GraphsubError) -> None:
    message = str(exc)
    outcome.statuses[path] = "refused" if message and "\n" not in message.strip() \
        else "traceback"
    outcome.messages[path] = message if outcome.statuses[path] == "refused" else \
        f"a refusal of more than one line: {message[:300]!r}"


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:300]}"


def _trace(exc: BaseException) -> str:
    return f"{_first_line(exc)}\n" + "".join(traceback.format_exception(exc)[-3:])[-1500:]
