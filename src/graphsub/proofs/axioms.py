"""Operator properties as first-order axioms for Z3 (TASO section 3, Table 2).

Tensors are an uninterpreted sort; operators are uninterpreted functions of their parameters
(integers: axis, stride, dilation, padding mode, activation, kernel) and input tensors. TASO's
convolution has no dilation; graphsub's does, so conv takes it as a parameter: the linearity,
relu and concatenation properties hold for any dilation, the enlarge, identity-kernel and
C_pool properties are stated for dilation 1. Two properties are narrower than in Table 2,
because `graphsub axioms check` showed them false for graphsub's operators: enlarge holds at
stride 1 only (with SAME padding at stride 2 on an even size, the odd padding pixel goes at the
end and the enlarged kernel's centre moves), and C_pool equals average pooling with VALID
padding only (with SAME, graphsub's average pooling does not count padded cells). Shapes are not
modelled, as in TASO. Each axiom is a named, universally quantified equation; `AXIOMS` lists
them in Table 2's order.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import z3

# Parameter encodings shared with the rule translation.
PAD_SAME, PAD_VALID = 0, 1
ACT_NONE, ACT_RELU = 0, 2


@dataclass(frozen=True)
class Signature:
    """The sort and function symbols axioms and translated rules share."""

    T: z3.SortRef
    ewadd: z3.FuncDeclRef
    ewmul: z3.FuncDeclRef
    smul: z3.FuncDeclRef
    transpose: z3.FuncDeclRef
    matmul: z3.FuncDeclRef
    relu: z3.FuncDeclRef
    concat: z3.FuncDeclRef
    split0: z3.FuncDeclRef
    split1: z3.FuncDeclRef
    conv: z3.FuncDeclRef  # (stride, dilation, padding, activation, input, kernel)
    enlarge: z3.FuncDeclRef
    pool_avg: z3.FuncDeclRef
    pool_max: z3.FuncDeclRef
    c_pool: z3.FuncDeclRef
    i_conv: z3.FuncDeclRef
    i_matmul: z3.ExprRef
    i_ewmul: z3.ExprRef


@lru_cache(maxsize=1)
def signature() -> Signature:
    T = z3.DeclareSort("Tensor")
    I = z3.IntSort()
    F = z3.Function
    return Signature(
        T=T, ewadd=F("ewadd", T, T, T), ewmul=F("ewmul", T, T, T), smul=F("smul", T, T, T),
        transpose=F("transpose", T, T), matmul=F("matmul", T, T, T), relu=F("relu", T, T),
        concat=F("concat", I, T, T, T), split0=F("split0", I, T, T), split1=F("split1", I, T, T),
        conv=F("conv", I, I, I, I, T, T, T), enlarge=F("enlarge", I, T, T),
        pool_avg=F("pool_avg", I, I, I, T, T), pool_max=F("pool_max", I, I, I, T, T),
        c_pool=F("c_pool", I, T), i_conv=F("i_conv", I, T),
        i_matmul=z3.Const("I_matmul", T), i_ewmul=z3.Const("I_ewmul", T),
    )


@dataclass(frozen=True)
class Axiom:
    name: str
    formula: z3.BoolRef


@lru_cache(maxsize=1)
def axioms() -> tuple[Axiom, ...]:
    s = signature()
    T, I = s.T, z3.IntSort()
    x, y, z, w = z3.Consts("x y z w", T)
    a, c, k, p, st, d = z3.Consts("a c k p s d", I)
    A = z3.ForAll
    add, mul, sm, tr, mm = s.ewadd, s.ewmul, s.smul, s.transpose, s.matmul
    cat, conv, none = s.concat, s.conv, ACT_NONE
    return tuple(Axiom(n, f) for n, f in [
        ("ewadd-assoc", A([x, y, z], add(x, add(y, z)) == add(add(x, y), z))),
        ("ewadd-comm", A([x, y], add(x, y) == add(y, x))),
        ("ewmul-assoc", A([x, y, z], mul(x, mul(y, z)) == mul(mul(x, y), z))),
        ("ewmul-comm", A([x, y], mul(x, y) == mul(y, x))),
        ("ewmul-ewadd-distrib", A([x, y, z], mul(add(x, y), z) == add(mul(x, z), mul(y, z)))),
        ("smul-assoc", A([x, y, w], sm(sm(x, y), w) == sm(x, sm(y, w)))),
        ("smul-ewadd-distrib", A([x, y, w], sm(add(x, y), w) == add(sm(x, w), sm(y, w)))),
        ("smul-ewmul-comm", A([x, y, w], sm(mul(x, y), w) == mul(x, sm(y, w)))),
        ("transpose-involution", A([x], tr(tr(x)) == x)),
        ("transpose-ewadd", A([x, y], tr(add(x, y)) == add(tr(x), tr(y)))),
        ("transpose-ewmul", A([x, y], tr(mul(x, y)) == mul(tr(x), tr(y)))),
        ("smul-transpose", A([x, w], sm(tr(x), w) == tr(sm(x, w)))),
        ("matmul-assoc", A([x, y, z], mm(x, mm(y, z)) == mm(mm(x, y), z))),
        ("matmul-smul", A([x, y, w], sm(mm(x, y), w) == mm(x, sm(y, w)))),
        ("matmul-ewadd", A([x, y, z], mm(x, add(y, z)) == add(mm(x, y), mm(x, z)))),
        ("transpose-matmul", A([x, y], tr(mm(x, y)) == mm(tr(y), tr(x)))),
        ("conv-smul-args", A([st, d, p, c, x, y, w], conv(st, d, p, c, sm(x, w), y) == conv(st, d, p, c, x, sm(y, w)))),
        ("conv-smul-out", A([st, d, p, x, y, w], sm(conv(st, d, p, none, x, y), w) == conv(st, d, p, none, sm(x, w), y))),
        ("conv-ewadd-kernel", A([st, d, p, x, y, z], conv(st, d, p, none, x, add(y, z)) == add(conv(st, d, p, none, x, y), conv(st, d, p, none, x, z)))),
        ("conv-ewadd-input", A([st, d, p, x, y, z], conv(st, d, p, none, add(x, y), z) == add(conv(st, d, p, none, x, z), conv(st, d, p, none, y, z)))),
        ("conv-enlarge", A([c, k, x, y], conv(1, 1, PAD_SAME, c, x, y) == conv(1, 1, PAD_SAME, c, x, s.enlarge(k, y)))),
        ("conv-relu", A([st, d, p, x, y], conv(st, d, p, ACT_RELU, x, y) == s.relu(conv(st, d, p, none, x, y)))),
        ("relu-transpose", A([x], s.relu(tr(x)) == tr(s.relu(x)))),
        ("conv-cpool", A([st, x, k], conv(st, 1, PAD_VALID, none, x, s.c_pool(k)) == s.pool_avg(k, st, PAD_VALID, x))),
        ("conv-iconv", A([k, x], conv(1, 1, PAD_SAME, none, x, s.i_conv(k)) == x)),
        ("matmul-identity", A([x], mm(x, s.i_matmul) == x)),
        ("ewmul-identity", A([x], mul(x, s.i_ewmul) == x)),
        ("split0-concat", A([a, x, y], s.split0(a, cat(a, x, y)) == x)),
        ("split1-concat", A([a, x, y], s.split1(a, cat(a, x, y)) == y)),
        ("concat-geometry", A([x, y, z, w], cat(0, cat(1, x, y), cat(1, z, w)) == cat(1, cat(0, x, z), cat(0, y, w)))),
        ("concat-smul", A([a, x, y, w], cat(a, sm(x, w), sm(y, w)) == sm(cat(a, x, y), w))),
        ("concat-ewadd", A([a, x, y, z, w], cat(a, add(x, y), add(z, w)) == add(cat(a, x, z), cat(a, y, w)))),
        ("concat-ewmul", A([a, x, y, z, w], cat(a, mul(x, y), mul(z, w)) == mul(cat(a, x, z), cat(a, y, w)))),
        ("concat-relu", A([a, x, y], cat(a, s.relu(x), s.relu(y)) == s.relu(cat(a, x, y)))),
        ("concat-transpose", A([x, y], cat(1, tr(x), tr(y)) == tr(cat(0, x, y)))),
        ("concat-matmul-cols", A([x, y, z], cat(1, mm(x, y), mm(x, z)) == mm(x, cat(1, y, z)))),
        ("concat-matmul-inner", A([x, y, z, w], mm(cat(1, x, z), cat(0, y, w)) == add(mm(x, y), mm(z, w)))),
        ("concat-conv-batch", A([st, d, p, c, x, y, z], cat(0, conv(st, d, p, c, x, z), conv(st, d, p, c, y, z)) == conv(st, d, p, c, cat(0, x, y), z))),
        ("concat-conv-filters", A([st, d, p, c, x, y, z], cat(1, conv(st, d, p, c, x, y), conv(st, d, p, c, x, z)) == conv(st, d, p, c, x, cat(0, y, z)))),
        ("conv-concat-channels", A([st, d, p, x, y, z, w], conv(st, d, p, none, cat(1, x, z), cat(1, y, w)) == add(conv(st, d, p, none, x, y), conv(st, d, p, none, z, w)))),
        ("concat-pool-avg", A([k, st, p, x, y], cat(1, s.pool_avg(k, st, p, x), s.pool_avg(k, st, p, y)) == s.pool_avg(k, st, p, cat(1, x, y)))),
        ("concat-pool-max-0", A([k, st, p, x, y], cat(0, s.pool_max(k, st, p, x), s.pool_max(k, st, p, y)) == s.pool_max(k, st, p, cat(0, x, y)))),
        ("concat-pool-max-1", A([k, st, p, x, y], cat(1, s.pool_max(k, st, p, x), s.pool_max(k, st, p, y)) == s.pool_max(k, st, p, cat(1, x, y)))),
    ])
AXIOM_COUNT = 43  # Table 2 of the TASO paper lists 43 operator properties
