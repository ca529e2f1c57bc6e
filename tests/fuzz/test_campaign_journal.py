"""bench/fuzz.py's journal: a campaign longer than one sitting goes on with --resume, and the
report covers every model; a journal from other settings is refused, not mixed in."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--seed", "5", "--jobs", "1", "--algorithms", "greedy", "--pipeline-fraction", "0",
         "--minimize-budget", "0"]


@pytest.fixture(scope="module")
def fuzz() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_fuzz", ROOT / "bench" / "fuzz.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def _campaign(*args: str) -> subprocess.CompletedProcess[str]:
    """bench/fuzz.py as a user runs it (its workers import it by path, so not in-process)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.run([sys.executable, str(ROOT / "bench" / "fuzz.py"), *args, *SMALL],
                          check=False, capture_output=True, text=True, env=env, timeout=600)


def _journal_models(out: Path) -> list[int]:
    lines = [json.loads(line) for line in (out / "journal.jsonl").read_text().splitlines()]
    return [entry["record"]["seed"] for entry in lines[1:] if "record" in entry]


@pytest.mark.slow
def test_resume_checks_only_the_missing_seeds(tmp_path: Path) -> None:
    out = tmp_path / "campaign"
    assert _campaign("--count", "2", "--out", str(out)).returncode == 0
    assert _journal_models(out) == [5, 6]
    resumed = _campaign("--count", "3", "--out", str(out), "--resume")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "2 models already checked" in resumed.stdout
    assert _journal_models(out) == [5, 6, 7]  # 5 and 6 were not checked again
    summary = json.loads((out / "summary.json").read_text())
    assert summary["models"] == 3
    assert summary["stages"]["search:greedy"]["equal"] == 3


@pytest.mark.slow
def test_resume_refuses_other_settings(tmp_path: Path) -> None:
    out = tmp_path / "campaign"
    assert _campaign("--count", "1", "--out", str(out)).returncode == 0
    before = (out / "journal.jsonl").read_text()
    other = _campaign("--count", "2", "--out", str(out), "--resume", "--time-limit", "2")
    assert other.returncode == 2
    assert "cannot resume" in other.stdout and "time_limit" in other.stdout
    assert (out / "journal.jsonl").read_text() == before


def test_resume_without_a_journal_says_so(fuzz: ModuleType, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert fuzz.main(["--count", "1", "--out", str(tmp_path), "--resume", *SMALL]) == 2
    assert "run without --resume" in capsys.readouterr().out


def test_resumed_failures_keep_their_model_for_minimizing(fuzz: ModuleType,
                                                          tmp_path: Path) -> None:
    """A failure journaled in one sitting is minimized (needs its model) in the next."""
    settings = fuzz.parse_args(["--count", "1", "--out", str(tmp_path), *SMALL])
    fuzz.prepare_out(tmp_path)
    first = fuzz.Campaign(settings)
    journal = fuzz.Journal(tmp_path)
    journal.start(first)
    outcome = {"stage": "search:greedy", "status": "wrong", "message": "max abs diff 1.0",
               "seconds": 0.1, "kind": "values differ", "detail": ""}
    record = {"seed": 5, "opset": 17, "nodes": 3, "attempts": 1, "discards": 0,
              "discard_reasons": {}, "model": b"model bytes", "outcomes": [outcome]}
    first.on_done(("check", 5), record, None)
    journal.add_model(first.records[5], first.failures)

    second = fuzz.Campaign(settings)
    fuzz.Journal(tmp_path).resume(second)
    assert list(second.records) == [5]
    assert [f["model"] for f in second.failures] == [b"model bytes"]
    assert [task[1]["seed"] for task in second.minimize_tasks()] == [5]
