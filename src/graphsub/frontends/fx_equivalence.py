"""Whether an optimized torch graph computes what the captured one does.

The torch.compile backend checks each optimized part, and the assembled graph, against the
original on the example inputs and on random ones of the same shapes (`disagreement`).
Outputs in float32 are held to `verdicts.equivalence.SAME_FUNCTION`. Outputs in half precision
(float16, bfloat16) are judged against the original computed in float32 (`widened`: every
half-precision constant, input and dtype argument made float32): the optimized output may
land at most HALF_ERROR_FACTOR times as far from that as the original output does. A rewrite
that sums in another order, or a fused kernel that keeps its scores in float32 (attention),
moves a bfloat16 output by a few of its 8-bit ulps, which float32's bounds would call wrong;
a wrong rewrite lands much further from the float32 computation than the model's own
rounding does.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch
import torch.fx as fx

from graphsub.targets.torch.arrays import to_numpy
from graphsub.verdicts.equivalence import SAME_FUNCTION, Tolerance, compare_outputs

log = logging.getLogger("graphsub.torch_compile")

#: torch's half-precision types.
HALF = (torch.float16, torch.bfloat16)
#: How much further from the float32 computation than the original a half-precision output
#: may land (the fuzzer's factor for ONNX models: graphsub.fuzz.differential).
HALF_ERROR_FACTOR = 4


def disagreement(original: Callable[..., Any], optimized: Callable[..., Any],
                 checks: Sequence[Sequence[Any]], positions: Sequence[int], rtol: float,
                 trials: int = 2) -> str | None:
    """Where the optimized module's outputs differ from the original's (None: they agree), on
    each set of arguments in `checks` and on random ones of the same shapes in `positions`."""
    gen = torch.Generator().manual_seed(0)
    for args in checks:
        for trial in range(trials + 1):
            run_args = list(args)
            if trial:
                for i in positions:
                    a = args[i]
                    if isinstance(a, torch.Tensor) and a.is_floating_point() \
                            and 0 not in a.stride():  # (a broadcast input stays as it is)
                        # in the argument's layout: a graph traced without functionalization
                        # views its inputs, and a view needs the strides it was traced with
                        random = torch.randn(a.shape, generator=gen, dtype=a.dtype)
                        run_args[i] = restrided(random.to(a.device), tuple(a.stride()))
            problem = compared(original, optimized, run_args, rtol)
            if problem is not None:
                return problem if len(checks) == 1 else f"{problem} (at {shapes(args)})"
    return None


def compared(original: Callable[..., Any], optimized: Callable[..., Any], args: Sequence[Any],
             rtol: float) -> str | None:
    """What is wrong with the optimized module's outputs on these arguments (None: nothing)."""
    with torch.no_grad():
        want = _as_tuple(original(*args))
        got = _as_tuple(optimized(*args))
    tolerance = replace(SAME_FUNCTION, rtol=rtol)
    half = [i for i, w in enumerate(want) if isinstance(w, torch.Tensor) and w.dtype in HALF]
    truth = _widened_outputs(original, args) if half else None
    if half and truth is None:  # held to float32's tolerance made for their precision
        tolerance = tolerance.for_precision(str(want[i].dtype).removeprefix("torch.")
                                            for i in half)
    diffs, problems = compare_outputs(
        {f"output {k}": to_numpy(w) for k, w in enumerate(want) if k not in half or truth is None},
        {f"output {k}": to_numpy(g) for k, g in enumerate(got)}, tolerance)
    if problems:
        return problems[0]
    wrong = [d for d in diffs if not d.ok]
    if wrong:
        return wrong[0].describe()
    if truth is not None:
        for k in half:
            problem = _half_problem(f"output {k}", want[k], got[k], truth[k], tolerance)
            if problem is not None:
                return problem
    return None


def _half_problem(name: str, want: torch.Tensor, got: Any, truth: torch.Tensor,
                  tolerance: Tolerance) -> str | None:
    """Whether a half-precision output lands as close to the float32 computation as the
    original's does (within HALF_ERROR_FACTOR times, plus float32's tolerance)."""
    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        return f"{name} has shape {tuple(getattr(got, 'shape', ()))}, expected {tuple(want.shape)}"
    if got.dtype != want.dtype:
        return f"{name} is {got.dtype}, expected {want.dtype}"
    exact = truth.detach().to("cpu", torch.float64)
    mine = want.detach().to("cpu", torch.float64)
    theirs = got.detach().to("cpu", torch.float64)
    if bool((torch.isnan(theirs) & ~torch.isnan(mine)).any()):
        return f"{name} has NaN where the original has none"
    finite = torch.isfinite(exact) & torch.isfinite(mine)
    if not bool(finite.any()):
        return None
    noise = float((mine - exact)[finite].abs().max())
    off = (theirs - exact)[finite].abs()
    allowed = HALF_ERROR_FACTOR * noise + tolerance.atol_for(exact[finite].numpy())
    worst = float(off.max())
    if worst <= allowed:
        return None
    at = int(off.argmax())
    return (f"{name}: {worst:.3g} from the float32 computation where the original is "
            f"{noise:.3g} from it (allowed {allowed:.3g}; expected {float(mine[finite][at]):.6g}, "
            f"got {float(theirs[finite][at]):.6g})")


def _widened_outputs(original: Callable[..., Any], args: Sequence[Any]
                     ) -> tuple[Any, ...] | None:
    """The original's outputs computed in float32 (None where it cannot be widened or does
    not run widened: the half-precision outputs are then held to float32's tolerance made
    for their precision)."""
    if not isinstance(original, fx.GraphModule):
        return None
    try:
        wide = widened(original)
        wide_args = [a.float() if isinstance(a, torch.Tensor) and a.dtype in HALF else a
                     for a in args]
        with torch.no_grad():
            return _as_tuple(wide(*wide_args))
    except Exception as exc:  # noqa: BLE001 - an operator without float32 support
        log.info("the original does not run widened to float32 (%s: %s): half-precision "
                 "outputs are held to a tolerance for their precision", type(exc).__name__, exc)
        return None


def widened(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of the module computing in float32 wherever it computes in half precision:
    every tensor attribute, and every dtype argument of its graphs (casts, factories), of a
    half type is float32 instead. Its inputs must be widened by the caller."""
    wide = copy.deepcopy(gm)
    for module in wide.modules():
        for name, value in list(vars(module).items()):
            if isinstance(value, torch.Tensor) and value.dtype in HALF:
                setattr(module, name, value.float())
        for name, buffer in list(module.named_buffers(recurse=False)):
            if buffer.dtype in HALF:
                module.register_buffer(name, buffer.float())
        for name, param in list(module.named_parameters(recurse=False)):
            if param.dtype in HALF:
                setattr(module, name, torch.nn.Parameter(param.float(), requires_grad=False))
        if isinstance(module, fx.GraphModule):
            for node in module.graph.nodes:
                node.args = _widen_dtypes(node.args)
                node.kwargs = _widen_dtypes(node.kwargs)
            module.recompile()
    return wide


def _widen_dtypes(value: Any) -> Any:
    if isinstance(value, torch.dtype):
        return torch.float32 if value in HALF else value
    if isinstance(value, (list, tuple)):
        return type(value)(_widen_dtypes(v) for v in value)
    if isinstance(value, dict):
        return {k: _widen_dtypes(v) for k, v in value.items()}
    return value


def _as_tuple(outs: Any) -> tuple[Any, ...]:
    return tuple(outs) if isinstance(outs, (tuple, list)) else (outs,)


def restrided(t: Any, stride: tuple[int, ...] | None) -> Any:
    """`t` with the given strides (a copy only where they differ)."""
    if stride is None or not isinstance(t, torch.Tensor) or t.stride() == stride:
        return t
    out = torch.empty_strided(t.shape, stride, dtype=t.dtype, device=t.device)
    return out.copy_(t)


def shapes(args: Sequence[Any]) -> str:
    return ", ".join("x".join(map(str, a.shape)) for a in args
                     if isinstance(a, torch.Tensor) and a.dim())

