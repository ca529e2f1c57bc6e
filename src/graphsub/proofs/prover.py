"""Verifying rules with Z3: the axioms must entail that each source root equals its target.

A rule is translated into terms over the axioms' signature (tensor variables become tensor
constants, attribute variables integer constants; shape-valued attributes such as split sizes
are abstracted away, as TASO does). Z3 then checks that the axioms together with the negated
equalities are unsatisfiable: `proven`. A rule whose sides differ on random inputs is `refuted`
(the numerical check is a counterexample). A rule the axioms cannot express or Z3 cannot
decide is then tested exactly at random points (`graphsub.proofs.identity`): `tested`, with
the chance of a false pass; anything else is `unknown`.

Each output equality is proven on its own (their conjunction is what the rule claims), in two
stages. First E-matching alone, with Z3's model-based instantiation off and each axiom's two
sides as its triggers: this finds almost every proof within milliseconds, and gives up at
once when the ground terms saturate. Z3's own trigger choice, with MBQI, instead loses itself
in axioms such as concat-geometry (over 150,000 instances in 3 s on TASO's rule 103, as many
as with a multi-pattern on its two inner concatenations, each instance making new ones). The
second stage, with the remaining time, is Z3's default configuration over the axioms as
stated. Both stages also use the lemmas of `graphsub.proofs.lemmas`, each
first proven from the axioms alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import z3

from graphsub.rules.ast import AVar, Call, ListExpr, Lit, OpTerm, Ref, Rule, Term, Var
from graphsub.ops import get_op
from graphsub.ops.base import REQUIRED
from graphsub.rules.check import RuleCheckError, check_rule, rule_seed
from graphsub.rules.matcher import SAME_SHAPES
from graphsub.proofs.axioms import (
    ACT_NONE,
    ACT_RELU,
    PAD_SAME,
    PAD_VALID,
    signature,
)
from graphsub.proofs.entailment import entails_all
from graphsub.proofs.identity import IdentityTest, identity_test
from graphsub.proofs.lemmas import proven_lemmas


class Untranslatable(Exception):
    """The rule uses an operator or attribute the axioms do not describe."""


@dataclass(frozen=True)
class Verdict:
    rule: str
    #: proven (by Z3 from the axioms) | tested (by the exact identity test) | refuted (its
    #: sides differ on random inputs) | unknown
    status: str
    seconds: float
    reason: str = ""
    #: The shapes a proof speaks for: the axioms do not model shapes, so a proof holds where
    #: every operator is applied as the axioms state it (see `proof_scope`).
    scope: str = ""
    #: Combinations of operand ranks the numerical check ran the rule on.
    checked_ranks: int = 0
    #: For `tested`: the chance that a rule whose sides differ passed the exact test.
    error_bound: float | None = None

    @property
    def evidence(self) -> str:
        """What the verdict rests on, in words."""
        return {"proven": "proof by Z3 from the operator axioms",
                "tested": f"exact identity test (false pass at most {self.error_bound:.0e})"
                if self.error_bound is not None else "exact identity test",
                "refuted": "counterexample on random inputs"}.get(self.status, "none")


#: What the axioms assume of each operator's operands (they model no shapes, as in TASO).
AXIOM_DOMAIN = {
    "matmul": "matmul operands of rank 2 or more (matrices or batches; a vector is a row on "
              "one side and a column on the other, which the axioms do not distinguish)",
    "add": "element-wise operands of equal shapes (the axioms do not model broadcasting)",
    "mul": "element-wise operands of equal shapes (the axioms do not model broadcasting)",
    "concat": "concatenations of operands that agree off the axis",
    "split": "splits at the sizes the rule states",
    "conv2d": "convolutions with dilation 1 for enlarge and pooling properties",
}


#: The attributes the axioms model, per operator; any other an operator has is taken at its
#: default, and a rule that writes another value is not expressible (`_Translator.unmodelled`).
_MODELLED = {"matmul": frozenset({"activation"}), "transpose": frozenset({"perm"}),
             "concat": frozenset({"axis"}), "split": frozenset({"axis", "sizes"}),
             "conv2d": frozenset({"stride", "dilation", "padding", "activation"}),
             "enlarge": frozenset({"kernel"}),
             "avg_pool2d": frozenset({"kernel", "stride", "padding"}),
             "max_pool2d": frozenset({"kernel", "stride", "padding"})}


def _canonical(op: str, key: str, value: Any) -> Any:
    spec = get_op(op).attr_spec(key)
    try:
        return spec.convert(value) if spec is not None and spec.convert is not None \
            and value is not None else value
    except (TypeError, ValueError):
        return value


def proof_scope(rule: Rule) -> str:
    """In words: the shapes for which a proof of `rule` from the axioms holds."""
    ops: list[str] = []

    def walk(t: Term) -> None:
        if isinstance(t, OpTerm):
            if t.op not in ops:
                ops.append(t.op)
            for a in t.args:
                walk(a)

    for t in (*rule.sources, *rule.targets):
        walk(t)
    parts = list(dict.fromkeys(AXIOM_DOMAIN[op] for op in ops if op in AXIOM_DOMAIN))
    scope = "; ".join(parts) if parts else "any shapes the operators accept"
    if rule.conditions:
        scope += f"; within the rule's conditions ({len(rule.conditions)})"
    return scope


def _int_attr(e: Any, env: dict[str, z3.ArithRef], convert: Callable[[Any], int]
              ) -> z3.ArithRef | int:
    if isinstance(e, AVar):
        return env.setdefault(e.name, z3.Int(f"attr_{e.name}"))
    if isinstance(e, Lit):
        return convert(e.value)
    literals = [i for i in e.items if isinstance(i, Lit)] if isinstance(e, ListExpr) else None
    if literals is not None and isinstance(e, ListExpr) and len(literals) == len(e.items):
        return convert(tuple(i.value for i in literals))
    # A value computed from shapes (an enlarged kernel's size, say) is abstracted, as TASO
    # abstracts shapes: an integer about which nothing is known, the same one wherever the
    # same expression occurs. What is proven for every value holds for the computed one.
    key = repr(e)
    return env.setdefault(key, z3.Int(f"attr_computed_{len(env)}"))


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
        # (a let names an operator's term, whose outputs `Ref`s pick: the parser makes no
        # other)
        self.lets = {name: t for name, t in rule.lets if isinstance(t, OpTerm)}

    def attr(self, term: OpTerm, key: str, convert: Callable[[Any], int]) -> Any:
        """The attribute as the axioms take it: as written, else the operator's default (what
        an unwritten attribute matches and builds: rules.matcher)."""
        for k, e in term.attrs:
            if k == key:
                return _int_attr(e, self.attrs, convert)
        spec = get_op(term.op).attr_spec(key)
        if spec is None or spec.default is REQUIRED or spec.default is None:
            raise Untranslatable(f"{term.op}'s {key} left to what the shapes make of it")
        return convert(spec.default)

    def unmodelled(self, term: OpTerm) -> None:
        """Refuse a term that writes an attribute the axioms do not model at anything but its
        default: the translation would drop it, and a rule that changes it be "proven"."""
        modelled = _MODELLED.get(term.op, frozenset())
        for key, e in term.attrs:
            if key in modelled or key == SAME_SHAPES:
                continue
            spec = get_op(term.op).attr_spec(key)
            default = spec.default if spec is not None else REQUIRED
            if not (isinstance(e, Lit) and default is not REQUIRED
                    and _canonical(term.op, key, e.value) == _canonical(term.op, key, default)):
                raise Untranslatable(f"{term.op}'s {key} (the axioms model only its default)")

    def term(self, t: Term) -> z3.ExprRef:
        s = self.sig
        if isinstance(t, Var):
            return z3.Const(t.name, s.T)
        if isinstance(t, Ref):
            base = self.lets[t.name]
            return self.term(OpTerm(base.op, base.attrs, base.args, t.index))
        assert isinstance(t, OpTerm)
        if t.op != "constant":
            self.unmodelled(t)
        args = [self.term(a) for a in t.args]
        op = t.op
        if op in ("add", "mul", "smul") and len(args) == 2:
            return {"add": s.ewadd, "mul": s.ewmul, "smul": s.smul}[op](*args)
        if op == "relu":
            return s.relu(args[0])
        if op == "transpose":
            perm = dict(t.attrs).get("perm")
            if not isinstance(perm, ListExpr) or not all(isinstance(i, Lit) for i in perm.items) \
                    or [i.value for i in perm.items if isinstance(i, Lit)] != \
                    [*range(len(perm.items) - 2), len(perm.items) - 1, len(perm.items) - 2]:
                raise Untranslatable("transpose other than of the last two axes alone")
            return s.transpose(args[0])
        if op == "matmul":
            act = self.attr(t, "activation", _activation)
            out = s.matmul(*args)
            if isinstance(act, int):
                return out if act == ACT_NONE else s.relu(out)
            raise Untranslatable("matmul with a variable activation")
        if op == "concat" and len(args) == 2:
            return s.concat(self.attr(t, "axis", int), *args)
        if op == "split":
            axis = self.attr(t, "axis", int)
            if t.index > 1:
                raise Untranslatable("split into more than two")
            return (s.split0 if t.index == 0 else s.split1)(axis, args[0])
        if op == "conv2d" and len(args) == 2:
            return s.conv(self.attr(t, "stride", _stride), self.attr(t, "dilation", _stride),
                          self.attr(t, "padding", _padding),
                          self.attr(t, "activation", _activation), *args)
        if op == "enlarge":
            return s.enlarge(self.attr(t, "kernel", _kernel), args[0])
        if op in ("avg_pool2d", "max_pool2d"):
            f = s.pool_avg if op == "avg_pool2d" else s.pool_max
            written = dict(t.attrs)
            if "stride" not in written and isinstance(written.get("kernel"), (Lit, ListExpr)):
                stride = _int_attr(written["kernel"], self.attrs, _stride)  # a window's own
            else:
                stride = self.attr(t, "stride", _stride)
            return f(self.attr(t, "kernel", _kernel), stride, self.attr(t, "padding", _padding),
                     args[0])
        if op == "constant":
            return self.constant(t)
        raise Untranslatable(f"operator {op}")

    def constant(self, t: OpTerm) -> z3.ExprRef:
        """TASO's constant tensors, recognised from the rule's constant term: I_matmul (eye),
        I_conv (conv-identity), C_pool (depthwise 1/(kh*kw)) and I_ewmul (all ones)."""
        s = self.sig
        a = dict(t.attrs)
        pattern_lit, value_lit = a.get("pattern"), a.get("value")
        pattern = pattern_lit.value if isinstance(pattern_lit, Lit) else "full"
        value = value_lit.value if isinstance(value_lit, Lit) else None
        shape = a.get("shape")
        dims = list(shape.items) if isinstance(shape, ListExpr) else []
        spatial = [d.value for d in dims[2:] if isinstance(d, Lit)] if len(dims) == 4 and all(
            isinstance(d, Lit) for d in dims[2:]) else None
        if pattern == "eye" and value == 1.0:
            return s.i_matmul
        if pattern == "conv-identity" and value == 1.0 and spatial:
            return s.i_conv(spatial[0] * 1000 + spatial[1])
        if pattern == "full" and spatial and isinstance(dims[1], Lit) and dims[1].value == 1 \
                and value is not None and abs(value * spatial[0] * spatial[1] - 1) < 1e-6:
            return s.c_pool(spatial[0] * 1000 + spatial[1])
        if pattern == "full" and value == 1.0:
            return s.i_ewmul
        raise Untranslatable(f"constant {pattern} {value}")


def entails(goals: list[z3.BoolRef], timeout_ms: int = 10_000, use_lemmas: bool = True,
            hints: list[z3.ExprRef] | tuple[z3.ExprRef, ...] = ()) -> tuple[bool, str]:
    """Whether the axioms (and, with `use_lemmas`, the proven lemmas) entail every goal, each
    proven on its own, all within `timeout_ms` together."""
    lemma_formulas = tuple(lem.formula for lem in proven_lemmas()) if use_lemmas else ()
    return entails_all(goals, timeout_ms, lemma_formulas, hints)


def _maybe_grouped(rule: Rule) -> str:
    """A source convolution the rule does not keep ungrouped ("" where none): the axioms
    describe ungrouped convolution, and a proof from them says nothing of a grouped one
    (TASO's merges 98, 105, 125-129 are proven and wrong there)."""
    stated = {repr(c) for c in rule.conditions}
    found: list[str] = []

    def ungrouped(x: str, w: str) -> bool:
        dims = (Call("dim", (AVar(w), Lit(1))), Call("dim", (AVar(x), Lit(1))))
        return any(repr(Call("eq", pair)) in stated for pair in (dims, dims[::-1]))

    def walk(t: Term) -> None:
        if isinstance(t, OpTerm):
            if t.op == "conv2d" and len(t.args) >= 2:
                x, w = t.args[0], t.args[1]
                if not (isinstance(x, Var) and isinstance(w, Var) and ungrouped(x.name, w.name)):
                    found.append(f"(conv2d {'?' + x.name if isinstance(x, Var) else '...'} ...)")
            for a in t.args:
                walk(a)

    for source in rule.sources:
        walk(source)
    return found[0] if found else ""


def prove(rule: Rule, timeout_ms: int = 10_000, use_lemmas: bool = True) -> tuple[bool, str]:
    """Whether the axioms entail the rule (and why not, when they do not)."""
    if grouped := _maybe_grouped(rule):
        return False, (f"not expressible in the axioms: {grouped} may be grouped (the axioms "
                       "describe ungrouped convolution; a condition (eq (dim ?w 1) (dim ?x 1)) "
                       "keeps it ungrouped)")
    tr = _Translator(rule)
    try:
        eqs = [tr.term(s) == tr.term(t) for s, t in zip(rule.sources, rule.targets)]
    except Untranslatable as exc:
        return False, f"not expressible in the axioms: {exc}"
    return entails(eqs, timeout_ms, use_lemmas)


def verify_rule(rule: Rule, timeout_ms: int = 10_000, numeric: bool = True,
                exact: bool = True) -> Verdict:
    """Unknown where no instance can be built (with `numeric`: every check instantiates the
    rule, or none vouches for it); refuted by the numerical check, or by the exact identity
    test (`graphsub.proofs.identity`, with `exact`) on an instance through no random function;
    else proven by Z3 from the axioms, else tested by the exact test, else unknown, with the
    reasons. The exact test runs on proven rules too: the axioms model no shapes."""
    start = time.perf_counter()
    ranks = 0
    seed = rule_seed(rule)
    if numeric:
        # A rule no instance of which can be built and rewritten is unknown, whatever Z3 says:
        # a proof over the axioms speaks for instances, and the axioms' gaps (shapes, split
        # sizes) are covered only by instances tested. Loading decides the same (check_rule).
        try:
            ranks = len(check_rule(rule, seed=seed).ranks)
        except RuleCheckError as exc:
            status = "refuted" if "is wrong" in str(exc) else "unknown"
            return Verdict(rule.name, status, time.perf_counter() - start,
                           str(exc).splitlines()[0])
        except Exception as exc:  # noqa: BLE001 (an operator failing on a draw)
            return Verdict(rule.name, "unknown", time.perf_counter() - start,
                           f"its instances could not be evaluated ({type(exc).__name__}: {exc})")
    ok, reason = prove(rule, timeout_ms)
    tested = _exact(rule, seed) if exact else IdentityTest("not tested", reason="not asked")
    if tested.status == "refutes":
        # The axioms model no shapes, no groups, no broadcasting: an instance whose exact
        # values differ (through no random function) outweighs a proof over them.
        return Verdict(rule.name, "refuted", time.perf_counter() - start,
                       f"exact identity test: {tested.reason}", "", ranks)
    if ok:
        return Verdict(rule.name, "proven", time.perf_counter() - start, reason,
                       proof_scope(rule), ranks)
    if tested.status == "passed":
        return Verdict(rule.name, "tested", time.perf_counter() - start, tested.describe(),
                       "the shapes of its random instances", ranks, tested.error_bound)
    if exact:
        reason = f"{reason}; exact test: {tested.describe()}"
    return Verdict(rule.name, "unknown", time.perf_counter() - start, reason, "", ranks)


def _exact(rule: Rule, seed: int) -> IdentityTest:
    try:
        return identity_test(rule, seed)
    except Exception as exc:  # noqa: BLE001 (the exact test failing leaves it unknown)
        return IdentityTest("not tested", reason=f"it failed ({type(exc).__name__}: {exc})")
