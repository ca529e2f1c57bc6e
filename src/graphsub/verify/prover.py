"""Verifying rules with Z3: the axioms must entail that each source root equals its target.

A rule is translated into terms over the axioms' signature (tensor variables become tensor
constants, attribute variables integer constants; shape-valued attributes such as split sizes
are abstracted away, as TASO does). Z3 then checks that the axioms together with the negated
equalities are unsatisfiable: `proven`. A rule whose sides differ on random inputs is `refuted`
(the numerical check is a counterexample); anything else (a timeout, or the axioms not
entailing it) is `unknown`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import z3

from graphsub.rules.ast import AVar, Lit, ListExpr, OpTerm, Ref, Rule, Term, Var
from graphsub.rules.check import RuleCheckError, check_rule
from graphsub.verify.axioms import ACT_NONE, ACT_RELU, PAD_SAME, PAD_VALID, axioms, signature


class Untranslatable(Exception):
    """The rule uses an operator or attribute the axioms do not describe."""


@dataclass(frozen=True)
class Verdict:
    rule: str
    status: str  # proven | refuted | unknown
    seconds: float
    reason: str = ""


def _int_attr(e: Any, env: dict[str, z3.ArithRef], convert) -> z3.ArithRef | int:
    if isinstance(e, AVar):
        return env.setdefault(e.name, z3.Int(f"attr_{e.name}"))
    if isinstance(e, (Lit, ListExpr)):
        value = e.value if isinstance(e, Lit) else tuple(i.value for i in e.items)  # type: ignore[union-attr]
        return convert(value)
    raise Untranslatable(f"computed attribute {e}")


def _stride(v: Any) -> int:
    v = (v, v) if isinstance(v, int) else tuple(v)
    if v[0] != v[1]:
        raise Untranslatable("unequal strides")
    return int(v[0])


def _padding(v: Any) -> int:
    if v in ("same", "valid"):
        return PAD_SAME if v == "same" else PAD_VALID
    raise Untranslatable(f"explicit padding {v}")


def _activation(v: Any) -> int:
    if v in ("none", "relu"):
        return ACT_NONE if v == "none" else ACT_RELU
    raise Untranslatable(f"activation {v}")


def _kernel(v: Any) -> int:
    v = (v, v) if isinstance(v, int) else tuple(v)
    return int(v[0]) * 1000 + int(v[1])


class _Translator:
    def __init__(self, rule: Rule) -> None:
        self.sig = signature()
        self.attrs: dict[str, z3.ArithRef] = {}
        self.lets: dict[str, OpTerm] = dict(rule.lets)  # type: ignore[arg-type]

    def attr(self, term: OpTerm, key: str, convert, default: Any) -> Any:
        for k, e in term.attrs:
            if k == key:
                return _int_attr(e, self.attrs, convert)
        return convert(default)

    def term(self, t: Term) -> z3.ExprRef:
        s = self.sig
        if isinstance(t, Var):
            return z3.Const(t.name, s.T)
        if isinstance(t, Ref):
            base = self.lets[t.name]
            return self.term(OpTerm(base.op, base.attrs, base.args, t.index))
        assert isinstance(t, OpTerm)
        args = [self.term(a) for a in t.args]
        op = t.op
        if op in ("add", "mul", "smul") and len(args) == 2:
            return {"add": s.ewadd, "mul": s.ewmul, "smul": s.smul}[op](*args)
        if op == "relu":
            return s.relu(args[0])
        if op == "transpose":
            perm = dict(t.attrs).get("perm")
            if not isinstance(perm, ListExpr) or [i.value for i in perm.items][-2:] != \
                    [len(perm.items) - 1, len(perm.items) - 2]:  # type: ignore[attr-defined]
                raise Untranslatable("transpose other than of the last two axes")
            return s.transpose(args[0])
        if op == "matmul":
            act = self.attr(t, "activation", _activation, "none")
            out = s.matmul(*args)
            if isinstance(act, int):
                return out if act == ACT_NONE else s.relu(out)
            raise Untranslatable("matmul with a variable activation")
        if op == "concat" and len(args) == 2:
            return s.concat(self.attr(t, "axis", int, 0), *args)
        if op == "split":
            axis = self.attr(t, "axis", int, 0)
            if t.index > 1:
                raise Untranslatable("split into more than two")
            return (s.split0 if t.index == 0 else s.split1)(axis, args[0])
        if op == "conv2d" and len(args) == 2:
            return s.conv(self.attr(t, "stride", _stride, (1, 1)),
                          self.attr(t, "dilation", _stride, (1, 1)),
                          self.attr(t, "padding", _padding, "same"),
                          self.attr(t, "activation", _activation, "none"), *args)
        if op == "enlarge":
            return s.enlarge(self.attr(t, "kernel", _kernel, (3, 3)), args[0])
        if op in ("avg_pool2d", "max_pool2d"):
            f = s.pool_avg if op == "avg_pool2d" else s.pool_max
            return f(self.attr(t, "kernel", _kernel, (3, 3)), self.attr(t, "stride", _stride, (1, 1)),
                     self.attr(t, "padding", _padding, "valid"), args[0])
        raise Untranslatable(f"operator {op}")


def prove(rule: Rule, timeout_ms: int = 10_000) -> tuple[bool, str]:
    """Whether the axioms entail the rule (and why not, when they do not)."""
    tr = _Translator(rule)
    try:
        eqs = [tr.term(s) == tr.term(t) for s, t in zip(rule.sources, rule.targets)]
    except Untranslatable as exc:
        return False, f"not expressible in the axioms: {exc}"
    solver = z3.Solver()
    solver.set("timeout", timeout_ms)
    for ax in axioms():
        solver.add(ax.formula)
    solver.add(z3.Not(z3.And(*eqs)))
    result = solver.check()
    if result == z3.unsat:
        return True, ""
    return False, "timeout" if result == z3.unknown else "the axioms do not entail it"


def verify_rule(rule: Rule, timeout_ms: int = 10_000, numeric: bool = True) -> Verdict:
    start = time.perf_counter()
    if numeric:
        try:
            check_rule(rule, examples=2, attempts=200)
        except RuleCheckError as exc:
            if "is wrong" in str(exc):
                return Verdict(rule.name, "refuted", time.perf_counter() - start,
                               str(exc).splitlines()[0])
    ok, reason = prove(rule, timeout_ms)
    return Verdict(rule.name, "proven" if ok else "unknown", time.perf_counter() - start, reason)
