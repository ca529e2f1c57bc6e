"""Operator fission and kernel orchestration (the fission paper; Korch, ASPLOS 2024).

Coarse operators are split into primitives (`fission`), candidate kernels are enumerated on the
primitive graph (`candidates`), each is priced on the target, and a binary linear program
chooses the orchestration: which kernels run, covering every primitive output the graph needs,
redundant computation allowed, no cycles between kernels (`orchestrate`).
"""

from graphsub.fission.primitives import (category, fission, fission_rules, kernel_rules,
                                         primitive_rules)
from graphsub.ops.base import Category

__all__ = ["Category", "category", "fission", "fission_rules", "kernel_rules",
           "primitive_rules"]
