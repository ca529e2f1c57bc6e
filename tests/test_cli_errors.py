"""Bad input and interrupts through the real `graphsub` command, in a subprocess: one line on
stderr, exit status 2, nothing written, before any work; Ctrl-C once ends the search and
goes on, twice stops at once (status 130) writing nothing."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

import graphsub
from graphsub.ir import GraphBuilder
from graphsub.onnx_io import write_atomic

GRAPHSUB = str(Path(sys.executable).with_name("graphsub"))


def graphsub_cmd(*args: str, cwd: Path, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "GRAPHSUB_CACHE_DIR": str(cwd / "cache"), "COLUMNS": "200"}
    return subprocess.run([GRAPHSUB, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env=env, **kw)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("cli")
    b = GraphBuilder(seed=0)
    x = b.input("x", (1, 32))
    b.output(b.relu(b.matmul(b.matmul(x, b.he_weight((32, 64))), b.he_weight((64, 32)))), "y")
    path = folder / "m.onnx"
    graphsub.save(b.build(), path)
    return path


def assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_the_output_may_not_be_the_input(model):
    before = model.read_bytes(), model.stat().st_mtime_ns
    r = graphsub_cmd("optimize", model.name, "-o", f"./{model.name}", cwd=model.parent)
    assert_one_line_error(r, "is the input model", "another file")
    assert (model.read_bytes(), model.stat().st_mtime_ns) == before


@pytest.mark.parametrize("args, fragment", [
    (["--time-limit", "-1"], "--time-limit must be a positive number"),
    (["--time-limit", "nan"], "--time-limit must be a positive number"),
    (["--measure-limit", "0"], "--measure-limit must be a positive number"),
    (["--algorithm", "annealing"], "unknown algorithm 'annealing'"),
    (["--cost", "guess"], "unknown cost model 'guess'"),
    (["--cost", "compiled", "--target", "ort-cpu"], "give a torch target"),
    (["--budget", "0"], "--budget must be at least 1"),
    (["--algorithm", "eqsat", "--alpha", "1.2"], "the eqsat search has no setting alpha"),
    (["--k", "4"], "the backtracking search has no setting k"),
    (["--split", "1"], "--split needs a part size of at least 2"),
    (["--rules", "nowhere.rules"], "rule file nowhere.rules does not exist"),
    (["--rules-only"], "--rules-only uses the --rules files alone: give at least one"),
    (["--target", "tpu"], "unknown target 'tpu'"),
    (["--input-shape", "x"], "--input-shape 'x' is not NAME=DIMS"),
])
def test_bad_settings_are_refused_before_any_work(model, tmp_path, args, fragment):
    out = tmp_path / "out.onnx"
    r = graphsub_cmd("optimize", str(model), "-o", str(out), *args, cwd=tmp_path)
    assert_one_line_error(r, fragment)
    assert not out.exists() and not list(tmp_path.glob("*.onnx*"))


def test_a_missing_output_folder_is_refused_before_the_search(model, tmp_path):
    t0 = time.perf_counter()
    r = graphsub_cmd("optimize", str(model), "-o", "no/such/folder/out.onnx",
                     "--report", "r.json", cwd=tmp_path)
    assert_one_line_error(r, "the folder no/such/folder does not exist")
    assert not (tmp_path / "r.json").exists()
    # Refused at argument checking, not after a search (whose time limit defaults to 60 s).
    assert time.perf_counter() - t0 < 50


def test_report_and_output_must_differ(model, tmp_path):
    r = graphsub_cmd("optimize", str(model), "-o", "a.json", "--report", "a.json", cwd=tmp_path)
    assert_one_line_error(r, "--report and --output name the same file")
    r = graphsub_cmd("optimize", str(model), "-o", "a.onnx", "--report", "a.onnx", cwd=tmp_path)
    assert_one_line_error(r, "give a .json file (the data) or a .html file")


@pytest.mark.parametrize("name", ["m[/b].onnx", "m[bold].onnx", "m[torch].onnx"])
def test_names_with_brackets_are_printed_as_they_are(tmp_path, name):
    """Error text is not rich markup: `[torch]` in an install hint, or a path with `[/b]`,
    must come out literally (it once raised MarkupError, or vanished)."""
    r = graphsub_cmd("info", name, cwd=tmp_path)
    assert_one_line_error(r, name)


def test_outputs_respect_the_umask(model, tmp_path):
    out = tmp_path / "out.onnx"
    r = graphsub_cmd("optimize", str(model), "-o", str(out), "--cost", "analytic",
                     "--time-limit", "4", cwd=tmp_path,
                     preexec_fn=lambda: os.umask(0o027))
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o640
    assert "Wrote " in r.stdout


def test_write_atomic_keeps_an_existing_files_mode(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"old")
    path.chmod(0o604)
    write_atomic(b"new", path)
    assert path.read_bytes() == b"new" and stat.S_IMODE(path.stat().st_mode) == 0o604
    assert [p.name for p in tmp_path.iterdir()] == ["f.bin"]  # no temporary file left


def _start_long_search(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    out = tmp_path / "out.onnx"
    env = {**os.environ, "GRAPHSUB_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.Popen(
        [GRAPHSUB, "optimize", "bert:layers=2,seq=32,hidden=64,heads=4", "-o", str(out),
         "--cost", "analytic", "--budget", "100000000", "--time-limit", "300"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        # as at a terminal: a shell's background job (nohup, `&`) ignores SIGINT, and its
        # children inherit that, so Ctrl-C would never reach the search
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    return proc, out


def _read_until(stream, fragment: str, seen: list[str]) -> None:
    for line in stream:
        seen.append(line)
        if fragment in line:
            return
    raise AssertionError(f"{fragment!r} never came; stderr was: {''.join(seen)}")


@pytest.mark.slow  # a whole run after the interrupt: over a minute on 2 cores
def test_ctrl_c_ends_the_search_and_the_run_goes_on(tmp_path):
    proc, out = _start_long_search(tmp_path)
    seen: list[str] = []
    _read_until(proc.stderr, "searching with backtracking", seen)
    time.sleep(1.0)
    t0 = time.perf_counter()
    proc.send_signal(signal.SIGINT)
    _read_until(proc.stderr, "interrupted: the search stopped", seen)
    stdout, rest = proc.communicate(timeout=120)
    assert proc.returncode == 0, "".join(seen) + rest
    assert time.perf_counter() - t0 < 100  # measured and verified within the reserve, not 300 s
    assert out.exists() and "The search was interrupted" in " ".join(stdout.split())


def test_a_second_ctrl_c_stops_at_once_and_writes_nothing(tmp_path):
    proc, out = _start_long_search(tmp_path)
    seen: list[str] = []
    _read_until(proc.stderr, "searching with backtracking", seen)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    _read_until(proc.stderr, "interrupted: the search stopped", seen)
    proc.send_signal(signal.SIGINT)
    _, rest = proc.communicate(timeout=60)
    assert proc.returncode == 130, "".join(seen) + rest
    assert "nothing was written" in rest and "Traceback" not in rest
    assert not out.exists() and not list(tmp_path.glob("*.onnx*"))


def test_the_targets_table_prints_install_hints_literally(monkeypatch):
    """`pip install 'graphsub[torch]'` in a "why not" cell lost its `[torch]` to rich markup."""
    from typer.testing import CliRunner

    import graphsub.targets as targets
    from graphsub.targets import TargetStatus
    from graphsub.cli import app

    hint = "target torch-cpu needs PyTorch, which is not installed: pip install 'graphsub[torch]'"
    monkeypatch.setattr(targets, "target_statuses", lambda: [
        TargetStatus("ort-cpu", "onnxruntime [CPU]", True, "", True),
        TargetStatus("torch-cpu", "torch [CPU]", False, hint, False)])
    result = CliRunner().invoke(app, ["info", "--targets"], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    assert "pip install 'graphsub[torch]'" in result.stdout and "onnxruntime [CPU]" in result.stdout


@pytest.mark.parametrize("name, content, fragments", [
    ("typo.rules", b"rule x: (relu ?x) => ?x $\n", ("typo.rules:1: unexpected character '$'",)),
    ("open.rules", b"rule bad: (matmul ?x ?w => ?x\n", ("open.rules:1: expected a term",)),
    ("binary.rules", b"\xff\xfe\x00", ("rule file", "binary.rules is not text in UTF-8")),
    ("roles.rules", b"roles: kernels\nrule x: (relu ?x) => ?x\n",
     ("roles.rules:1: unknown role 'kernels'; the roles are normal-form, search",)),
    ("broken.pb", b"garbage", ("broken.pb is not a TASO rule file",)),
])
def test_a_bad_rule_file_is_named_with_what_is_wrong(model, tmp_path, name, content, fragments):
    (tmp_path / name).write_bytes(content)
    r = graphsub_cmd("optimize", str(model), "-o", str(tmp_path / "out.onnx"), "--rules", name,
                     cwd=tmp_path)
    assert_one_line_error(r, *fragments)
    assert not (tmp_path / "out.onnx").exists()


@pytest.mark.parametrize("args, fragment", [
    (["--time-limit", "abc"], "Invalid value for '--time-limit'"),
    (["--candidates", "many"], "Invalid value for '--candidates'"),
    (["--no-such-option"], "No such option: --no-such-option"),
    (["--input-shape", "x=0x16"], "every dimension must be at least 1"),
])
def test_a_value_of_the_wrong_kind_is_one_line_too(model, tmp_path, args, fragment):
    r = graphsub_cmd("optimize", str(model), "-o", str(tmp_path / "out.onnx"), *args,
                     cwd=tmp_path)
    assert_one_line_error(r, fragment)
