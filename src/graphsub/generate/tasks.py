"""The whole generator, as independent tasks: enumerate, pair, prune, verify, write.

1. Enumeration is split by family and by first operator (the first operator of a graph's
   canonical order owns it), in chunks. Each task streams its graphs' fingerprints and
   encodings to disk, partitioned into shards by fingerprint, so no process ever holds the
   whole table (TASO's stated limit, section 9).
2. Pairing runs one task per shard: of the pairs of graphs that share a fingerprint, one per
   input renaming is kept (`renaming`), replayed with float inputs, tested, and the survivors
   written as rules.
3. Pruning (section 4) runs here, on the candidate rules.
4. Checking and verification run one task per batch of rules: each rule is checked
   numerically as `graphsub optimize` will check it on loading, and proven with Z3 from the
   operator axioms.
"""

from __future__ import annotations

import dataclasses
import pickle
import resource
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from graphsub.generate.candidates import group_pairs, pair_candidates, to_rule
from graphsub.generate.config import Family, families
from graphsub.generate.enumerate import Encoded, Enumerator, GenGraph
from graphsub.executors import Executor, SerialExecutor
from graphsub.generate.opset import DEFAULT_OPS
from graphsub.generate.prune import PruneReport, prune
from graphsub.generate.renaming import is_representative, variable_classes
from graphsub.rules.ast import Rule
from graphsub.rules.parser import parse_rules, print_rule
from graphsub.rules.check import RuleCheckError, check_rule
from graphsub.rules.taso import ungrouped_conditions
from graphsub.proofs.prover import verify_rule

Progress = Callable[[str, int, int], None]  # (stage, done, total)
FLUSH_EVERY = 20_000  # records buffered per enumeration task before they go to disk


@dataclass
class GenerationReport:
    """What a generation run did, stage by stage."""

    max_ops: int
    ops: tuple[str, ...]
    graphs: dict[str, dict[int, int]] = field(default_factory=dict)  # family -> size -> count
    groups_tested: int = 0
    candidates: int = 0
    prune: PruneReport | None = None
    verdicts: dict[str, tuple[str, float, str]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    peak_rss_mb: float = 0.0
    workers: int = 1
    candidate_rules: list[Rule] = field(default_factory=list, repr=False)  # before pruning
    dropped: dict[str, str] = field(default_factory=dict)  # rule -> why it failed to check, text
    rules: int = 0  # rules written

    @property
    def status_counts(self) -> dict[str, int]:
        counts = {"proven": 0, "tested": 0, "refuted": 0, "unknown": 0}
        for status, _, _ in self.verdicts.values():
            counts[status] = counts.get(status, 0) + 1
        return counts

    def to_dict(self) -> dict[str, Any]:
        return {
            "max_ops": self.max_ops, "ops": list(self.ops), "workers": self.workers,
            "graphs": {f: {str(k): v for k, v in sorted(c.items())} for f, c in self.graphs.items()},
            "groups_tested": self.groups_tested, "candidates": self.candidates,
            "pruning": self.prune.counts if self.prune else [],
            "dropped_by_numeric_check": len(self.dropped),
            "rules": self.rules, "verification": self.status_counts,
            "seconds": {k: round(v, 2) for k, v in self.seconds.items()},
            "peak_rss_mb": round(self.peak_rss_mb, 1),
        }


# ---- tasks (module-level functions, so that process pools and Dask can ship them) --------------

def _enumerate_task(family: Family, max_ops: int, seed: int, roots: list[bytes], shard_dir: str,
                    task: int, shards: int) -> tuple[str, dict[int, int], float]:
    enum = Enumerator(family.inputs, max_ops, family.ops, seed=seed)
    buffers: list[list[tuple[bytes, Encoded]]] = [[] for _ in range(shards)]
    pending = 0
    paths = [Path(shard_dir) / f"shard-{s:03d}" / f"{family.name}-{task:05d}.pkl"
             for s in range(shards)]
    for p in paths:
        p.unlink(missing_ok=True)  # a retried task starts over

    def flush() -> None:
        for s, buf in enumerate(buffers):
            if buf:
                with open(paths[s], "ab") as f:
                    pickle.dump(buf, f, protocol=pickle.HIGHEST_PROTOCOL)
                buffers[s] = []

    def sink(fp: bytes, enc: Encoded) -> None:
        nonlocal pending
        buffers[fp[0] % shards].append((fp, enc))
        pending += 1
        if pending >= FLUSH_EVERY:
            flush()
            pending = 0

    result = enum.run(sink=sink, roots=roots)
    flush()
    return family.name, result.counts, _rss_mb()


def _read_shard(path: Path) -> dict[tuple[str, bytes], list[Encoded]]:
    groups: dict[tuple[str, bytes], list[Encoded]] = {}
    for f in sorted(path.glob("*.pkl")):
        family = f.name.rsplit("-", 1)[0]
        with open(f, "rb") as fh:
            while True:
                try:
                    chunk = pickle.load(fh)
                except EOFError:
                    break
                for fp, enc in chunk:
                    groups.setdefault((family, fp), []).append(enc)
    return groups


def _pair_task(fams: Sequence[Family], max_ops: int, seed: int,
               shard: str) -> tuple[list[str], int, float]:
    groups = _read_shard(Path(shard))
    by_name = {f.name: f for f in fams}
    enumerators: dict[str, Enumerator] = {}
    classes = {f.name: variable_classes(f.inputs) for f in fams}
    texts: list[str] = []
    tested = 0
    for (family, _), encs in groups.items():
        if len(encs) < 2:
            continue
        tested += 1
        if family not in enumerators:
            fam = by_name[family]
            enumerators[family] = Enumerator(fam.inputs, max_ops, fam.ops, seed=seed)
        enum = enumerators[family]
        # sorted: the same group gives the same rules however the tasks were chunked
        encs = sorted(encs)
        replayed: dict[int, GenGraph] = {}

        def graph(i: int) -> GenGraph:
            if i not in replayed:
                replayed[i] = enum.replay(encs[i])
            return replayed[i]

        for i, j in group_pairs([len(e) for e in encs]):
            if not is_representative(encs[i], encs[j], classes[family], len(enum.inputs)):
                continue  # a renaming of a pair that another shard keeps
            for c in pair_candidates(graph(i), graph(j)):
                rule = to_rule(c, "candidate")
                if rule is not None:
                    texts.append(print_rule(rule))
    return texts, tested, _rss_mb()


# ---- the driver -------------------------------------------------------------------------------

def _chunks(items: Sequence[Any], n: int) -> list[list[Any]]:
    n = max(1, min(n, len(items)))
    return [list(items[i::n]) for i in range(n)]


def generate(max_ops: int, ops: Sequence[str] = DEFAULT_OPS, *, variables: int = 3,
             executor: Executor | None = None, workdir: str | Path | None = None,
             shards: int = 16, seed: int = 0, verify: bool = True, timeout_ms: int = 1_000,
             progress: Progress | None = None) -> tuple[list[Rule], GenerationReport]:
    """Generate, prune and verify substitutions of up to `max_ops` operators per side.

    Returns the rules (named gen-1, gen-2, ...; each doc says whether Z3 proved it) and a
    report with the counts of every stage. The Z3 limit per rule is short by default: proofs
    of generated rules arrive in milliseconds, and the time goes to rules Z3 cannot prove
    (bench/RESULTS.md: a 0.3 s limit proved all but one of the rules 1 s proved)."""
    executor = executor or SerialExecutor()
    fams = families(ops, variables)
    report = GenerationReport(max_ops, tuple(ops), workers=executor.workers)
    tell = progress or (lambda stage, done, total: None)
    own_dir = workdir is None
    root = Path(tempfile.mkdtemp(prefix="graphsub-gen-")) if workdir is None else Path(workdir)
    shard_dir = root / "shards"
    shutil.rmtree(shard_dir, ignore_errors=True)
    for s in range(shards):
        (shard_dir / f"shard-{s:03d}").mkdir(parents=True)
    try:
        start = time.perf_counter()
        tasks = []
        for fam in fams:
            roots = Enumerator(fam.inputs, max_ops, fam.ops, seed=seed).roots()
            for k, chunk in enumerate(_chunks(roots, 8 * executor.workers)):
                tasks.append((fam, max_ops, seed, chunk, str(shard_dir), k, shards))
        for done, (name, counts, rss) in enumerate(executor.run(_enumerate_task, tasks), 1):
            report.peak_rss_mb = max(report.peak_rss_mb, rss)
            total = report.graphs.setdefault(name, {})
            for size, n in counts.items():
                total[size] = total.get(size, 0) + n
            tell("enumerate", done, len(tasks))
        report.seconds["enumerate"] = time.perf_counter() - start

        start = time.perf_counter()
        pair_args = [(fams, max_ops, seed, str(shard_dir / f"shard-{s:03d}")) for s in range(shards)]
        texts: list[str] = []
        for done, (found, tested, rss) in enumerate(executor.run(_pair_task, pair_args), 1):
            report.peak_rss_mb = max(report.peak_rss_mb, rss)
            texts += found
            report.groups_tested += tested
            tell("pair", done, len(pair_args))
        report.seconds["pair"] = time.perf_counter() - start
    finally:
        if own_dir:
            shutil.rmtree(root, ignore_errors=True)
        else:
            shutil.rmtree(shard_dir, ignore_errors=True)

    texts.sort()  # shards finish in any order: make the output deterministic
    rules = [dataclasses.replace(r, name=f"cand-{i}")
             for i, t in enumerate(texts) for r in parse_rules(t, origin="<generated>")]
    report.candidates = len(rules)
    report.candidate_rules = rules

    start = time.perf_counter()
    kept, report.prune = prune(rules, on_progress=lambda step, d, t: tell(step, d, t),
                               executor=executor)
    kept = [dataclasses.replace(r, name=f"gen-{i}", origin="generator")
            for i, r in enumerate(kept, 1)]
    report.seconds["prune"] = time.perf_counter() - start

    start = time.perf_counter()
    texts = [print_rule(r) for r in kept]
    batches = _chunks(texts, max(4 * executor.workers, len(texts) // 50))
    final: dict[str, Rule] = {}
    for done, results in enumerate(executor.run(
            _check_task, [(b, timeout_ms, verify) for b in batches]), 1):
        for text, verdict, dropped in results:
            if text is None:
                report.dropped[dropped[0]] = dropped[1]
                continue
            (rule,) = parse_rules(text, origin="generator")
            final[rule.name] = rule
            if verdict is not None:
                report.verdicts[rule.name] = verdict
        tell("check", done, len(batches))
    report.seconds["check+verify" if verify else "check"] = time.perf_counter() - start
    kept = [final[r.name] for r in kept if r.name in final]
    report.rules = len(kept)
    if verify:
        kept = [_marked(r, report.verdicts[r.name]) for r in kept]
    report.peak_rss_mb = max(report.peak_rss_mb, _rss_mb())
    return kept, report


#: One rule after `_check_task`: its text and Z3's verdict (status, seconds, reason; None
#: when not verifying), or None, None and (name, why) for a rule the check dropped.
_Checked = tuple[str | None, tuple[str, float, str] | None, tuple[str, str] | None]


def _check_task(texts: list[str], timeout_ms: int, verify: bool) -> list[_Checked]:
    """Check each rule numerically as `graphsub optimize` will when it loads the file (a rule
    that fails for grouped convolutions is restricted to ungrouped ones, as TASO's own are),
    then prove it with Z3."""
    out: list[_Checked] = []
    for text in texts:
        (rule,) = parse_rules(text, origin="generator")
        try:
            check_rule(rule)
        except RuleCheckError:
            conditions = ungrouped_conditions(rule.sources)
            restricted = dataclasses.replace(
                rule, conditions=rule.conditions + conditions,
                doc=rule.doc + " (restricted to ungrouped convolutions)")
            try:
                if not conditions:
                    raise
                check_rule(restricted)
            except RuleCheckError as exc:
                out.append((None, None, (rule.name, f"{str(exc).splitlines()[0]}\n{text}")))
                continue
            rule = restricted
        verdict = None
        if verify:  # `graphsub verify`'s decision (its numerical check is the one above)
            v = verify_rule(rule, timeout_ms=timeout_ms, numeric=False)
            if v.status == "refuted":
                out.append((None, None, (rule.name, f"{v.reason}\n{text}")))
                continue
            verdict = (v.status, v.seconds, v.reason)
        out.append((print_rule(rule), verdict, None))
    return out


def _marked(rule: Rule, verdict: tuple[str, float, str]) -> Rule:
    status, seconds, reason = verdict
    mark = (f"verified: proven by Z3 from the operator axioms in {seconds:.2f} s"
            if status == "proven" else f"verified: {reason}" if status == "tested"
            else f"not verified ({status}): {reason}")
    return dataclasses.replace(rule, doc=f"{rule.doc}\n{mark}" if rule.doc else mark)


def _rss_mb() -> float:
    """Peak resident memory of the calling process so far, in MB (tasks report theirs, so the
    report's figure is the largest of the driver and every worker)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rules_text(rules: Sequence[Rule], report: GenerationReport) -> str:
    counts = report.status_counts
    header = (f"# Generated by graphsub generate --max-ops {report.max_ops} "
              f"--ops {','.join(report.ops)}\n"
              f"# {len(rules)} rules: {counts['proven']} proven by Z3, {counts['tested']} "
              f"tested exactly, {counts['unknown']} not verified, {counts['refuted']} "
              "refuted.\n\n")
    return header + "\n\n".join(print_rule(r) for r in rules) + "\n"
