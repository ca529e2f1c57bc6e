"""Substitution generation (TASO sections 2-4): enumerate graphs, fingerprint them, test
graphs with equal fingerprints on random inputs, prune, verify, and write a rule file.

    from graphsub.generate import generate, make_executor, rules_text
    rules, report = generate(3, ["matmul", "ewadd", "concat", "split"],
                             executor=make_executor("process"))
    open("generated.rules", "w").write(rules_text(rules, report))

The parts can be used on their own: `Enumerator` (Algorithm 1 over given input tensors),
`candidates` / `to_rule` (step 2), `prune` (section 4), `recall` (against a reference set).
"""

from graphsub.generate.candidates import RuleCandidate, candidates, output_mapping, to_rule
from graphsub.generate.enumerate import Enumeration, Enumerator, GenGraph, fingerprint, hash1
from graphsub.executors import make_executor
from graphsub.generate.tasks import GenerationReport, generate, rules_text

__all__ = ["Enumeration", "Enumerator", "GenGraph", "GenerationReport", "RuleCandidate",
           "candidates", "fingerprint", "generate", "hash1", "make_executor", "output_mapping",
           "rules_text", "to_rule"]
