"""Derived lemmas: consequences of Table 2's axioms that the prover uses as extra premises.

Each lemma is a universally quantified equation over the axioms' signature. Z3 finds some
proofs only through a detour the rule does not mention: matmul distributes over ewadd on the
left, and concatenation of rows commutes with matmul, only by transposing both sides
(transpose-matmul, transpose-ewadd / concat-transpose, the right-hand property, then
transpose-involution). Stating such a consequence once lets E-matching use it directly.

Using a lemma is sound only because it is itself entailed by the 43 axioms: `proven_lemmas`
proves each lemma from the axioms alone (never from other lemmas) the first time the prover
needs them, and keeps only those proven; tests/proofs/test_taso_proofs.py checks that all
of them are. A lemma that fails to be proven (on a slow machine, say) is simply not used.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import z3

from graphsub.proofs.axioms import PAD_VALID, signature
from graphsub.proofs.entailment import entails_all, open_forall


@dataclass(frozen=True)
class Lemma:
    name: str
    formula: z3.BoolRef  # a universally quantified equation
    # terms, over the constants the formula binds, that its proof needs in the E-graph
    # (a hint adds a term, never a fact: ground hints are definitions of fresh constants)
    hints: tuple[z3.ExprRef, ...] = ()


@lru_cache(maxsize=1)
def lemmas() -> tuple[Lemma, ...]:
    s = signature()
    x, y, z, w = z3.Consts("x y z w", s.T)
    k, st = z3.Consts("k s", z3.IntSort())
    A = z3.ForAll
    add, tr, mm, cat, sm = s.ewadd, s.transpose, s.matmul, s.concat, s.smul

    def via_transpose(lhs: z3.ExprRef, rhs: z3.ExprRef) -> tuple[z3.ExprRef, ...]:
        return tr(tr(lhs)), tr(tr(rhs))

    rows_l, rows_r = cat(0, mm(x, z), mm(y, z)), mm(cat(0, x, y), z)
    left_l, left_r = mm(add(x, y), z), add(mm(x, z), mm(y, z))
    smul_l, smul_r = sm(mm(x, y), w), mm(sm(x, w), y)
    return (
        # mirror of matmul-ewadd: transpose, distribute on the right, transpose back
        Lemma("matmul-ewadd-left", A([x, y, z], left_l == left_r), via_transpose(left_l, left_r)),
        # mirror of concat-matmul-cols: concat(0, .) is transpose of concat(1, .) of transposes
        Lemma("concat-matmul-rows", A([x, y, z], rows_l == rows_r), via_transpose(rows_l, rows_r)),
        # mirror of matmul-smul
        Lemma("matmul-smul-left", A([x, y, w], smul_l == smul_r), via_transpose(smul_l, smul_r)),
        # the other half of concat-transpose
        Lemma("transpose-concat-1", A([x, y], tr(cat(1, x, y)) == cat(0, tr(x), tr(y)))),
        # avg pooling as a convolution (conv-cpool, VALID padding) commutes with batch
        # concatenation
        Lemma("concat-pool-avg-0", A([k, st, x, y],
                                     cat(0, s.pool_avg(k, st, PAD_VALID, x),
                                         s.pool_avg(k, st, PAD_VALID, y))
                                     == s.pool_avg(k, st, PAD_VALID, cat(0, x, y)))),
    )


def prove_lemma(lemma: Lemma, timeout_ms: int = 5_000) -> bool:
    """Whether the 43 axioms alone entail `lemma` (within `timeout_ms`)."""
    q = lemma.formula
    bound = [z3.Const(q.var_name(i), q.var_sort(i)) for i in range(q.num_vars())]
    consts, body = open_forall(q)
    hints = [z3.substitute(h, *zip(bound, consts)) for h in lemma.hints]
    return entails_all([body], timeout_ms, hints=hints)[0]


@lru_cache(maxsize=1)
def proven_lemmas() -> tuple[Lemma, ...]:
    """The lemmas that the axioms are shown to entail, proven once per process."""
    return tuple(lem for lem in lemmas() if prove_lemma(lem))
