"""Rules' evidence kept across runs in the cache folder: the report names the evidence of
every rule a candidate used (proven by Z3, tested exactly, or why neither), and an exact test
of a convolution merge takes a second or more, which every run would pay again. A verdict is
known by the rule's text and by the source of everything that decides it (the axioms, the
prover, the exact evaluator, the operators' semantics), so any change decides it again."""

from __future__ import annotations

import hashlib
import json
import os
from functools import lru_cache
from pathlib import Path

from graphsub.cache import cache_dir

FILE = "rule_evidence.json"


def key(rule_text: str, timeout_ms: int) -> str:
    return hashlib.sha256(f"{_fingerprint()}\n{timeout_ms}\n{rule_text}".encode()).hexdigest()


def stored(rule_key: str) -> str | None:
    """The evidence stored for a rule, if any."""
    return _load(cache_dir() / FILE).get(rule_key)


def store(rule_key: str, evidence: str) -> None:
    """Keep a rule's evidence (written atomically; a read-only cache folder keeps nothing)."""
    path = cache_dir() / FILE
    known = dict(_load(path))
    known[rule_key] = evidence
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(known))
        os.replace(tmp, path)
    except OSError:
        return
    _load.cache_clear()


@lru_cache(maxsize=4)
def _load(path: Path) -> dict[str, str]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # no store yet, or a damaged one: decide again
    return {k: v for k, v in data.items() if isinstance(v, str)} if isinstance(data, dict) else {}


@lru_cache(maxsize=1)
def _fingerprint() -> str:
    package = Path(__file__).resolve().parents[1]
    sources = sorted([*package.joinpath("proofs").glob("*.py"), *package.joinpath("ops").glob("*.py"),
                      package / "runtime" / "reference.py",
                      *(package / "rules" / f"{m}.py" for m in ("check", "matcher", "applier",
                                                                 "expr", "ast", "parser"))])
    h = hashlib.sha256()
    for source in sources:
        h.update(source.read_bytes())
    return h.hexdigest()
