"""bench/README.md lists every benchmark script and only those, each with the RESULTS.md
sections it writes, which exist; every script at least compiles (a script nothing imports
breaks unseen otherwise)."""

from __future__ import annotations

import py_compile
import re
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"


def test_the_index_lists_every_script_and_only_those():
    listed = set(re.findall(r"^\| `([\w]+\.py)` \|", (BENCH / "README.md").read_text(), re.M))
    scripts = {p.name for p in BENCH.glob("*.py")}
    assert listed == scripts, (sorted(scripts - listed), sorted(listed - scripts))


def test_the_sections_it_names_are_in_results():
    sections = {line[3:].strip() for line in (BENCH / "RESULTS.md").read_text().splitlines()
                if line.startswith("## ")}
    for row in re.findall(r"^\| `[\w]+\.py` \|.*\| (.*) \|$", (BENCH / "README.md").read_text(),
                          re.M):
        if row.startswith("(a helper"):
            continue
        missing = [name for name in row.split("; ") if name not in sections]
        assert not missing, missing


def test_every_script_compiles(tmp_path):
    for script in sorted(BENCH.glob("*.py")):
        py_compile.compile(str(script), cfile=str(tmp_path / (script.stem + ".pyc")),
                           doraise=True)
