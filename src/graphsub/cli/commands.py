"""The `graphsub` commands on a model: info, check, bench, optimize, compare, report, zoo,
targets, algorithms (generate, verify and axioms are in graphsub.cli.generate, explain in
graphsub.cli.explain).

MODEL arguments are an ONNX file or a zoo model spec (`graphsub zoo list`). Every command that
reports figures takes --json for machine-readable output; errors in the input print one clear
line and exit with status 2.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from graphsub.targets import DEFAULT_ORDER, capabilities, target_names
from graphsub.cli.app import (JsonOpt, app, emit_json, err, handle_errors,
                                 out, parse_input_shapes)
from graphsub.errors import GraphsubError
from graphsub.search.registry import DECLARED
from graphsub.progress import StepCount, StepLog, reporting

if TYPE_CHECKING:
    from rich.progress import Progress

    from graphsub.targets import Target
    from graphsub.report.optimize import OptimizeReport
    from graphsub.search.result import SearchProgress

zoo_app = typer.Typer(help="The built-in benchmark models.", no_args_is_help=True)
app.add_typer(zoo_app, name="zoo")

InputShapeOpt = Annotated[
    Optional[list[str]],
    typer.Option("--input-shape", "-s", metavar="NAME=DIMS",
                 help="Fix an input with symbolic dimensions to one shape, e.g. "
                      "x=1x3x224x224 (repeatable); without it they stay symbolic.",
                 rich_help_panel="Model"),
]
InputValueOpt = Annotated[
    Optional[list[str]],
    typer.Option("--input-value", metavar="NAME=VALUE",
                 help="Feed an input this value: sr=16000.",
                 rich_help_panel="Model"),
]
CustomOpsOpt = Annotated[
    Optional[list[Path]],
    typer.Option("--custom-ops", metavar="LIB",
                 help="onnxruntime custom-op library (.so).",
                 rich_help_panel="Model"),
]
ShapeProfileOpt = Annotated[
    Optional[list[str]],
    typer.Option("--shape-profile", metavar="SIZES", help="Sizes of the model's symbolic "
                 "dimensions to measure costs at, e.g. batch=1,seq=128, with a weight after a "
                 "colon (batch=8,seq=512:0.25); repeatable. Default: 1 for batch-like sizes, "
                 "128 for the others.", rich_help_panel="Model"),
]
ThreadsOpt = Annotated[Optional[int], typer.Option(
    "--threads", "-t", metavar="N", help="CPU threads of onnxruntime or torch (default: all "
    "cores).", rich_help_panel="Target")]
TargetOpt = Annotated[Optional[str], typer.Option(
    "--target", metavar="NAME", help=f"Where the model will run: {', '.join(target_names())} "
    f"(default: {DEFAULT_ORDER[0]} with a GPU, else {DEFAULT_ORDER[-1]}).",
    rich_help_panel="Target")]
SplitOpt = Annotated[Optional[int], typer.Option(
    "--split", metavar="N", help="Cut the graph into parts of at most N operators, search them "
    "apart, then the cuts (MetaFlow's graph split; off by default, MetaFlow uses 30).",
    rich_help_panel="Search")]
ExecutorOpt = Annotated[str, typer.Option(
    metavar="NAME", help="Where --split searches parts: process, dask or serial.",
    rich_help_panel="Search")]
TargetOptionOpt = Annotated[Optional[list[str]], typer.Option(
    "--target-option", metavar="NAME=VALUE", help="The target's own, repeatable: "
    + "; ".join(f"{name}: " + ", ".join(f"{o.name}={str(o.default).lower()}"
                                        for o in capabilities(name).options)
                for name in target_names() if capabilities(name).options)
    + " (`graphsub info --targets`).", rich_help_panel="Target")]


def parse_target_options(target: str | None, texts: list[str] | None) -> dict[str, Any]:
    from graphsub.pipeline.settings import parse_target_option

    return dict(parse_target_option(target, text) for text in texts or [])


def make_target(name: str | None, threads: int | None, option_texts: list[str] | None
                ) -> Target:
    """The target named on the command line, with the options given (an option the target
    does not have is refused by the target's registry)."""
    from graphsub.targets import get_target

    return get_target(name, threads=threads, **parse_target_options(name, option_texts))


def parse_input_values(items: list[str] | None) -> dict[str, str]:
    values: dict[str, str] = {}
    for item in items or []:
        name, eq, text = item.partition("=")
        if not eq or not name or not text:
            raise GraphsubError(f"--input-value {item!r} is not NAME=VALUE (e.g. sr=16000)")
        values[name] = text
    return values


def check_output_path(path: Path, option: str, inputs: Sequence[str | Path] = ()) -> None:
    """Refuse, before any work, an output that cannot be written or would replace an input:
    a run that fails at the end, or overwrites the model it read, wastes the user's time or
    their model."""
    if path.is_dir():
        raise GraphsubError(f"{option} {path} is a folder; name the file to write")
    folder = path.parent
    if not folder.is_dir():
        raise GraphsubError(f"cannot write {path}: the folder {folder} does not exist "
                            "(create it first)")
    if not os.access(folder, os.W_OK):
        raise GraphsubError(f"cannot write {path}: the folder {folder} is not writable")
    for source in inputs:
        if path.exists() and os.path.exists(source) and os.path.samefile(source, path):
            raise GraphsubError(f"{option} {path} is the input model {source}; write to "
                                "another file (graphsub never replaces its input)")


@app.command()
@handle_errors
def info(model: Annotated[Optional[str], typer.Argument(help="ONNX file or zoo model.")] = None,
         input_shape: InputShapeOpt = None,
         targets: Annotated[bool, typer.Option(
             "--targets", help="List the execution targets, their options and whether this machine has them.")] = False,
         algorithms: Annotated[bool, typer.Option(
             "--algorithms", help="List the search algorithms and their options.")] = False,
         as_json: JsonOpt = False) -> None:
    """Operators, parameters, FLOPs and bytes moved of a model (or, with --targets, the
    execution targets this machine has; with --algorithms, the searches)."""
    from graphsub.loaded import open_model
    from graphsub.report.summary import human, summarize

    if targets:
        print_targets(as_json)
        return
    if algorithms:
        print_algorithms(as_json)
        return
    if model is None:
        raise GraphsubError("name a model (ONNX file or zoo model), or pass --targets or "
                            "--algorithms")
    loaded = open_model(model, parse_input_shapes(input_shape))
    s = summarize(loaded.graph)
    if as_json:
        emit_json({"model": loaded.label, **s.as_dict()})
        return
    head = Table(title=escape(loaded.label), show_header=False, title_justify="left")
    head.add_column(style="bold")
    head.add_column()
    for io, items in (("inputs", s.inputs), ("outputs", s.outputs)):
        head.add_row(io, escape(", ".join(
            f"{d['name']}: {d['dtype']}[{'x'.join(map(str, d['shape']))}]" for d in items)))
    head.add_row("operators", f"{sum(s.ops.values())} (of {s.nodes} graph nodes: the others "
                              f"are inputs, weights and {s.weight_only_nodes} computed from "
                              "weights alone, folded at export)")
    head.add_row("parameters", f"{human(s.parameters)} ({human(s.parameter_bytes, 'B')})")
    at = s.at_profile
    head.add_row("FLOPs", human(s.flops) + (f" ({human(at['flops'])} at {at['profile']})"
                                            if at else ""))
    head.add_row("bytes moved", human(s.bytes_moved, "B") + (
        f" ({human(at['bytes_moved'], 'B')} at {at['profile']})" if at else ""))
    if s.symbols:
        head.add_row("sizes", ", ".join(f"{n} in {r}" for n, r in s.symbols.items()))
    if s.opset:
        head.add_row("opset", str(s.opset))
    if s.opaque_ops:
        head.add_row("opaque ops", escape(", ".join(f"{k} x{v}" for k, v in s.opaque_ops.items())))
    head.add_row("hash", s.structural_hash)
    out.print(head)
    print_counts("operators", "op", "count", s.ops)


def print_targets(as_json: bool) -> None:
    from graphsub.targets import target_statuses

    statuses = target_statuses()
    if as_json:
        emit_json([{**s.__dict__, "options": [
            {"name": o.name, "type": o.kind.__name__, "default": o.default, "help": o.help}
            for o in capabilities(s.name).options]} for s in statuses])
        return
    table = Table(title="execution targets (--target; their options: --target-option "
                  "NAME=VALUE)", title_justify="left")
    for col in ("target", "available", "what it runs", "options"):
        table.add_column(col)
    for st in statuses:
        mark = "[green]yes[/]" + (" (default)" if st.default else "") if st.available else "[red]no[/]"
        options = "\n".join(f"{o.name}={str(o.default).lower()}: {o.help}"
                            for o in capabilities(st.name).options)
        table.add_row(st.name, mark, escape(st.description) + (
            "" if st.available else f"\n[dim]why not: {escape(st.reason)}[/]"),
            escape(options or "threads only"))
    out.print(table)


def _option_text(value: Any) -> str:
    """An option's value as --option takes it."""
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return "none" if value is None else str(value).lower() if isinstance(value, bool) \
        else str(value)


def print_algorithms(as_json: bool) -> None:
    """Every registered search with its options (name, type, default, what it does), as
    their dataclasses declare them."""
    from graphsub.search import ALGORITHMS

    if as_json:
        emit_json([{"name": a.name, "summary": a.summary, "budget_unit": a.budget_unit,
                    "options": [{"name": o.name, "type": o.type_name, "default": o.default,
                                 "least": o.least, "help": o.help} for o in a.option_specs()]}
                   for a in ALGORITHMS.values()])
        return
    table = Table(title="search algorithms (--algorithm; their options: --option NAME=VALUE)",
                  title_justify="left")
    for col in ("algorithm", "what it is", "options"):
        table.add_column(col)
    for a in ALGORITHMS.values():
        options = "\n".join(f"{o.name}={_option_text(o.default)}: {o.help}"
                            for o in a.option_specs())
        table.add_row(a.name, escape(f"{a.summary}; --budget counts {a.budget_unit}"),
                      escape(options or "none"))
    out.print(table)


def print_counts(title: str, key: str, count: str, counts: dict[str, int]) -> None:
    """A two-column table of names and counts."""
    table = Table(title=title, title_justify="left")
    table.add_column(key)
    table.add_column(count, justify="right")
    for name, n in counts.items():
        table.add_row(escape(name), str(n))
    out.print(table)


@zoo_app.command("list")
@handle_errors
def zoo_list(as_json: JsonOpt = False) -> None:
    """List the zoo models."""
    from graphsub import zoo

    models = zoo.models()
    if as_json:
        emit_json([{"name": m.name, "description": m.description, "source": m.source,
                    "params": m.params} for m in models])
        return
    table = Table(title="graphsub zoo", title_justify="left")
    # the name is what a user types: never cut; the description wraps instead
    table.add_column("name", no_wrap=True, min_width=max(len(m.name) for m in models))
    table.add_column("parameters", overflow="fold", max_width=22)
    table.add_column("description", ratio=1)
    for m in models:
        params = ", ".join(f"{k}={v}" for k, v in m.params.items())
        table.add_row(m.name, params, f"{m.description} [dim]({escape(m.source)})[/]")
    out.print(table)
    out.print("Build with parameters as NAME:key=value, e.g. resnet_blocks:n=8")


@zoo_app.command("export")
@handle_errors
def zoo_export(name: Annotated[str, typer.Argument(help="Zoo model, e.g. bert or resnet_blocks:n=8.")],
               output: Annotated[Path, typer.Option("--output", "-o", help="ONNX file to write.")],
               seed: Annotated[int, typer.Option(help="Seed of the random weights.")] = 0,
               opset: Annotated[Optional[int], typer.Option(help="ONNX opset to write (13-23).")] = None
               ) -> None:
    """Write a zoo model as an ONNX file."""
    from graphsub import zoo
    from graphsub.onnx_io import load, save
    from graphsub.report.summary import operator_count

    check_output_path(output, "--output")
    graph = zoo.build(name, seed=seed)
    save(graph, output, opset=opset)
    # counted as `info` and `optimize` count the file (a fused conv-relu is two operators there)
    err.print(f"wrote {escape(str(output))} ({output.stat().st_size / 1e6:.1f} MB, "
              f"{operator_count(load(str(output)))} operators)", highlight=False)


@app.command()
@handle_errors
def check(a: Annotated[str, typer.Argument(help="Reference model (ONNX file or zoo model).")],
          b: Annotated[str, typer.Argument(help="Model to check against it.")],
          input_shape: InputShapeOpt = None, custom_ops: CustomOpsOpt = None,
          rtol: Annotated[Optional[float], typer.Option(
              help="Relative tolerance (default 1e-3, as graphsub optimize verifies).")] = None,
          atol: Annotated[Optional[float], typer.Option(
              help="Absolute tolerance (default: 1e-4 of each output's largest magnitude, as "
                   "graphsub optimize verifies).")] = None,
          trials: Annotated[int, typer.Option(help="Sets of random inputs to try.")] = 3,
          seed: Annotated[int, typer.Option(help="Seed of the random inputs.")] = 0,
          as_json: JsonOpt = False) -> None:
    """Check that two models compute the same outputs (exit 0 only when they do), by
    default under the tolerances `graphsub optimize` verifies its output with."""
    from dataclasses import replace

    from graphsub.loaded import open_model
    from graphsub.runtime.check_sizes import check_bindings
    from graphsub.verdicts.equivalence import SAME_FUNCTION, compare_models

    shapes = parse_input_shapes(input_shape)
    ma, mb = open_model(a, shapes, custom_ops=custom_ops or []), open_model(b, shapes)
    if ma.input_specs() != mb.input_specs():
        raise GraphsubError(f"the models have different inputs: {ma.input_specs()} vs "
                            f"{mb.input_specs()}")
    tolerance = SAME_FUNCTION if rtol is None else replace(SAME_FUNCTION, rtol=rtol)
    if atol is not None:
        tolerance = replace(tolerance, atol=atol, atol_scale=0.0)
    # a model with symbolic sizes is compared at the bindings optimize verifies at
    bindings = check_bindings(ma.graph.facts.symbols, [ma.sizes]) or [{}]
    for sizes in bindings:
        result = compare_models(ma.original, mb.original, ma.input_specs(sizes), tolerance,
                                trials=trials, seed=seed)
        if not result.equivalent:
            break
    if as_json:
        emit_json(result.as_dict())
    else:
        atol_text = (f"atol {tolerance.atol:g}" if not tolerance.atol_scale else
                     f"atol {tolerance.atol_scale:g} of each output's largest magnitude")
        at = (f", at {len(bindings)} bindings of the sizes"
              + (f" (shown: {', '.join(f'{k}={v}' for k, v in sizes.items())})" if sizes else "")
              if bindings != [{}] else "")
        table = Table(title=f"{escape(ma.label)} vs {escape(mb.label)} (rtol "
                            f"{tolerance.rtol:g}, {atol_text}, {trials} input sets{at})",
                      title_justify="left")
        for col in ("output", "max |diff|", "max rel", "worst element", "ok"):
            table.add_column(col)
        for d in result.outputs:
            table.add_row(escape(d.name), f"{d.max_abs:.3g}", f"{d.max_rel:.3g}",
                          f"{list(d.worst_index)}: {d.expected:.6g} vs {d.actual:.6g}",
                          "[green]yes[/]" if d.ok else "[red]no[/]")
        out.print(table)
        for p in result.problems:
            out.print(f"[red]{escape(p)}[/]")
        out.print("[bold green]equivalent[/]" if result.equivalent else "[bold red]NOT equivalent[/]")
    raise typer.Exit(0 if result.equivalent else 1)


@app.command()
@handle_errors
def bench(a: Annotated[str, typer.Argument(help="Model to time (ONNX file or zoo model).")],
          b: Annotated[Optional[str], typer.Argument(help="Second model, timed interleaved with A.")] = None,
          input_shape: InputShapeOpt = None, custom_ops: CustomOpsOpt = None,
          threads: ThreadsOpt = None,
          target: TargetOpt = None, target_option: TargetOptionOpt = None,
          seconds: Annotated[float, typer.Option(help="Minimum timing duration.")] = 3.0,
          as_json: JsonOpt = False) -> None:
    """Latency on a target (onnxruntime with all optimizations by default); two models side
    by side, interleaved, with B's speedup over A as the optimizer confirms one: the median of
    the rounds' ratios, its interval, and whether it clears graphsub's minimum gain."""
    from graphsub.loaded import open_model
    from graphsub.runtime import PairedComparison, random_feeds, time_runnables
    from graphsub.verdicts.speedup import MIN_ROUNDS, decide, highest_load, read_load

    shapes = parse_input_shapes(input_shape)
    models = [open_model(a, shapes, custom_ops=custom_ops or [])] + (
        [open_model(b, shapes)] if b else [])
    if b and models[0].input_specs() != models[1].input_specs():
        raise GraphsubError("the models have different inputs, so they cannot be timed on the "
                            "same data")
    device = make_target(target, threads, target_option)
    feeds = random_feeds(models[0].input_specs())
    with err.status(f"timing on {device.name} ({escape(device.device().describe())})..."):
        runnables = [device.prepare(m.graph, m.original, m.label) for m in models]
        loads = [read_load()]
        timings = time_runnables(runnables, feeds, min_seconds=seconds, min_rounds=MIN_ROUNDS)
        loads.append(read_load())
    result: dict[str, Any] = {"target": device.name, "device": device.device().as_dict(),
                              "threads": threads or os.cpu_count(),
                              "models": [{"model": m.label, **t.as_dict()}
                                         for m, t in zip(models, timings)]}
    if b:
        head_to_head = decide(PairedComparison(timings[0], timings[1]), highest_load(*loads))
        result["speedup"] = head_to_head.speedup
        result["head_to_head"] = head_to_head.as_dict()
        result["same_graph"] = (models[0].graph.structural_hash()
                                == models[1].graph.structural_hash())
    if as_json:
        emit_json(result)
        return
    table = Table(title=f"latency on {device.name}: {device.device().describe()}, side by side",
                  title_justify="left")
    for col in ("model", "median ms", "q1-q3 ms", "min ms", "runs"):
        table.add_column(col, justify="right" if col != "model" else "left")
    for m, t in zip(models, timings):
        table.add_row(escape(m.label), f"{t.median * 1e3:.3f}", f"{t.q1 * 1e3:.3f}-{t.q3 * 1e3:.3f}",
                      f"{t.minimum * 1e3:.3f}", str(len(t.samples)))
    out.print(table)
    if b:
        _print_speedup(models[1].label, models[0].label, result["head_to_head"])
        if result["same_graph"]:
            out.print("A and B compute the same graph: their speedup is this machine's noise, "
                      "and one far from 1 means contention (other work, frequency scaling), "
                      "not a difference between the models")


def _print_speedup(after: str, before: str, head_to_head: dict[str, Any]) -> None:
    """B's speedup over A with its interval, what it decides, and how busy the machine was."""
    from graphsub.verdicts.speedup import MIN_GAIN, describe, describe_contention

    words = {"faster": f"faster by at least {MIN_GAIN:.0%}",
             "not faster": f"not {MIN_GAIN:.0%} faster",
             "undecided": "cannot tell at this noise: time longer (--seconds)",
             "contended": "cannot tell: the machine is busy; time it on a quiet one"}
    out.print(f"speedup of {escape(after)} over {escape(before)}: "
              f"[bold]{escape(describe(head_to_head))}[/], the median of the rounds' ratios: "
              f"{words[head_to_head['decision']]} ({escape(describe_contention(head_to_head))})",
              highlight=False)


def _search_progress(time_limit: float, budget: int | None
                     ) -> tuple[Progress, Callable[[SearchProgress], None]]:
    """A rich progress bar for the search (on stderr), and the callback that drives it."""
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    bar = Progress(SpinnerColumn(), TextColumn("[bold]searching[/]"), BarColumn(),
                   TextColumn("{task.description}"), TimeElapsedColumn(), console=err,
                   transient=True)
    task = bar.add_task("", total=1.0)

    def update(p: SearchProgress) -> None:
        done = max(p.steps / budget if budget else 0.0, p.seconds / time_limit)
        best = "" if p.best_cost is None else f", best {p.best_cost * 1e3:.3f}"
        bar.update(task, completed=min(done, 1.0),
                   description=f"{p.steps} {p.unit}, {p.generated} graphs{best}")

    return bar, update


@contextlib.contextmanager
def counted(what: str, log: StepLog) -> Iterator[None]:
    """A spinner for a step before or after the stages (loading, writing) that shows its
    count as it goes (graphsub.progress), kept in `log` for the report."""
    with err.status(f"{what}...") as status:
        def show(count: StepCount) -> None:
            status.update(f"{escape(what)}... {count.text()}")

        log.forward = show if err.is_terminal else None
        with reporting(log):
            yield


class _Stages:
    """What the run is doing: the search (its progress bar on a terminal), then a spinner
    for the stages after it; one line per stage where stderr is not a terminal (a log must
    show what the minutes went to). An interrupt's message is always a line of its own."""

    def __init__(self, bar: Progress) -> None:
        self.bar = bar
        self.status = err.status("")
        self.calls = 0
        self.message = ""

    def count(self, count: StepCount) -> None:
        """A long step moved (graphsub.progress): its count beside the stage's message."""
        if self.calls >= 2 and err.is_terminal:
            self.status.update(f"{escape(self.message)}... {count.text()}")

    def __call__(self, message: str) -> None:
        self.calls += 1
        self.message = message
        if self.calls == 1:  # the search begins; on a terminal its bar says so
            if not err.is_terminal:
                err.print(f"{escape(message)}...", highlight=False)
            return
        if self.calls == 2:
            self.bar.stop()
            if err.is_terminal:
                self.status.start()
        if message.startswith("interrupted") or not err.is_terminal:
            err.print(f"[yellow]{escape(message)}[/]" if message.startswith("interrupted")
                      else f"{escape(message)}...", highlight=False)
        if err.is_terminal:
            self.status.update(escape(message) + "...")

    def stop(self) -> None:
        self.status.stop()


ALGORITHM_HELP = f"{', '.join(DECLARED)} (`graphsub info --algorithms`)."
OPTION_HELP = ("The algorithm's own, repeatable, e.g. c=1.4 or extractors=ilp,greedy "
               "(`graphsub info --algorithms`).")
TIME_LIMIT_HELP = ("Seconds for the whole run: the search, then timing and verifying (a "
                   "quarter, at least 2 s, unless --measure-limit is given; a chosen "
                   "candidate's verifying may come on top).")
OBJECTIVE_HELP = ("What the search minimizes: latency (default), or latency with peak memory, "
                  "FLOPs or launches, each weighted relative to the input model, e.g. "
                  "latency,memory=0.3 (MetaFlow's multi-objective cost).")
FISSION_HELP = ("Also split the best graph into primitives and choose its kernels (Korch's "
                "linear program): one more candidate.")
PEERS_HELP = "Also time onnxruntime's, onnxscript's and onnxslim's outputs."
ORT_FUSIONS_HELP = ("Also try onnxruntime's com.microsoft fused operators (onnxscript's); "
                    "the output then runs only on onnxruntime.")
RulesOpt = Annotated[Optional[list[Path]], typer.Option(
    "--rules", metavar="FILE", help="Rule file (graphsub .rules or TASO .pb), repeatable: "
    "added to the built-in library (a rule named as a library rule is used in its place).",
    rich_help_panel="Search")]
RulesOnlyOpt = Annotated[bool, typer.Option(
    "--rules-only", metavar="", help="Use the --rules files alone, without the built-in library: the "
    "normal form is then the normal-form rules they declare (none: no normal form).",
    rich_help_panel="Search")]


def make_settings(given: dict[str, Any], option_texts: list[str] | None,
                  objective: str | None) -> Any:
    """The run's Settings from the command line's values (None: the default), with each
    --option NAME=VALUE parsed into the type the algorithm declares."""
    from graphsub.pipeline import Objective, Settings, parse_option

    options = dict(parse_option(given.get("algorithm", "backtracking"), text)
                   for text in option_texts or [])
    values = {k: v for k, v in given.items() if v is not None}
    if objective is not None:
        values["objective"] = Objective.parse(objective)
    return Settings.make(**values, options=options)


def check_rule_files(paths: list[Path] | None, rules_only: bool = False) -> None:
    """Refuse a rule file that is not there, or --rules-only without one, before any work
    (the files' contents are read, and any error in them named with the file and line, when
    the rules load)."""
    if rules_only and not paths:
        raise GraphsubError("--rules-only uses the --rules files alone: give at least one "
                            "(--rules FILE)")
    for path in paths or []:
        if not path.is_file():
            raise GraphsubError(f"rule file {path} does not exist" if not path.exists() else
                                f"rule file {path} is a folder; name the .rules file")


@app.command()
@handle_errors
def optimize(ctx: typer.Context,
             model: Annotated[str, typer.Argument(metavar="MODEL", help="ONNX file, zoo model, or a torch.export program saved as .pt2 (torch.export.save).")],
             output: Annotated[Path, typer.Option("--output", "-o", metavar="FILE", help="Where to write the optimized model (never the input file).")],
             algorithm: Annotated[str, typer.Option(metavar="NAME", help=ALGORITHM_HELP, rich_help_panel="Search")] = "backtracking",
             option: Annotated[Optional[list[str]], typer.Option("--option", "-O", metavar="NAME=VALUE", help=OPTION_HELP, rich_help_panel="Search")] = None,
             alpha: Annotated[Optional[float], typer.Option(metavar="A", help="backtracking: explore graphs up to A x the best cost (1.05).", rich_help_panel="Search")] = None,
             k: Annotated[Optional[int], typer.Option("--k", metavar="K", help="pruning, dpp, sampling, enumeration: longest rewrite sequence (OCGGS's K).", rich_help_panel="Search")] = None,
             node_limit: Annotated[Optional[int], typer.Option("--node-limit", metavar="N", help="eqsat, mcts: most e-nodes (20000; mcts 2000).", rich_help_panel="Search")] = None,
             k_multi: Annotated[Optional[int], typer.Option("--k-multi", metavar="N", help="eqsat: iterations that apply multi-pattern rules (1).", rich_help_panel="Search")] = None,
             budget: Annotated[Optional[int], typer.Option(metavar="N", help="The algorithm's unit of work: graphs expanded (backtracking, greedy: 1000), MCTS iterations per decision (128), e-graph iterations.", rich_help_panel="Search")] = None,
             split: SplitOpt = None, executor: ExecutorOpt = "process",
             rules: RulesOpt = None, rules_only: RulesOnlyOpt = False,
             time_limit: Annotated[float, typer.Option("--time-limit", metavar="SECONDS", help=TIME_LIMIT_HELP, rich_help_panel="Time")] = 60.0,
             measure_limit: Annotated[Optional[float], typer.Option("--measure-limit", metavar="SECONDS", help="Seconds for timing, confirming and verifying after a search of the whole --time-limit.", rich_help_panel="Time")] = None,
             cost: Annotated[str, typer.Option(metavar="NAME", help="Cost model: measured (timed on the target), analytic, compiled (inductor's kernels).", rich_help_panel="Cost")] = "measured",
             objective: Annotated[Optional[str], typer.Option(metavar="TERMS", help=OBJECTIVE_HELP, rich_help_panel="Cost")] = None,
             input_shape: InputShapeOpt = None, input_value: InputValueOpt = None,
             custom_ops: CustomOpsOpt = None,
             shape_profile: ShapeProfileOpt = None, threads: ThreadsOpt = None,
             target: TargetOpt = None, target_option: TargetOptionOpt = None,
             candidates: Annotated[int, typer.Option(metavar="N", help="Best candidates to time end to end.", rich_help_panel="Candidates")] = 3,
             fission: Annotated[bool, typer.Option("--fission/--no-fission", metavar="", help=FISSION_HELP, rich_help_panel="Candidates")] = True,
             ort_fusions: Annotated[bool, typer.Option("--ort-fusions/--no-ort-fusions", metavar="", help=ORT_FUSIONS_HELP, rich_help_panel="Candidates")] = False,
             peers: Annotated[bool, typer.Option("--peers/--no-peers", metavar="", help=PEERS_HELP, rich_help_panel="Candidates")] = True,
             external_data: Annotated[bool, typer.Option("--external-data", metavar="", help="Weights to OUTPUT.data (auto >1 GiB).")] = False,
             report: Annotated[Optional[Path], typer.Option("--report", metavar="FILE", help="Also write the report: report.html (a page with plots) or report.json (its data; `graphsub report` renders it).")] = None,
             package: Annotated[bool, typer.Option("--package", metavar="", help="For a .pt2 program: write the AOTInductor package compiled from the optimized program (aoti_compile_and_package) rather than the program.")] = False,
             as_json: JsonOpt = False) -> None:
    """Optimize a model: search equivalent graphs, keep the fastest measured, verify, write.
    Ctrl-C during the search ends it and goes on to measure what it found; a second Ctrl-C
    stops at once, writing nothing."""
    started = time.perf_counter()
    from graphsub.loaded import open_model
    from graphsub.onnx_io import save
    from graphsub.optimizer import VerificationError, optimize_model
    from graphsub.pipeline import load_rule_files
    from graphsub.report.files import report_format, save_report

    settings = make_settings(dict(
        algorithm=algorithm, alpha=alpha, k=k, node_limit=node_limit, k_multi=k_multi,
        budget=budget, split=split, executor=executor, time_limit=time_limit,
        measure_limit=measure_limit, cost=cost, threads=threads, target=target,
        target_options=parse_target_options(target, target_option), candidates=candidates,
        fission=fission, ort_fusions=ort_fusions, peers=peers, shape_profile=tuple(shape_profile or ()),
        external_data=True if external_data else None),
        option, objective)
    check_output_path(output, "--output", [model])
    if report is not None:
        report_format(report)
        check_output_path(report, "--report", [model])
        if report.resolve() == output.resolve():
            raise GraphsubError("--report and --output name the same file; give two names")
    check_rule_files(rules, rules_only)
    from graphsub.cli.exported import is_exported, optimize_program_file

    if is_exported(model):
        optimize_program_file(model, output, time_limit=time_limit, target=target,
                              rules=[str(r) for r in rules or []], package=package,
                              report=report, as_json=as_json, command=command_line(ctx))
        return
    if package:
        raise GraphsubError("--package is for torch.export programs (.pt2); an ONNX model is "
                            "written as ONNX")
    shapes = parse_input_shapes(input_shape)
    loading = StepLog()
    with counted("loading the model", loading):
        loaded = open_model(model, shapes, parse_input_values(input_value), custom_ops or [])
    with err.status("loading and checking rules..."):
        rule_set = load_rule_files(rules or [], rules_only)
    bar, update = _search_progress(time_limit, budget)
    stages = _Stages(bar)
    try:
        with bar, reporting(stages.count):
            try:
                data, rep = optimize_model(loaded, rules=rule_set, settings=settings,
                                           progress=update, say=stages, started=started)
            finally:
                stages.stop()
    except VerificationError as exc:
        err.print(f"[bold red]verification failed:[/] {escape(str(exc))}", highlight=False,
                  soft_wrap=True)
        raise typer.Exit(1) from None
    failure = next((n for n in rep.notes if n.startswith("graphsub bug:")), None)
    if failure is not None:
        err.print(f"[bold red]{escape(failure)}[/]", highlight=False, soft_wrap=True)
    with counted(f"writing {output}", loading):
        save(data, output, external_data=True if external_data else None)
    rep = dataclasses.replace(rep, steps={**{k: c.as_dict() for k, c in loading.steps.items()}, **rep.steps},
                  command=command_line(ctx))
    if report is not None:
        with err.status("writing the report..."):
            save_report(rep.as_dict(), report)
    if as_json:
        emit_json(rep.as_dict())
        return
    _print_optimize_report(rep, output, report)


@app.command()
@handle_errors
def compare(ctx: typer.Context,
            model: Annotated[str, typer.Argument(metavar="MODEL", help="ONNX file or zoo model.")],
            algorithms: Annotated[str, typer.Option(metavar="NAMES", help="Comma-separated algorithms to run, in order.")] = "backtracking,greedy,pruning,dpp,sampling",
            time_limit: Annotated[float, typer.Option("--time-limit", metavar="SECONDS", help="Search time limit per algorithm.")] = 10.0,
            cost: Annotated[str, typer.Option(metavar="NAME", help="Cost model: analytic (deterministic: search times compare fairly) or measured (operators timed once, for whichever algorithm prices them first).")] = "analytic",
            k: Annotated[int, typer.Option("--k", metavar="K", help="Longest rewrite sequence for pruning, dpp and sampling (OCGGS's K).")] = 10,
            split: SplitOpt = None, rules: RulesOpt = None, rules_only: RulesOnlyOpt = False,
            input_shape: InputShapeOpt = None, threads: ThreadsOpt = None, target: TargetOpt = None,
            report: Annotated[Optional[Path], typer.Option("--report", metavar="FILE", help="Also write the comparison: compare.html (OCGGS's figures: cost against search time, final costs) or compare.json (the data).")] = None,
            as_json: JsonOpt = False) -> None:
    """Run the search algorithms on one model under one cost model and compare what they
    find (final cost, search time, graphs expanded), as OCGGS's section 6 tables do."""
    from graphsub.loaded import open_model
    from graphsub.compare import check_algorithms, compare_algorithms
    from graphsub.pipeline import Settings, load_rule_files
    from graphsub.report.files import report_format, save_report
    from graphsub.report.optimize import versions

    names = [a.strip() for a in algorithms.split(",") if a.strip()]
    check_algorithms(names)
    settings = Settings.make(time_limit=time_limit, cost=cost, split=split, threads=threads,
                             target=target)
    if k < 1:
        raise GraphsubError(f"--k must be at least 1 (got {k})")
    check_rule_files(rules, rules_only)
    if report is not None:
        report_format(report)
        check_output_path(report, "--report", [model])
    shapes = parse_input_shapes(input_shape)
    loaded = open_model(model, shapes)
    rule_set = load_rule_files(rules or [], rules_only)
    with err.status("") as status:
        runs = compare_algorithms(
            loaded.graph, names, rule_set, settings, k,
            started=lambda a: status.update(f"searching with {a} (up to {time_limit:g} s)..."))
    data = {"model": loaded.label, "target": settings.target_name, "cost": cost,
            "time_limit": time_limit, "k": k, "split": split,
            "runs": [r.as_dict() for r in runs], "command": command_line(ctx),
            "versions": versions()}
    if report is not None:
        with err.status("writing the report..."):
            save_report(data, report)
    if as_json:
        emit_json(data)
        return
    best = min(r.final_cost for r in runs)
    table = Table(box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False,
                  title=f"graphsub compare: {escape(loaded.label)}, {cost} cost for "
                        f"{settings.target_name}, {time_limit:g} s each"
                        + (f", split {split}" if split else "")
                        + f"; initial cost {runs[0].initial_cost * 1e3:.4f} ms",
                  title_justify="left")
    for col in ("algorithm", "cost ms", "/best", "gain", "secs", "expanded", "reused",
                "stop"):
        table.add_column(col, justify="left" if col == "algorithm" else "right", no_wrap=True)
    for r in runs:
        matches = r.matches_computed + r.matches_reused
        table.add_row(r.algorithm, f"{r.final_cost * 1e3:.4f}",
                      f"{r.final_cost / best:.3f}" if best else "", f"{r.improvement:.2f}x",
                      f"{r.seconds:.1f}", str(r.explored),
                      f"{r.matches_reused / matches:.0%}" if matches else "", r.stopped_by)
    out.print(table)
    out.print("[dim]gain: initial / final cost; reused: matches carried over from a parent "
              "graph instead of matched again (--json has every count)[/]")
    if report is not None:
        out.print(f"Wrote the comparison to {escape(str(report))}.", highlight=False)


@app.command("report")
@handle_errors
def render_report(saved: Annotated[Path, typer.Argument(help="A report saved as JSON by `graphsub optimize --report` or `graphsub compare --report`.")],
                  output: Annotated[Path, typer.Option("--output", "-o", help="The HTML page to write (one self-contained file).")]) -> None:
    """Render a saved JSON report as an HTML page with plots."""
    from graphsub.report.files import load_report, report_format, save_report

    if report_format(output, "--output") != "html":
        raise GraphsubError(f"--output {output}: give a .html file (the report is already JSON)")
    check_output_path(output, "--output", [str(saved)])
    data = load_report(saved)
    with err.status("drawing the report..."):
        save_report(data, output)
    out.print(f"Wrote {escape(str(output))}.", highlight=False)


def command_line(ctx: typer.Context) -> list[str]:
    """The running command as a command line that repeats it, for reports: its arguments and
    every option given a value other than its default (rebuilt from what was parsed, so that
    it reads the same from a shell, a script or a test)."""
    words = ["graphsub", ctx.info_name or ""]
    for param in ctx.command.params:
        value = ctx.params.get(param.name)
        if value is None or value == param.default or param.name == "as_json":
            continue
        if param.param_type_name == "argument":
            words.append(str(value))
        elif getattr(param, "is_flag", False):
            names = param.opts if value else param.secondary_opts
            words += names[:1]
        else:
            for item in value if isinstance(value, (list, tuple)) else [value]:
                words += [param.opts[0], str(item)]
    return words


def _print_optimize_report(rep: OptimizeReport, output: Path, report: Path | None) -> None:
    from graphsub.report.words import stopped
    from graphsub.verdicts.speedup import describe

    table = Table(title=f"graphsub optimize: {escape(rep.model)} on {rep.target} "
                        f"({escape(rep.device['name'])})", title_justify="left")
    for col in ("", "before", "after", "change"):
        table.add_column(col, justify="right" if col else "left")
    pb, pa = rep.predicted_ms_before, rep.predicted_ms_after
    if not math.isnan(pb):  # NaN: interrupted before the input graph was priced
        table.add_row(f"predicted cost ({rep.settings['cost']}, ms)", f"{pb:.3f}", f"{pa:.3f}",
                      f"{pb / pa:.3f}x" if pa else "")
    if rep.latency_before_ms is not None:
        table.add_row(f"measured latency ({rep.target}, ms, median round)",
                      f"{rep.latency_before_ms:.3f}", f"{rep.latency_after_ms:.3f}", "")
    c = rep.confirmation
    if c:  # the statistic the decision used: the median of the rounds' ratios
        table.add_row(f"head to head, candidate {c['candidate']} against the original",
                      "", "", f"[bold]{escape(describe(c))}[/], {c['decision']}")
    table.add_row("operators", str(rep.nodes_before), str(rep.nodes_after), "")
    s = rep.search
    if "egraph" in s:  # eqsat, mcts: an e-graph grown by rule applications
        eg = s["egraph"]
        steps = (f"{len(eg['decisions'])} MCTS decisions" if "mcts" in eg
                 else f"{eg['iterations']} iterations")
        table.add_row("search", f"{s['seconds']:.1f} s", steps,
                      f"{eg['nodes']} e-nodes, {eg['applications']} rewrites, "
                      f"{stopped(s['stopped_by'])}")
    else:
        table.add_row("search", f"{s['seconds']:.1f} s", f"{s['explored']} expanded",
                      f"{s['generated']} graphs, {stopped(s['stopped_by'])}")
    if "split" in s:
        sp = s["split"]
        table.add_row("split", f"{sp['parts']} parts", f"sizes {sp['part_sizes']}",
                      f"{sp['matches_cut']} matches cut, {sp['boundary_regions']} regions "
                      "searched at the cuts")
    if rep.fission:
        f = rep.fission
        split = (", ".join(f"{n} {op}" for op, n in f["split"].items())
                 or "no operator split into primitives")
        library = sum(k["count"] for k in f["kernels"])
        table.add_row("fission", f"{f['seconds']:.1f} s", split,
                      f"{f['primitives']} primitives, {library} kernel(s) computing several "
                      "of them chosen from "
                      f"{sum(f['candidates'].values())} candidates ({f['status']})"
                      + ("; kept" if f["kept"] else ""))
    if rep.shapes:
        sh = rep.shapes
        table.add_row("sizes", ", ".join(f"{n} {r}" for n, r in sh["symbols"].items()),
                      "measured at " + "; ".join(sh["profile"])
                      + (f" ({sh['profile_source']})" if sh.get("profile_source", "given") != "given"
                         else ""),
                      f"verified at {len(sh['verified_at'])} bindings" if sh["verified_at"]
                      else "kept symbolic in the written model")
    t = rep.seconds
    stages = [(k, v) for k, v in t.items() if k not in ("total", "time_limit", "measure_limit")]
    half = (len(stages) + 1) // 2
    table.add_row("time (s)", ", ".join(f"{k} {v:.1f}" for k, v in stages[:half]),
                  ", ".join(f"{k} {v:.1f}" for k, v in stages[half:]),
                  f"total {t['total']:.1f} of {t['time_limit']:g}"
                  + (f" + {t['measure_limit']:g}" if t["measure_limit"] is not None else ""))
    if rep.steps:
        work = [f"{name} {StepCount(name, **c).text()}" for name, c in rep.steps.items()]
        table.add_row("work", ", ".join(work[:2]), ", ".join(work[2:4]), ", ".join(work[4:]))
    out.print(table)
    if rep.rules_used:
        print_counts("rules applied", "rule", "times", rep.rules_used)
    for note in rep.notes:
        out.print(f"[yellow]note:[/] {escape(note)}", highlight=False)
    colour = "green" if rep.outcome == "faster" else "yellow"
    out.print(f"[{colour}]{escape(rep.verdict)}[/]", highlight=False)
    what = "the optimized model" if not rep.kept_original else "the original model, unchanged,"
    out.print(f"Wrote {what} to {escape(str(output))}"
              + (f"; the report to {escape(str(report))}." if report is not None else "."),
              highlight=False)
    out.print("[dim]Predicted costs are sums of one-operator timings (or of a roofline model); "
              "the measured latency of the whole model can differ, which is why candidates "
              "are timed before one is kept.[/]")


def version_callback(value: bool) -> None:
    if value:
        from graphsub import __version__

        out.print(f"graphsub {__version__}")
        raise typer.Exit()


@app.callback()
def root(version: Annotated[bool, typer.Option("--version", callback=version_callback,
                                               is_eager=True, help="Show the version.")] = False
         ) -> None:
    """graphsub: a tensor-graph superoptimizer for ONNX models."""
