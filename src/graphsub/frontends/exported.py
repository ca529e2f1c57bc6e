"""`graphsub.optimize_exported`: a torch.export program in, a torch.export program out.

Models deployed without Python go through `torch.export` and AOTInductor. An
`ExportedProgram` is an FX graph at the ATen level, which is what the torch.compile backend
reads once it has traced dynamo's graph, so the two share their work
(`torch_compile.optimize_traced`, `fx_splice`):

1. the program is functionalized (`run_decompositions({})`: no operator is decomposed; a
   write into a buffer becomes an output, the signature's buffer mutation), and its graph
   is the one graphsub reads, each node its own origin;
2. its parameters, buffers and constants are the constant inputs; the sizes the program
   leaves symbolic stay symbolic (costs measured at the example's sizes and the largest
   checked), and the parts graphsub models are optimized as torch.compile's are;
3. the kept rewrites are spliced into the program's own graph (edited, not rebuilt) and
   checked end to end against it, on the example and at other sizes its constraints allow;
4. the spliced graph is exported again (`torch.export.export` of a module holding the
   program's state under its own names and writing its mutated buffers back), with the same
   dynamic-shape constraints: weights stay weights (a merged q|k|v projection is a new
   parameter, computed once; the weights it replaces leave the program), nothing is
   folded into the graph;
5. the result is checked against the original program, then raced against it under
   AOTInductor (`aoti_compile_and_package`, on the device of the example inputs), and
   returned only where it is faster.

A program graphsub cannot read, or whose result is not faster, is returned unchanged, with
one warning line saying why. `last_report()` says what was done.

    ep = torch.export.export(model, (ids,), dynamic_shapes=({1: torch.export.Dim("seq")},))
    fast = graphsub.optimize_exported(ep, time_limit=30)
    torch._inductor.aoti_compile_and_package(fast, package_path="fast.pt2")
"""

from __future__ import annotations

import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, InputSpec, OutputKind
from torch.utils import _pytree as pytree

from graphsub.errors import GraphsubError
from graphsub.onnx_io.files import write_atomic
from graphsub.frontends.dynamic_trace import input_symbols, range_bound
from graphsub.frontends.fx_equivalence import compared
from graphsub.frontends.fx_origins import traced_with_origins
from graphsub.frontends.side_effects import PrivateInputs, Writes
from graphsub.frontends.torch_compile import (BackendOptions, CompileReport, GraphsubWarning,
                                              _Check, _speedup, _varied, _verified_splice,
                                              optimize_traced)
from graphsub.verdicts.speedup import Decision

#: The input and output kinds of a program graphsub reads.
STATE_KINDS = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)
#: The name of the optimized graph inside the module exported again; the constants it
#: computes (merged weights) are parameters under it.
GRAPH_ATTRIBUTE = "graphsub"

_LAST: list[CompileReport] = []


def last_report() -> CompileReport | None:
    """What the last `optimize_exported` call did (None before the first)."""
    return _LAST[-1] if _LAST else None


def optimize_exported(ep: ExportedProgram, *, example_inputs: tuple[tuple[Any, ...],
                                                                     dict[str, Any]] | None = None,
                      time_limit: float = 20.0, target: str | None = None, race: bool = True,
                      rules: Sequence[str] | None = None, package: str | Path | None = None,
                      **options: Any) -> ExportedProgram:
    """The program with graphsub's kept rewrites spliced in, verified against it and (with
    `race`) faster under AOTInductor; else the program itself, with a warning saying why.
    `example_inputs` (`(args, kwargs)`): what the program is measured and checked on, by
    default those it was exported with. `package`: also write the AOTInductor package of
    what is returned there. `options`: the torch.compile backend's (`algorithm`, `cost`,
    `fission`, `rtol`, the algorithm's own)."""
    opts = BackendOptions.parse({**options, "time_limit": time_limit, "target": target,
                                 "race": race, "rules": list(rules or [])})
    started = time.perf_counter()
    report = CompileReport(opts.target or "", opts.cost_model, mode="aot")
    packages: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="graphsub-aoti-") as scratch:
        try:
            result = _optimize(ep, example_inputs, opts, report, Path(scratch), packages)
        except Exception as exc:  # noqa: BLE001 - the user's program is returned as it was
            report.fallback = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            report.chosen = "original"
            warnings.warn(f"graphsub: the program is returned unchanged: {report.fallback}",
                          GraphsubWarning, stacklevel=2)
            result = ep
        if package is not None:
            built = packages.get(report.chosen) or _compile_package(result, Path(scratch), "out")
            write_atomic(Path(built).read_bytes(), package)  # never half a file
    report.seconds = time.perf_counter() - started
    _LAST[:] = [report]
    return result


@dataclass(frozen=True)
class _Signature:
    """Where the functional program's inputs and outputs come from: the state input positions
    with their kind and name, the user inputs' positions, the outputs that are buffers'
    new values (by position) and the user outputs' positions."""

    state: dict[int, InputSpec]
    users: list[int]
    mutations: dict[int, str]
    outputs: list[int]

    @classmethod
    def of(cls, program: ExportedProgram) -> _Signature:
        signature = program.graph_signature
        state, users = {}, []
        for i, spec in enumerate(signature.input_specs):
            if spec.kind in STATE_KINDS:
                state[i] = spec
            elif spec.kind == InputKind.USER_INPUT:
                users.append(i)
            else:
                raise GraphsubError(f"graphsub does not read programs with {spec.kind.name} "
                                    f"inputs ({spec.arg})")
        mutations, outputs = {}, []
        for i, out in enumerate(signature.output_specs):
            if out.kind == OutputKind.BUFFER_MUTATION and out.target is not None:
                mutations[i] = out.target
            elif out.kind == OutputKind.USER_OUTPUT:
                outputs.append(i)
            else:
                raise GraphsubError(f"graphsub does not read programs with {out.kind.name} "
                                    f"outputs ({out.arg})")
        return cls(state, users, mutations, outputs)


def _optimize(ep: ExportedProgram, example: tuple[tuple[Any, ...], dict[str, Any]] | None,
              opts: BackendOptions, report: CompileReport, scratch: Path,
              packages: dict[str, str]) -> ExportedProgram:
    if example is None:
        example = ep.example_inputs
    if example is None:
        raise GraphsubError("the program carries no example inputs (a program saved by an older "
                            "torch): pass example_inputs=(args, kwargs)")
    args, kwargs = example
    functional = ep.run_decompositions({})
    signature = _Signature.of(functional)
    flat = list(functional._graph_module_flat_inputs(args, kwargs))
    devices = {t.device.type for t in flat if isinstance(t, torch.Tensor)}
    target_name = opts.target or ("torch-cuda" if "cuda" in devices else "torch-cpu")
    report.target = target_name
    device = torch.device("cuda" if "cuda" in devices else "cpu")
    report.writes = sorted(signature.mutations.values())
    program = functional.graph_module
    mutated = set(signature.mutations.values())
    constants = [i for i, spec in signature.state.items() if spec.target not in mutated]
    hints = _hints(program, flat)
    traced = _traced(program, flat, symbolic=hints is not None)
    with torch.no_grad():
        optimized = optimize_traced(traced, flat, constants, hints, target_name, opts, report,
                                    lambda call: max(opts.time_limit - 2 * call, 1.0))
        check = _Check(program, optimized.checks, _varied(optimized.checks, constants),
                       Writes(), opts.rtol)
        spliced = None
        for label, normal in (("graphsub", False), ("normal form", True)):
            rewrites = [rw for o in optimized.outcomes
                        if (rw := o.normal_form if normal else o.rewrite) is not None]
            if rewrites:
                spliced, left_out = _verified_splice(program, rewrites, False,
                                                     optimized.programs, Writes(), check)
                for position, why in left_out.items():
                    report.dropped[f"{label} part {position}"] = why
            if spliced is not None:
                report.chosen = label
                break
    if spliced is None:
        raise GraphsubError("no rewrite was kept: " + ("; ".join(report.dropped.values())
                                                      or "the parts are as fast as they are"))
    result = _exported_again(spliced, functional, signature, args, kwargs)
    user_sets = [pytree.tree_unflatten([c[i] for i in signature.users],
                                       functional.call_spec.in_spec)
                 for c in optimized.checks]
    for call_args, call_kwargs in user_sets:
        problem = _disagreement(ep, result, call_args, call_kwargs,
                                sorted(signature.mutations.values()), opts.rtol)
        if problem is not None:
            raise GraphsubError(f"the program exported again disagrees with the original: "
                                f"{problem}")
    if opts.race:
        _race(ep, result, user_sets, optimized.race_inputs, signature, functional, device,
              report, scratch, packages)
        if report.chosen == "original":
            warnings.warn(f"graphsub: the program is returned unchanged: under AOTInductor "
                          f"the optimized program is not faster ({report.race})",
                          GraphsubWarning, stacklevel=3)
            return ep
    return result


def _traced(program: fx.GraphModule, flat: Sequence[Any], symbolic: bool) -> fx.GraphModule:
    """The program's graph traced again to the ATen operators graphsub reads, as the
    torch.compile backend traces dynamo's (fx_origins): a `linear` becomes its product, the
    attention the kernel the device runs, each value that is a node of the program marked
    with its name. With symbolic sizes, in the program's own shape environment, so that every
    size is an expression over its symbols."""
    if not symbolic:
        return traced_with_origins(program, flat, functional=True)
    from torch._guards import detect_fake_mode

    fakes = [node.meta.get("val") for node in program.graph.find_nodes(op="placeholder")]
    fake_mode = detect_fake_mode(fakes)
    if fake_mode is None:
        raise GraphsubError("the program's symbolic sizes come without a shape environment")
    with fake_mode, torch.no_grad():
        return traced_with_origins(program, fakes, functional=False, tracing_mode="symbolic")


def _hints(program: fx.GraphModule, flat: Sequence[Any]) -> dict[str, int] | None:
    """Each size symbol's value in the example inputs (None: the program has no symbolic
    size)."""
    symbols = input_symbols(program.graph)
    if not symbols:
        return None
    hints: dict[str, int] = {}
    for node, value in zip(program.graph.find_nodes(op="placeholder"), flat):
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and isinstance(value, torch.Tensor):
            for size, real in zip(val.shape, value.shape):
                if isinstance(size, torch.SymInt) and size.node.expr.is_Symbol:
                    hints[size.node.expr.name] = int(real)
    missing = sorted(set(symbols) - set(hints))
    if missing:
        raise GraphsubError(f"the example inputs give no value to the sizes {missing}")
    return hints


# (torch absent, its classes are Any: the ignore is for mypy without the extras)
class _Reexported(torch.nn.Module):  # type: ignore[misc, unused-ignore]
    """The spliced graph as a module torch.export exports again: the program's state under
    its own names (the weights the rewrites no longer read left out), the graph called with
    it and the user's inputs, and the buffers the program writes written back, which export
    turns into its buffer mutations again."""

    def __init__(self, graph: fx.GraphModule, functional: ExportedProgram,
                 signature: _Signature) -> None:
        super().__init__()
        placeholders = list(graph.graph.find_nodes(op="placeholder"))
        kept: list[tuple[int, InputSpec]] = []
        for i, spec in signature.state.items():
            if not placeholders[i].users:  # read no more: a weight merged into another
                graph.graph.erase_node(placeholders[i])
                continue
            kept.append((i, spec))
            assert spec.target is not None
            # (a buffer that is not persistent is among the constants)
            value = functional.state_dict.get(spec.target, functional.constants.get(spec.target))
            owner, name = _owner(self, spec.target)
            if spec.kind == InputKind.PARAMETER:
                owner.register_parameter(name, torch.nn.Parameter(value, requires_grad=False))
            elif spec.kind == InputKind.BUFFER:
                owner.register_buffer(name, value, persistent=spec.persistent is not False)
            else:
                setattr(owner, name, value)
        for name in [n for n in graph._buffers if n.startswith("_graphsub_")]:
            value = graph._buffers.pop(name)  # a weight a rewrite computed: a parameter
            assert value is not None
            graph.register_parameter(name, torch.nn.Parameter(value, requires_grad=False))
        graph.recompile()
        setattr(self, GRAPH_ATTRIBUTE, graph)
        self._state = [spec.target for _, spec in kept]
        self._mutations = signature.mutations
        self._outputs = signature.outputs
        self._out_spec = functional.call_spec.out_spec

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        state = [attrgetter(name)(self) for name in self._state if name is not None]
        flat_user = pytree.tree_flatten((args, kwargs))[0]
        outs = getattr(self, GRAPH_ATTRIBUTE)(*state, *flat_user)
        for position, name in self._mutations.items():
            attrgetter(name)(self).copy_(outs[position])
        return pytree.tree_unflatten([outs[i] for i in self._outputs], self._out_spec)


def _owner(root: torch.nn.Module, target: str) -> tuple[torch.nn.Module, str]:
    """The submodule (made where missing) that holds the state named `target`, and its
    attribute name there."""
    *path, name = target.split(".")
    module = root
    for part in path:
        if not hasattr(module, part):
            module.add_module(part, torch.nn.Module())
        module = getattr(module, part)
    return module, name


def _exported_again(spliced: fx.GraphModule, functional: ExportedProgram,
                    signature: _Signature, args: tuple[Any, ...],
                    kwargs: dict[str, Any]) -> ExportedProgram:
    """The spliced graph as an ExportedProgram with the original's inputs, outputs and
    dynamic-shape constraints."""
    module = _Reexported(spliced, functional, signature)
    placeholders = list(functional.graph_module.graph.find_nodes(op="placeholder"))
    dims: dict[str, torch.export.Dim] = {}
    per_input: list[Any] = []
    for i in signature.users:
        val = placeholders[i].meta.get("val")
        spec: dict[int, Any] | None = None
        if isinstance(val, torch.Tensor):
            for axis, size in enumerate(val.shape):
                if isinstance(size, torch.SymInt):
                    spec = spec or {}
                    spec[axis] = _dim(size, functional, dims)
        per_input.append(spec)
    shapes_args, shapes_kwargs = pytree.tree_unflatten(per_input, functional.call_spec.in_spec)
    dynamic = {"args": tuple(shapes_args), **shapes_kwargs} if dims else None
    try:
        with torch.no_grad():
            return torch.export.export(module, tuple(args), dict(kwargs), dynamic_shapes=dynamic)
    except Exception as exc:  # noqa: BLE001 - torch's own message, on one line
        raise GraphsubError(f"torch.export could not export the optimized program: "
                            f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}") from None


def _dim(size: torch.SymInt, functional: ExportedProgram,
         dims: dict[str, torch.export.Dim]) -> Any:
    """The export Dim of a symbolic size: one per symbol, with the symbol's range."""
    expr = size.node.expr
    if not expr.is_Symbol:
        return torch.export.Dim.AUTO  # a size derived from others: export derives it again
    name = expr.name
    if name not in dims:
        bounds = functional.range_constraints.get(expr)
        low = range_bound(bounds.lower) if bounds is not None else None
        high = range_bound(bounds.upper) if bounds is not None else None
        dims[name] = torch.export.Dim(f"graphsub_{name}", min=low, max=high)
    return dims[name]


def _private(program: ExportedProgram, mutated: Sequence[str]) -> torch.nn.Module:
    """The program as a module of its own: the buffers it writes (`mutated`) are copies (the
    module torch makes shares them with the program and the user's model)."""
    module = program.module()
    for name in mutated:
        owner, attr = _owner(module, name)
        setattr(owner, attr, getattr(owner, attr).clone())
    return module


def _disagreement(original: ExportedProgram, optimized: ExportedProgram,
                  args: tuple[Any, ...], kwargs: dict[str, Any], mutated: Sequence[str],
                  rtol: float) -> str | None:
    """Where the optimized program's outputs, or what it leaves in the buffers it writes
    (`mutated`, by name: in torch.export's training dialect the signature does not say),
    differ from the original's on these inputs (None: nowhere)."""

    def effect(program: ExportedProgram) -> Callable[..., Any]:
        module = _private(program, mutated)

        def call() -> tuple[Any, ...]:
            outs = pytree.tree_flatten(module(*args, **kwargs))[0]
            return tuple(outs) + tuple(attrgetter(name)(module) for name in mutated)
        return call

    return compared(effect(original), effect(optimized), [], rtol)


def _compile_package(program: ExportedProgram, scratch: Path, name: str) -> str:
    with torch.no_grad():
        return str(torch._inductor.aoti_compile_and_package(
            program, package_path=str(scratch / f"{name}.pt2")))


def _race(original: ExportedProgram, optimized: ExportedProgram,
          user_sets: Sequence[tuple[tuple[Any, ...], dict[str, Any]]],
          race_inputs: Sequence[Sequence[Any]], signature: _Signature,
          functional: ExportedProgram, device: torch.device, report: CompileReport,
          scratch: Path, packages: dict[str, str]) -> None:
    """Both programs compiled by AOTInductor and raced on the example inputs (and the largest
    sizes checked, with no margin): report.chosen says which is returned."""
    from torch._inductor import aoti_load_package

    for name, program in (("original", original), ("graphsub", optimized)):
        packages[name] = _compile_package(program, scratch, name)
    loaded = {name: aoti_load_package(path) for name, path in packages.items()}
    faster = True
    sets = [user_sets[0]] + [pytree.tree_unflatten([r[i] for i in signature.users],
                                                   functional.call_spec.in_spec)
                             for r in race_inputs[1:]]
    for k, (args, kwargs) in enumerate(sets):
        def runner(package: Any, a: tuple[Any, ...] = args,
                   kw: dict[str, Any] = kwargs) -> Callable[[], Any]:
            return lambda: package(*a, **kw)

        result = _speedup(runner(loaded["graphsub"]), runner(loaded["original"]),
                          PrivateInputs([], Writes()), device,
                          **({} if k == 0 else {"min_gain": 0.0}))
        report.race["graphsub" if k == 0 else f"graphsub at set {k}"] = round(result.speedup, 4)
        if k == 0:
            report.speedup = result.speedup
        faster = faster and (result.decision is Decision.FASTER if k == 0
                             else result.decision is not Decision.NOT_FASTER)
        if not faster:
            break
    report.chosen = "graphsub" if faster else "original"
