"""Rule files loaded with `graphsub verify`'s decision: what `--rules` and the pipeline read.

`graphsub.rules.load_rules` sits below the prover (docs/architecture.md) and decides by the
numerical check alone; this module hands it the verifier's decision instead, so that a rule
a user gives is loaded where `graphsub verify` would call it proven or tested, and nowhere
else: one decision for verifying, loading, generating and the report.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from graphsub.proofs.prover import verify_rule
from graphsub.rules import load_rules
from graphsub.rules.ast import Rule
from graphsub.rules.check import RuleCheckError

#: Z3's time per rule when a rule file is loaded (`graphsub verify` gives 10 s): a rule Z3
#: cannot prove waits it out before the exact test decides, and a file of them would make
#: a first run wait minutes. The decision is verify's, on this budget.
LOAD_PROOF_MS = 3_000


def verified(rule: Rule) -> None:
    """Raises RuleCheckError for a rule `graphsub verify` would call refuted or unknown."""
    verdict = verify_rule(rule, timeout_ms=LOAD_PROOF_MS)
    if verdict.status == "refuted":
        raise RuleCheckError(verdict.reason if verdict.reason.startswith(f"rule {rule.name} ")
                             else f"rule {rule.name} ({rule.origin}) is wrong: "
                                  f"{verdict.reason}")
    if verdict.status == "unknown":
        raise RuleCheckError(
            f"rule {rule.name} ({rule.origin}) could not be verified: {verdict.reason}. "
            "graphsub loads only rules that Z3 proves or the exact identity test passes "
            "(`graphsub verify FILE --json` says why for each)")


def load_verified_rules(paths: Iterable[str | Path]) -> list[Rule]:
    """Rules from rule files (graphsub .rules or TASO's .pb), each verified as
    `graphsub verify` verifies it, the verdicts kept in the cache folder."""
    return load_rules(paths, decide=verified)
