"""Verifying many rules at once, in batches on an executor (process pool or Dask): each rule
is proven independently, so the work splits freely."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from graphsub.executors import Executor
from graphsub.rules.ast import Rule
from graphsub.rules.parser import parse_rules, print_rule
from graphsub.proofs.prover import Verdict, verify_rule


def verify_texts(texts: Sequence[str], timeout_ms: int, numeric: bool) -> list[Verdict]:
    """Verify rules given as text (rules travel to workers as text: it pickles everywhere)."""
    out = []
    for text in texts:
        (rule,) = parse_rules(text, origin="<verify>")
        out.append(verify_rule(rule, timeout_ms=timeout_ms, numeric=numeric))
    return out


def verify_rules(rules: Sequence[Rule], timeout_ms: int, executor: Executor,
                 numeric: bool = True,
                 progress: Callable[[str, int, int], None] | None = None) -> list[Verdict]:
    """Verdicts for `rules`, in their order. `numeric` also tests each rule on random inputs,
    so that a wrong rule is reported as refuted rather than merely unproven."""
    texts = [print_rule(r) for r in rules]
    n = max(1, min(len(texts), 4 * executor.workers))
    batches = [texts[i::n] for i in range(n)]
    by_name: dict[str, Verdict] = {}
    for done, verdicts in enumerate(executor.run(verify_texts, [(b, timeout_ms, numeric)
                                                                 for b in batches]), 1):
        for v in verdicts:
            by_name[v.rule] = v
        if progress is not None:
            progress("verify", done, len(batches))
    return [by_name[r.name] for r in rules]
