"""Differential fuzzing campaign: random valid ONNX models through every graphsub path.

    python bench/fuzz.py --count 500 --seed 0 --time-limit 1
    python bench/fuzz.py --count 50 --seed 7 --algorithms greedy,eqsat --pipeline-fraction 0
        [--out bench/fuzz-failures] [--jobs 2] [--stage-timeout 120]
        [--minimize-seconds 90] [--minimize-budget 900] [--minimize-per-class 3]

Each seed gives one model (graphsub.fuzz.models.random_model), checked by
graphsub.fuzz.differential.check_model: the roundtrip, every search algorithm, the numpy and
torch-cpu backends (on the imported graph and on each search's best graph), and for a fraction
of the models the whole optimize_model pipeline. Models run in a
pool of worker processes; a stage that makes no progress for --stage-timeout seconds has its
worker killed and replaced, and is recorded as a timeout (a hang cannot stop the campaign).

Every failing outcome (wrong, error, timeout, refused) is saved in --out as
seed<S>-<stage>-<status>.onnx (the model) and .json (seed, stage, status, message, kind,
traceback tail). Failures are then minimized (graphsub.fuzz.minimize), one per failure kind
in turn, within --minimize-budget seconds: the smallest model is saved as .min.onnx and, for
a wrong search, the fewest rules that still produce it are named in the .json. The end is a
table of outcomes per stage, the failure classes, and --out/summary.json. --out gets a
.gitignore of its own: nothing in it is for git. The files a previous campaign listed in
--out/summary.json are removed first.

Each finished model is also appended to --out/journal.jsonl (its record and failures), so a
campaign longer than one sitting can stop (Ctrl-C, kill PID) and go on with --resume: the
seeds already in the journal are skipped, and the report covers them all. --resume refuses a
journal written at another commit, with other uncommitted graphsub changes, or with other
settings: the campaign stays one run of one code.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import multiprocessing as mp
import signal
import subprocess
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from graphsub.targets import TargetUnavailableError, get_target
from graphsub.fuzz.classes import generate, model_class
from graphsub.fuzz.differential import (DEFAULT_STAGES, FAILURES, GC_OVERRUN, INHERITED,
                                        STATUSES, check_model, default_rules)
from graphsub.fuzz.minimize import minimize, minimize_rules
from graphsub.fuzz.models import fuzz_sizes
from graphsub.rules import Rule

DEFAULT_OUT = Path(__file__).resolve().parent / "fuzz-failures"


@dataclass(frozen=True)
class Settings:
    count: int
    seed: int
    jobs: int
    time_limit: float
    pipeline_fraction: float
    algorithms: tuple[str, ...] | None
    stage_timeout: float
    minimize_seconds: float
    minimize_budget: float
    minimize_per_class: int
    out: Path
    resume: bool = False
    #: The share of models given a size symbol (graphsub.fuzz.models.symbolize).
    symbolic: float = 0.3
    #: The share of models made into a class people deploy (graphsub.fuzz.classes).
    classes: float = 0.3

    def identity(self) -> dict[str, Any]:
        """The settings a resumed campaign must share with the journal: what decides each
        model's checks (not how many models, workers or minimizations)."""
        return {"seed": self.seed, "time_limit": self.time_limit,
                "pipeline_fraction": self.pipeline_fraction,
                "algorithms": list(self.algorithms) if self.algorithms else None,
                "stage_timeout": self.stage_timeout, "symbolic": self.symbolic,
                "classes": self.classes}


def wants_pipeline(seed: int, fraction: float) -> bool:
    """Whether the seed's model also goes through optimize_model: a draw of its own, so the
    choice does not depend on the order models are checked in."""
    return bool(np.random.default_rng([seed, 2**31]).random() < fraction)


# ---- worker side --------------------------------------------------------------------------

def worker_main(conn: Connection, settings: Settings) -> None:
    """Serve tasks until told to stop (None): ('check', seed) or ('minimize', failure)."""
    default_rules()  # load (and check) the rules once per worker, before the first task
    _warm_and_freeze()
    while True:
        try:
            task = conn.recv()
        except EOFError:  # the supervisor is gone
            return
        if task is None:
            return
        kind, payload = task
        if kind == "check":
            conn.send(("done", check_seed(conn, settings, payload)))
        else:
            conn.send(("done", minimize_failure(conn, settings, payload)))


def _warm_and_freeze() -> None:
    """Import what the checks use (torch for the torch-cpu stage, where it is installed), then
    move every object alive to the garbage collector's permanent generation: a worker holds
    hundreds of thousands of long-lived objects (torch, scipy, onnxruntime, the rules), and
    each full collection during a search walked all of them, 0.2 s of CPU a time, which broke
    1 s time limits late in a campaign (issue 26; bench/RESULTS.md)."""
    try:
        get_target("torch-cpu", threads=1)
    except TargetUnavailableError:
        pass  # no torch here: its stage is skipped
    gc.collect()
    gc.freeze()


def check_seed(conn: Connection, settings: Settings, seed: int) -> dict[str, Any]:
    """Generate the seed's model and check it, reporting each stage as it starts and ends."""
    model, stats = generate(seed, symbolic=settings.symbolic, classes=settings.classes)
    pipeline = wants_pipeline(seed, settings.pipeline_fraction)
    stages = DEFAULT_STAGES + (("pipeline",) if pipeline else ())

    def listener(stage: str, outcome: Any) -> None:
        conn.send(("stage", stage, None if outcome is None else asdict(outcome)))

    report = check_model(model, seed=seed, time_limit=settings.time_limit,
                         algorithms=settings.algorithms, stages=stages, listener=listener)
    return {"seed": seed, "opset": model.opset_import[0].version, "nodes": len(model.graph.node),
            "attempts": stats.attempts, "discards": stats.discards,
            "discard_reasons": dict(stats.reasons), "model": model.SerializeToString(),
            "sizes": fuzz_sizes(model), "class": model_class(model), **report.as_dict()}


def minimize_failure(conn: Connection, settings: Settings,
                     failure: dict[str, Any]) -> dict[str, Any]:
    """The failure's model minimized under the same stage and status (and exception type),
    and for a wrong search the fewest rules that still make it wrong."""
    conn.send(("stage", "minimize", None))
    start = time.perf_counter()
    model = onnx.load_from_string(failure["model"])
    rules = default_rules().rules
    small = minimize(model, lambda m: _still_fails(settings, failure, m, rules),
                     max_seconds=settings.minimize_seconds, seed=failure["seed"])
    culprits: list[str] = []
    _, _, names = failure["kind"].partition("rules ")
    if names and failure["status"] in ("wrong", "error"):
        used = [r for r in rules if r.name in set(names.split(","))]
        if used:
            culprits = [r.name for r in minimize_rules(
                used, lambda subset: _still_fails(settings, failure, small, subset),
                max_seconds=settings.minimize_seconds / 2)]
    return {"model": small.SerializeToString(), "seconds": time.perf_counter() - start,
            "culprit_rules": culprits}


def _still_fails(settings: Settings, failure: dict[str, Any], model: onnx.ModelProto,
                 rules: Sequence[Rule]) -> bool:
    """Whether the model fails the failure's stage the same way (same status; for an error,
    the same exception type) with these rules."""
    stage, status = failure["stage"], failure["status"]
    family, _, algorithm = stage.partition(":")
    # A backend stage that failed on a search's graph needs that search to run first.
    algorithm = algorithm or failure.get("via", "")
    stages = [family] + (["search"] if failure.get("via") else [])
    report = check_model(model, seed=failure["seed"], time_limit=settings.time_limit,
                         algorithms=[algorithm] if algorithm else None, stages=stages,
                         rules=rules)
    o = report.outcome(stage)
    if o is None or o.status != status:
        return False
    return status != "error" or o.kind.split(" ")[0] == failure["kind"].split(" ")[0]


# ---- supervisor side: a pool whose hung workers are replaced -----------------------------

Task = tuple[str, Any]  # ("check", seed) or ("minimize", failure)


@dataclass(frozen=True)
class Problem:
    """Why a task has no result: its worker hung (no stage started or ended for `seconds`)
    or died, in `stage`."""

    what: str
    stage: str
    seconds: float

    def describe(self) -> str:
        if self.what == "hang":
            return f"hang in {self.stage}: killed after {self.seconds:.0f} s without progress"
        return f"crash in {self.stage}: the worker died"


@dataclass
class Slot:
    """One worker process, the task it runs, the stage it is in and when it last spoke."""

    process: Any
    conn: Connection
    task: Task | None = None
    stage: str = ""
    last: float = 0.0


class Pool:
    """Worker processes fed one task at a time. A worker silent for longer than the task's
    timeout (no stage started or ended) is killed and replaced; so is one that dies."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.context = mp.get_context("spawn")
        self.slots = [self._spawn() for _ in range(settings.jobs)]

    def _spawn(self) -> Slot:
        parent, child = self.context.Pipe()
        process = self.context.Process(target=worker_main, args=(child, self.settings), daemon=True)
        process.start()
        child.close()
        return Slot(process, parent)

    def _replace(self, slot: Slot) -> None:
        slot.process.kill()
        slot.process.join()
        self.slots[self.slots.index(slot)] = self._spawn()

    def run(self, tasks: Iterable[Task], timeout: Callable[[Task], float],
            on_stage: Callable[[Task, str, dict | None], None],
            on_done: Callable[[Task, dict | None, Problem | None], None]) -> None:
        """Run the tasks, drawn from `tasks` only when a worker is free (so a generator can
        stop on a budget). on_done(task, result, problem) is called once per task, with
        result None and the problem when its worker hung or died and was replaced."""
        source = iter(tasks)
        exhausted = False
        while True:
            for slot in self.slots:
                if slot.task is None and not exhausted:
                    task = next(source, None)
                    exhausted = task is None
                    if task is not None:
                        slot.task, slot.stage, slot.last = task, "", time.monotonic()
                        slot.conn.send(task)
            busy = [s for s in self.slots if s.task is not None]
            if not busy:
                return
            for conn in wait([s.conn for s in busy], timeout=0.5):
                self._receive(next(s for s in busy if s.conn is conn), on_stage, on_done)
            self._reap_hung(timeout, on_done)

    def _reap_hung(self, timeout: Callable[[Task], float],
                   on_done: Callable[[Task, dict | None, Problem | None], None]) -> None:
        now = time.monotonic()
        for slot in list(self.slots):
            if slot.task is not None and now - slot.last > timeout(slot.task):
                task, stage = slot.task, slot.stage
                self._replace(slot)
                on_done(task, None, Problem("hang", stage or "start-up", now - slot.last))

    def _receive(self, slot: Slot, on_stage: Callable[[Task, str, dict | None], None],
                 on_done: Callable[[Task, dict | None, Problem | None], None]) -> None:
        task = slot.task
        assert task is not None
        try:
            message = slot.conn.recv()
        except (EOFError, OSError):
            self._replace(slot)
            on_done(task, None, Problem("crash", slot.stage or "start-up",
                                        time.monotonic() - slot.last))
            return
        slot.last = time.monotonic()
        if message[0] == "stage":
            slot.stage = message[1]
            on_stage(task, message[1], message[2])
        else:
            slot.task = None
            on_done(task, message[1], None)

    def close(self) -> None:
        """Stop idle workers politely and busy ones (after an interrupt) at once."""
        for slot in self.slots:
            if slot.task is not None:
                slot.process.kill()
                continue
            try:
                slot.conn.send(None)
            except OSError:
                pass
        for slot in self.slots:
            slot.process.join(timeout=10)
            if slot.process.is_alive():
                slot.process.kill()
                slot.process.join()


# ---- the campaign -------------------------------------------------------------------------

def graphsub_version() -> dict[str, Any]:
    """The commit the campaign checked, and the graphsub files changed since (the fuzzer's
    own excepted): what a rerun must match to reproduce it."""
    repo = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", "-C", str(repo), *args], capture_output=True,
                                  text=True, timeout=30).stdout
        except (OSError, subprocess.SubprocessError):
            return ""

    changed = [line[3:] for line in git("status", "--porcelain", "src/graphsub").splitlines()
               if not line[3:].startswith("src/graphsub/fuzz/")]
    diff = git("diff", "HEAD", "--", "src/graphsub", ":!src/graphsub/fuzz") if changed else ""
    return {"commit": git("rev-parse", "--short", "HEAD").strip(), "uncommitted": changed,
            "diff": hashlib.sha256(diff.encode()).hexdigest()[:16] if changed else ""}


@dataclass
class Campaign:
    """What the checks found: a record per model, and the failing outcomes with their files."""

    settings: Settings
    version: dict[str, Any] = field(default_factory=graphsub_version)
    records: dict[int, dict[str, Any]] = field(default_factory=dict)
    failures: list[dict[str, Any]] = field(default_factory=list)
    partial: dict[int, list[dict]] = field(default_factory=lambda: defaultdict(list))
    written: list[str] = field(default_factory=list)

    def on_stage(self, task: Task, stage: str, outcome: dict | None) -> None:
        if task[0] == "check" and outcome is not None:
            self.partial[task[1]].append(outcome)

    def on_done(self, task: Task, result: dict | None, problem: Problem | None) -> None:
        seed = task[1]
        if result is None:
            assert problem is not None
            result = self._hung(seed, problem)
        self.partial.pop(seed, None)
        model = result.pop("model", None)
        self.records[seed] = result
        for outcome in result["outcomes"]:
            if outcome["status"] in FAILURES:
                self._save_failure(seed, outcome, model, result)

    def _hung(self, seed: int, problem: Problem) -> dict[str, Any]:
        """A record for a model whose worker was replaced: the stages it finished, and the
        stage it was in as a timeout (or error, for a crash). The model is regenerated here
        (the generator is deterministic) so that it can be saved."""
        model, stats = generate(seed, symbolic=self.settings.symbolic,
                                classes=self.settings.classes)
        outcomes = self.partial.get(seed, []) + [
            {"stage": problem.stage, "status": "timeout" if problem.what == "hang" else "error",
             "message": problem.describe(), "seconds": round(problem.seconds, 1),
             "kind": f"{problem.what} in {problem.stage}", "detail": ""}]
        return {"seed": seed, "opset": model.opset_import[0].version,
                "nodes": len(model.graph.node), "attempts": stats.attempts,
                "discards": stats.discards, "discard_reasons": dict(stats.reasons),
                "model": model.SerializeToString(), "outcomes": outcomes,
                "notes": [f"{problem.describe()}; the stages after it did not run"]}

    def _save_failure(self, seed: int, outcome: dict, model: bytes | None, record: dict) -> None:
        base = f"seed{seed}-{outcome['stage'].replace(':', '-')}-{outcome['status']}"
        failure = {"seed": seed, "opset": record["opset"], "nodes": record["nodes"],
                   **outcome, "files": {"model": f"{base}.onnx", "json": f"{base}.json"}}
        if model is not None:
            self._write(f"{base}.onnx", model)
        self._write(f"{base}.json", json.dumps(failure, indent=2).encode())
        self.failures.append({**failure, "model": model})

    def _write(self, name: str, data: bytes) -> None:
        (self.settings.out / name).write_bytes(data)
        self.written.append(name)

    def minimize_tasks(self) -> list[Task]:
        """One failure per kind, then a second per kind, ..., up to minimize_per_class each.
        Not minimized: wrong outcomes inherited from a wrong roundtrip (the roundtrip is),
        hangs and crashes (the minimizer would hang with them), and overruns that full
        garbage collections explain (they depend on the worker's heap, not on the model)."""
        groups: dict[tuple, list[dict]] = defaultdict(list)
        for f in self.failures:
            if f["kind"] in (INHERITED, GC_OVERRUN) or f["kind"].startswith(("hang", "crash")) \
                    or f["model"] is None:
                continue
            groups[(f["stage"].split(":")[0], f["status"], f["kind"])].append(f)
        # Timeouts last: their predicate is slow, and noisy on a loaded machine.
        ranked = sorted(groups.values(), key=lambda g: g[0]["status"] == "timeout")
        order = []
        for i in range(self.settings.minimize_per_class):
            order += [g[i] for g in ranked if i < len(g)]
        keys = ("seed", "stage", "status", "kind", "via", "model", "files")
        return [("minimize", {k: f.get(k, "") for k in keys}) for f in order]

    def on_minimized(self, task: Task, result: dict | None, problem: Problem | None) -> None:
        failure = task[1]
        target = next(f for f in self.failures if f["files"] == failure["files"])
        if result is None:
            assert problem is not None
            target["minimized"] = {"problem": problem.describe()}
        else:
            small = onnx.load_from_string(result["model"])
            name = failure["files"]["model"].replace(".onnx", ".min.onnx")
            self._write(name, result["model"])
            target["files"]["minimized"] = name
            target["minimized"] = {"nodes": len(small.graph.node),
                                   "ops": [n.op_type for n in small.graph.node],
                                   "seconds": round(result["seconds"], 1),
                                   "culprit_rules": result["culprit_rules"]}
        saved = {k: v for k, v in target.items() if k != "model"}
        (self.settings.out / failure["files"]["json"]).write_text(json.dumps(saved, indent=2))


def prepare_out(out: Path, resume: bool = False) -> None:
    """Create --out with a .gitignore, and remove the files the last campaign wrote there
    (unless this run resumes it)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / ".gitignore").write_text("*\n")
    if resume:
        return
    summary = out / "summary.json"
    if summary.exists():
        try:
            old = json.loads(summary.read_text()).get("files", [])
        except json.JSONDecodeError:
            old = []
        for name in old:
            path = out / Path(name).name
            if path.exists():
                path.unlink()


class ResumeError(Exception):
    """The journal cannot be continued: the message says why and what to do."""


class Journal:
    """--out/journal.jsonl: a header (the commit and the settings' identity), then a line per
    finished model ({"record", "failures"}) and one per sitting ({"check_seconds"})."""

    def __init__(self, out: Path) -> None:
        self.path = out / "journal.jsonl"

    def start(self, campaign: Campaign) -> None:
        header = {"graphsub": campaign.version, "settings": campaign.settings.identity()}
        self.path.write_text(json.dumps(header) + "\n")

    def resume(self, campaign: Campaign) -> float:
        """Load the finished models into the campaign; return the check seconds so far."""
        if not self.path.exists():
            raise ResumeError(f"no journal to resume at {self.path}: run without --resume")
        lines = [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]
        header, entries = lines[0], lines[1:]
        version, identity = campaign.version, campaign.settings.identity()
        if header["graphsub"]["commit"] != version["commit"]:
            raise ResumeError(f"the journal was written at commit {header['graphsub']['commit']}"
                              f", this is {version['commit']}: check it out to resume")
        if header["graphsub"].get("diff", "") != version["diff"]:
            raise ResumeError("graphsub's uncommitted changes differ from the journal's "
                              f"({', '.join(version['uncommitted']) or 'none now'}): restore "
                              "them to resume")
        if header["settings"] != identity:
            raise ResumeError(f"the journal's settings {header['settings']} differ from "
                              f"these {identity}: pass the same ones")
        seconds = 0.0
        for entry in entries:
            if "check_seconds" in entry:
                seconds += entry["check_seconds"]
                continue
            record = entry["record"]
            campaign.records[record["seed"]] = record
            for failure in entry["failures"]:
                path = campaign.settings.out / failure["files"]["model"]
                model = path.read_bytes() if path.exists() else None
                campaign.failures.append({**failure, "model": model})
                campaign.written += [failure["files"]["json"]] + ([failure["files"]["model"]]
                                                                  if model else [])
        return seconds

    def add_model(self, record: dict[str, Any], failures: list[dict[str, Any]]) -> None:
        entry = {"record": record,
                 "failures": [{k: v for k, v in f.items() if k != "model"} for f in failures]}
        with self.path.open("a") as f:
            f.write(json.dumps(entry) + "\n")

    def add_sitting(self, seconds: float) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({"check_seconds": round(seconds, 1)}) + "\n")


def run_campaign(settings: Settings, console: Console) -> tuple[Campaign, dict[str, float]]:
    campaign = Campaign(settings)
    journal = Journal(settings.out)
    earlier = journal.resume(campaign) if settings.resume else 0.0
    if not settings.resume:
        journal.start(campaign)
    elif campaign.records:
        console.print(f"resuming: {len(campaign.records)} models already checked")
    times: dict[str, float] = {}
    pool = Pool(settings)
    start = time.perf_counter()
    try:
        seeds = [("check", settings.seed + i) for i in range(settings.count)
                 if settings.seed + i not in campaign.records]
        with _progress(console) as progress:
            bar = progress.add_task("models", total=len(seeds), found="")

            def done(task: Task, result: dict | None, problem: Problem | None) -> None:
                before = len(campaign.failures)
                campaign.on_done(task, result, problem)
                journal.add_model(campaign.records[task[1]], campaign.failures[before:])
                progress.update(bar, advance=1, found=_found(campaign.failures))

            pool.run(seeds, lambda task: settings.stage_timeout, campaign.on_stage, done)
        times["check"] = time.perf_counter() - start
        journal.add_sitting(times["check"])
        start = time.perf_counter()
        _minimize_all(settings, campaign, pool, console)
        times["minimize"] = time.perf_counter() - start
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: the report covers the models checked so far"
                      + ("" if "check" in times else "; --resume goes on from here"))
        if "check" not in times:
            times["check"] = time.perf_counter() - start
            journal.add_sitting(times["check"])
    finally:
        pool.close()
    times["check"] += earlier
    return campaign, times


def _minimize_all(settings: Settings, campaign: Campaign, pool: Pool, console: Console) -> None:
    """Minimize failures in the order minimize_tasks gives, starting none after the budget."""
    tasks = campaign.minimize_tasks()
    if not tasks or settings.minimize_budget <= 0:
        return
    deadline = time.monotonic() + settings.minimize_budget
    limit = settings.minimize_seconds * 2 + settings.stage_timeout
    with _progress(console) as progress:
        bar = progress.add_task("minimizing", total=len(tasks), found="")

        def budgeted() -> Iterator[Task]:
            for task in tasks:
                if time.monotonic() >= deadline:
                    return
                yield task

        def done(task: Task, result: dict | None, problem: Problem | None) -> None:
            campaign.on_minimized(task, result, problem)
            progress.update(bar, advance=1)

        pool.run(budgeted(), lambda task: limit, lambda *args: None, done)


def _progress(console: Console) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TextColumn("{task.fields[found]}"), console=console)


def _found(failures: list[dict]) -> str:
    counts = Counter(f["status"] for f in failures)
    return " ".join(f"{s} {counts[s]}" for s in FAILURES if counts[s])


# ---- the report -------------------------------------------------------------------------------

def stage_counts(records: Iterable[dict]) -> dict[str, Counter]:
    counts: dict[str, Counter] = defaultdict(Counter)
    for record in records:
        for o in record["outcomes"]:
            counts[o["stage"]][o["status"]] += 1
    return counts


def failure_classes(failures: list[dict]) -> list[dict[str, Any]]:
    """Failures grouped by likely cause: status, stage family, and what the minimized model
    (or the culprit rules) shows, else the kind the check gave."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for f in failures:
        groups[(f["status"], f["stage"].split(":")[0], _signature(f))].append(f)
    classes = []
    for (status, family, signature), members in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        example = next((m for m in members if "minimized" in m["files"]), members[0])
        classes.append({"status": status, "family": family, "signature": signature,
                        "count": len(members),
                        "stages": dict(Counter(m["stage"] for m in members)),
                        "message": example["message"][:300],
                        "example": example["files"].get("minimized", example["files"]["model"]),
                        "seeds": sorted({m["seed"] for m in members})[:20]})
    return classes


def _signature(failure: dict) -> str:
    if failure["status"] == "timeout":
        return "kind " + failure["kind"]  # how long a model takes is not what shrinking keeps
    mini = failure.get("minimized", {})
    if mini.get("culprit_rules"):
        return "rules " + ",".join(mini["culprit_rules"])
    if mini.get("ops") is not None:
        return "ops " + ",".join(mini["ops"])
    return "kind " + failure["kind"]


def print_report(console: Console, campaign: Campaign, times: dict[str, float]) -> None:
    counts = stage_counts(campaign.records.values())
    table = Table(title=f"graphsub {campaign.version['commit']} fuzz: {len(campaign.records)} "
                        f"models, time limit {campaign.settings.time_limit:g} s")
    table.add_column("stage")
    for s in STATUSES:
        table.add_column(s, justify="right")
    for stage in sorted(counts, key=_stage_order):
        table.add_row(stage, *[str(counts[stage][s] or "") for s in STATUSES])
    console.print(table)
    discards = sum(r["discards"] for r in campaign.records.values())
    reasons = Counter()
    for r in campaign.records.values():
        reasons.update(r["discard_reasons"])
    symbolic = sum(1 for r in campaign.records.values() if r.get("sizes"))
    per_class = Counter(r.get("class") for r in campaign.records.values() if r.get("class"))
    console.print(f"models generated {len(campaign.records)} ({symbolic} with a size symbol, "
                  f"checked at three sizes; {dict(per_class)} of the classes people deploy), "
                  f"discarded and regenerated "
                  f"{discards} ({dict(reasons)}); checking took {times.get('check', 0):.0f} s, "
                  f"minimizing {times.get('minimize', 0):.0f} s")
    classes = failure_classes(campaign.failures)
    if classes:
        ct = Table(title="failure classes")
        for col in ("status", "stage", "count", "signature", "example"):
            ct.add_column(col)
        for c in classes:
            ct.add_row(c["status"], _stages_text(c["stages"]), str(c["count"]),
                       c["signature"][:100], c["example"])
        console.print(ct)


def _stages_text(stages: dict[str, int]) -> str:
    """'search:greedy x2, search:dpp x1' as 'search (greedy 2, dpp 1)'."""
    families: dict[str, list[str]] = defaultdict(list)
    for stage, n in sorted(stages.items(), key=lambda kv: _stage_order(kv[0])):
        family, _, algorithm = stage.partition(":")
        families[family].append(f"{algorithm} {n}" if algorithm else str(n))
    return ", ".join(f"{f} ({', '.join(parts)})" for f, parts in families.items())


def _stage_order(stage: str) -> tuple[int, str]:
    order = {"roundtrip": 0, "search": 1, "numpy": 2, "torch-cpu": 3, "pipeline": 4}
    return order.get(stage.split(":")[0], 9), stage


def write_summary(campaign: Campaign, times: dict[str, float]) -> Path:
    s = campaign.settings
    summary = {
        "graphsub": campaign.version,
        "settings": {**asdict(s), "out": str(s.out)},
        "seconds": {k: round(v, 1) for k, v in times.items()},
        "models": len(campaign.records),
        "discarded": sum(r["discards"] for r in campaign.records.values()),
        "stages": {k: dict(v) for k, v in sorted(stage_counts(campaign.records.values()).items(),
                                                  key=lambda kv: _stage_order(kv[0]))},
        "classes": failure_classes(campaign.failures),
        "failures": [{k: v for k, v in f.items() if k != "model"} for f in campaign.failures],
        "caught": [{"seed": r["seed"], **o} for r in campaign.records.values()
                   for o in r["outcomes"] if o["status"] == "caught"],
        "files": sorted(set(campaign.written)),
    }
    path = s.out / "summary.json"
    path.write_text(json.dumps(summary, indent=2))
    return path


def parse_args(argv: list[str] | None = None) -> Settings:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=100, help="models to generate and check")
    p.add_argument("--seed", type=int, default=0, help="the first seed (seeds S .. S+N-1)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where failures go")
    p.add_argument("--jobs", type=int, default=2, help="worker processes")
    p.add_argument("--pipeline-fraction", type=float, default=0.1,
                   help="fraction of the models that also go through optimize_model")
    p.add_argument("--time-limit", type=float, default=1.0, help="seconds per search")
    p.add_argument("--algorithms", default=None,
                   help="comma-separated search algorithms (default: all of them)")
    p.add_argument("--stage-timeout", type=float, default=120.0,
                   help="seconds a stage may run before its worker is killed")
    p.add_argument("--minimize-seconds", type=float, default=90.0,
                   help="seconds to minimize one failure")
    p.add_argument("--minimize-budget", type=float, default=900.0,
                   help="seconds for all minimizations (0: none)")
    p.add_argument("--minimize-per-class", type=int, default=3,
                   help="failures of one kind to minimize")
    p.add_argument("--symbolic", type=float, default=0.3,
                   help="fraction of the models given a size symbol (checked at three sizes)")
    p.add_argument("--classes", type=float, default=0.3,
                   help="fraction of the models made into control flow, float16, mixed "
                        "precision or QDQ (graphsub.fuzz.classes)")
    p.add_argument("--resume", action="store_true",
                   help="go on with the campaign in --out/journal.jsonl (same commit, settings)")
    a = p.parse_args(argv)
    algorithms = tuple(a.algorithms.split(",")) if a.algorithms else None
    return Settings(a.count, a.seed, a.jobs, a.time_limit, a.pipeline_fraction, algorithms,
                    a.stage_timeout, a.minimize_seconds, a.minimize_budget,
                    a.minimize_per_class, a.out.resolve(), a.resume, a.symbolic, a.classes)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    settings = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)  # kill PID stops the campaign as Ctrl-C does
    console = Console()
    if not console.is_terminal:
        console = Console(width=180)  # a log file: do not fold the tables to 80 columns
    prepare_out(settings.out, settings.resume)
    try:
        campaign, times = run_campaign(settings, console)
    except ResumeError as e:
        console.print(f"[red]cannot resume: {e}")
        return 2
    print_report(console, campaign, times)
    console.print(f"summary: {write_summary(campaign, times)}")
    return 1 if campaign.failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
