"""Formal verification of rules (TASO section 3): operator properties as Z3 axioms, and
entailment checks of rules against them.

Work in progress (issue 4): validation of the axioms by symbolic execution on small tensors,
consistency and redundancy checks, and `graphsub verify` / `graphsub axioms check` follow.
"""

from graphsub.verify.axioms import AXIOM_COUNT, axioms
from graphsub.verify.prover import Verdict, prove, verify_rule

__all__ = ["AXIOM_COUNT", "Verdict", "axioms", "prove", "verify_rule"]
