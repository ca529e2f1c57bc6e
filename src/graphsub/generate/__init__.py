"""Substitution generation (TASO section 2): enumerate graphs, fingerprint them, test graphs
with equal fingerprints on random inputs, and emit candidate rules.

    from graphsub.generate import Enumerator, candidates, to_rule
    enum = Enumerator({"A": (4, 4), "B": (4, 4), "C": (4, 4)}, max_ops=2, ops=["matmul"]).run()
    rules = [to_rule(c, f"gen-{i}") for i, c in enumerate(candidates(enum))]

    from graphsub.generate.prune import prune
    kept, report = prune(rules)                   # TASO section 4; report.table() is Table 3

Work in progress (issue 4): convolution, pooling, enlarge and the constant tensors, the Z3
verifier, the executors and the command line follow.
"""

from graphsub.generate.candidates import Candidate, candidates, output_mapping, to_rule
from graphsub.generate.enumerate import Enumeration, Enumerator, GenGraph, fingerprint, hash1

__all__ = ["Candidate", "Enumeration", "Enumerator", "GenGraph", "candidates", "fingerprint",
           "hash1", "output_mapping", "to_rule"]
