"""Every `type: ignore` in graphsub names the errors it silences and says why: a comment after
it, or a comment line just above (what a reader needs to tell whether it may go)."""

from __future__ import annotations

import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "graphsub"
IGNORE = re.compile(r"#\s*type:\s*ignore(\[[a-z, -]+\])?(.*)$")


def test_every_type_ignore_names_its_codes_and_says_why():
    unexplained = []
    for path in sorted(SRC.rglob("*.py")):
        lines = path.read_text().splitlines()
        for k, line in enumerate(lines):
            found = IGNORE.search(line)
            if found is None:
                continue
            codes, after = found.group(1), found.group(2)
            above = lines[k - 1].strip() if k else ""
            if codes is None or not (after.strip().startswith("#") or above.startswith("#")):
                unexplained.append(f"{path.relative_to(SRC)}:{k + 1}: {line.strip()}")
    assert not unexplained, "type: ignore without codes or a reason:\n" + "\n".join(unexplained)
