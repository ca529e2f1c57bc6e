"""Proofs of rules (TASO section 3): operator properties as Z3 axioms, entailment checks of
rules against them, and the axioms' own validation on small tensors (`graphsub verify`,
`graphsub axioms check`)."""

from graphsub.proofs.axioms import AXIOM_COUNT, axioms
from graphsub.proofs.prover import Verdict, prove, verify_rule

__all__ = ["AXIOM_COUNT", "Verdict", "axioms", "prove", "verify_rule"]
