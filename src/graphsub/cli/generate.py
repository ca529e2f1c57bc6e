"""The generator's and verifier's commands: `graphsub generate`, `graphsub verify` and
`graphsub axioms check`, registered on the app of graphsub.cli.app (the package graphsub.cli imports this module)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from graphsub.cli.app import JsonOpt, app, emit_json, err, handle_errors, out
from graphsub.errors import GraphsubError

if TYPE_CHECKING:
    from rich.progress import TaskID

    from graphsub.proofs.prover import Verdict

axioms_app = typer.Typer(help="The operator properties (axioms) the verifier proves rules from.",
                         no_args_is_help=True)
app.add_typer(axioms_app, name="axioms")

ExecutorOpt = Annotated[str, typer.Option(
    "--executor", help="Where tasks run: process (a local pool), dask, or serial.")]
WorkersOpt = Annotated[Optional[int], typer.Option(
    "--workers", "-j", help="Worker processes (default: all cores).")]
SchedulerOpt = Annotated[Optional[str], typer.Option(
    "--scheduler", help="Dask scheduler address (host:port); default: a local cluster on "
                        "127.0.0.1.")]
#: Kept in step with graphsub.generate.opset.OPS (a test checks), so that --help needs no import.
GENERATOR_OPS = ("ewadd, ewmul, smul, relu, transpose, matmul, conv, conv-strided, enlarge, "
                 "avg-pool, max-pool, concat, split, sub, div, exp, reduce-sum")
TimeoutOpt = Annotated[int, typer.Option(
    "--timeout-ms", help="Z3 time limit per rule, in milliseconds.")]


class _StageBar:
    """One rich progress bar per stage, on stderr."""

    def __init__(self) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.bar = Progress(TextColumn("[bold]{task.description:<16}[/]"), BarColumn(),
                            MofNCompleteColumn(), TimeElapsedColumn(), console=err)
        self.tasks: dict[str, TaskID] = {}

    def __call__(self, stage: str, done: int, total: int) -> None:
        if stage not in self.tasks:
            self.tasks[stage] = self.bar.add_task(stage, total=total)
        self.bar.update(self.tasks[stage], completed=done, total=total)


@app.command()
@handle_errors
def generate(max_ops: Annotated[int, typer.Option("--max-ops", "-n", min=1, max=6, help="Most operators per graph (TASO: 3 or 4).")],
             output: Annotated[Path, typer.Option("--output", "-o", help="Rule file to write.")],
             ops: Annotated[Optional[str], typer.Option("--ops", help="Comma-separated generator operators (default: TASO Table 1). Known: " + GENERATOR_OPS + ".")] = None,
             variables: Annotated[int, typer.Option(min=1, max=3, help="Interchangeable tensors of each kind (TASO: 3).")] = 3,
             executor: ExecutorOpt = "process", workers: WorkersOpt = None,
             scheduler: SchedulerOpt = None, timeout_ms: TimeoutOpt = 1_000,
             verify: Annotated[bool, typer.Option("--verify/--no-verify", help="Prove each rule with Z3.")] = True,
             workdir: Annotated[Optional[Path], typer.Option("--workdir", help="Folder for the fingerprint shards (default: a temporary one).")] = None,
             as_json: JsonOpt = False) -> None:
    """Generate substitutions (TASO sections 2-4): enumerate graphs, pair equal fingerprints,
    test, prune, verify with Z3, and write a rule file for `graphsub optimize --rules`."""
    from graphsub.executors import make_executor
    from graphsub.generate.opset import DEFAULT_OPS, OPS
    from graphsub.generate.tasks import generate as run_generate
    from graphsub.generate.tasks import rules_text
    from graphsub.onnx_io.files import write_atomic

    op_list = [o.strip() for o in ops.split(",") if o.strip()] if ops else list(DEFAULT_OPS)
    unknown = sorted(set(op_list) - set(OPS))
    if unknown:
        raise GraphsubError(f"unknown generator operator(s) {', '.join(unknown)}; "
                            f"choose from {', '.join(sorted(OPS))}")
    if not output.parent.exists():
        raise GraphsubError(f"cannot write {output}: folder {output.parent} does not exist")
    ex = make_executor(executor, workers, scheduler)
    stages = _StageBar()
    try:
        with stages.bar:
            rules, report = run_generate(max_ops, op_list, variables=variables, executor=ex,
                                         workdir=workdir, timeout_ms=timeout_ms, verify=verify,
                                         progress=stages)
    finally:
        ex.close()
    write_atomic(rules_text(rules, report).encode(), output)
    if as_json:
        emit_json(report.to_dict())
        return
    table = Table(title=f"generated substitutions, up to {max_ops} operators")
    table.add_column("stage")
    table.add_column("count", justify="right")
    for fam, counts in report.graphs.items():
        table.add_row(f"{fam} graphs", " + ".join(f"{counts[k]:,}" for k in sorted(counts)))
    table.add_row("fingerprint groups tested", f"{report.groups_tested:,}")
    for name, n in report.prune.counts if report.prune else []:
        table.add_row(f"after {name}" if name != "initial" else "candidates", f"{n:,}")
    table.add_row("dropped by the numeric check", f"{len(report.dropped):,}")
    table.add_row("rules written", f"{report.rules:,}")
    if verify:
        statuses = report.status_counts
        table.add_row("  proven by Z3", f"{statuses['proven']:,}")
        table.add_row("  tested exactly", f"{statuses['tested']:,}")
        table.add_row("  not verified", f"{statuses['unknown']:,}")
    out.print(table)
    secs = ", ".join(f"{k} {v:.1f} s" for k, v in report.seconds.items())
    out.print(f"{secs}; peak memory {report.peak_rss_mb:.0f} MB; {report.workers} worker(s)")
    out.print(f"wrote {len(rules)} rules to {output}")


@app.command()
@handle_errors
def verify(rule_file: Annotated[Optional[Path], typer.Argument(help="graphsub .rules file or TASO .pb file (default: the built-in library).")] = None,
           timeout_ms: TimeoutOpt = 10_000, executor: ExecutorOpt = "process",
           workers: WorkersOpt = None, scheduler: SchedulerOpt = None,
           as_json: JsonOpt = False) -> None:
    """Verify every rule of a file (or of the built-in library), as loading does: unknown where
    no instance can be built, refuted where an instance's sides differ, else proven by Z3
    from the operator axioms, else tested exactly at random points (docs/rules.md, "What a
    verdict guarantees"). Exit status 1 when any rule is refuted."""
    from graphsub.executors import make_executor
    from graphsub.proofs.batch import verify_rules
    from graphsub.rules import library_files, load_rules

    files = [rule_file] if rule_file is not None else library_files()
    title = rule_file.name if rule_file is not None else "the built-in library"
    rules = load_rules(files, check=False)
    ex = make_executor(executor, workers, scheduler)
    stages = _StageBar()
    try:
        with stages.bar:
            verdicts = verify_rules(rules, timeout_ms, ex, progress=stages)
    finally:
        ex.close()
    counts = {s: sum(v.status == s for v in verdicts) for s in VERDICTS}
    if as_json:
        emit_json({"file": str(rule_file) if rule_file is not None else "built-in library",
                   "total": len(verdicts), **counts,
                   "rules": [{"name": v.rule, "status": v.status, "evidence": v.evidence,
                              "error_bound": v.error_bound, "seconds": round(v.seconds, 3),
                              "reason": v.reason, "scope": v.scope,
                              "checked_ranks": v.checked_ranks} for v in verdicts]})
    else:
        _print_verdicts(title, verdicts, counts, timeout_ms)
    if counts["refuted"]:
        raise typer.Exit(1)


#: A verdict's statuses, strongest evidence first (proofs.prover.Verdict).
VERDICTS = ("proven", "tested", "refuted", "unknown")


def _print_verdicts(title: str, verdicts: list[Verdict], counts: dict[str, int], timeout_ms: int) -> None:
    """Rules not proven by Z3, grouped by why (a caveat is said once, not per rule), then the
    counts. Rules tested exactly share one row, with the largest chance of a false pass."""
    table = Table(title=f"{title}: rules not proven by Z3")
    for col in ("status", "why", "rules"):
        table.add_column(col)
    groups: dict[tuple[str, str], list[str]] = {}
    tested = [v for v in verdicts if v.status == "tested"]
    for v in verdicts:
        if v.status not in ("proven", "tested"):
            groups.setdefault((v.status, v.reason), []).append(v.rule)
    if tested:
        worst = max(v.error_bound or 0.0 for v in tested)
        groups[("tested", "exact identity test at random integer points (each at most "
                f"{worst:.0e} likely to pass a wrong rule)")] = [v.rule for v in tested]
    for (status, reason), names in groups.items():
        table.add_row(status, reason, f"{len(names)}: {', '.join(names)}")
    if table.row_count:
        out.print(table)
    out.print(f"{len(verdicts)} rules: [green]{counts['proven']} proven[/] by Z3, "
              f"[green]{counts['tested']} tested[/] exactly, [red]{counts['refuted']} refuted[/], "
              f"{counts['unknown']} unknown (Z3 limit {timeout_ms} ms per rule)")
    scopes = sorted({v.scope for v in verdicts if v.scope and v.status == "proven"})
    if scopes:
        out.print("[dim]The axioms model no shapes: a proof holds for "
                  + " | ".join(escape(s) for s in scopes) + " (--json: per rule).[/]")


@axioms_app.command("check")
@handle_errors
def axioms_check(timeout_ms: Annotated[int, typer.Option("--timeout-ms", help="Z3 time limit per consistency or redundancy query, in milliseconds (TASO: 10 s).")] = 10_000,
                 redundancy: Annotated[bool, typer.Option("--redundancy/--no-redundancy", help="Check that no axiom follows from the others (one query per axiom).")] = True,
                 as_json: JsonOpt = False) -> None:
    """Validate the axioms (TASO section 3): each holds on small symbolic tensors for every
    parameter value (Z3 real arithmetic, relu uninterpreted); together they are consistent;
    none follows from the others. Exit status 1 when an axiom is wrong or redundant."""
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn)

    from graphsub.proofs.validate import check_axioms, step_count

    bar = Progress(TextColumn("[bold]axioms[/]"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), TextColumn("{task.description}"), console=err,
                   transient=True)
    steps = step_count(redundancy)
    err.print(f"checking the operator axioms: {steps} steps, each a Z3 query of at most "
              f"{timeout_ms / 1000:g} s (minutes in all at the defaults; --no-redundancy "
              "skips the slowest part)", highlight=False)
    with bar:
        task = bar.add_task("", total=steps)
        report = check_axioms(timeout_ms=timeout_ms, redundancy=redundancy,
                              on_progress=lambda line: bar.update(task, advance=1,
                                                                  description=line))
    data = report.to_dict()
    if as_json:
        emit_json(data)
    else:
        table = Table(title="operator axioms")
        for col in ("axiom", "small tensors", "instances", "redundant?"):
            table.add_column(col)
        redundant = {r.name: r.status for r in report.redundancy}
        for v in report.validations:
            table.add_row(v.name, v.status, str(v.instances), redundant.get(v.name, "not checked"))
        out.print(table)
        val, red = data["validation"], data["redundancy"]
        out.print(f"validation: {val['valid']} valid, {val['invalid']} invalid, "
                  f"{val['unknown']} unknown; consistency: {report.consistency.status} "
                  f"(distinct tensors: {report.consistency.distinct}); redundancy: "
                  f"{red['redundant']} redundant, {red['independent']} independent, "
                  f"{red['unknown']} unknown (timeout {timeout_ms} ms); {report.seconds:.0f} s")
    if not report.ok:
        raise typer.Exit(1)
