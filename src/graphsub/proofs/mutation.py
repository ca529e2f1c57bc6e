"""Mutation testing of the verifier: small edits of right rules that make them wrong.

A verifier that proves every rule it is given looks as good, on the library and TASO's rules,
as one that proves only right ones: both say "proven" to every right rule. The difference
shows on wrong rules, and the likeliest wrong rules are the slips a rule's author makes: an
attribute forgotten in the target (so it takes the operator's default), an axis or a
permutation off by one, a concatenation's operands in the wrong order, a constant slightly
off, a condition left out, an operator left out. `mutants` makes such slips in a rule's target
(and, for conditions, in its conditions); each mutant is very likely wrong, so a verifier that
calls one `proven` or `tested` has a hole, unless the mutant happens to be equivalent to the
original. `mutation_score` counts how many the verifier killed (refuted them, or at least did
not vouch for them: unknown) and how many survived (proven or tested).

The source side is left alone: a weaker or stronger pattern is still a right rule where the
target computes the same, so mutating the pattern would mostly make rules that are right.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from graphsub.errors import GraphsubError
from graphsub.ops import OpDef, get_op
from graphsub.ops.base import REQUIRED, Category
from graphsub.proofs.prover import Verdict
from graphsub.rules.ast import Call, Expr, ListExpr, Lit, OpTerm, Rule, Term
from graphsub.rules.parser import parse_rules, print_expr, print_rule, print_term

#: Between a rule's name and its mutant's kind and number, as in `matmul-assoc-left/swap1`.
#: Not `~`: a mutant travels to the verifier's workers as text (proofs.batch), and the rule
#: format's names do not admit `~`; `/` is a name character that no rule name uses.
SEPARATOR = "/"

#: The mutation operators, in the order `mutants` applies them (a mutant's `kind`):
#: drop-attr   an attribute of a target operator removed, where its default differs
#: axis        an `:axis` (or an entry of `:axes`) moved to a neighbouring axis
#: int         another integer literal in a target attribute changed by one
#: enum        a boolean or enumerated attribute switched to another allowed value
#: perm        two entries of a `:perm` list swapped (or a `compose`'s arguments)
#: swap        two neighbouring operands of a non-commutative operator swapped
#: nudge       a numeric constant changed: a `constant`'s `:value`, a float literal
#: drop-cond   one of the rule's conditions removed
#: unwrap      a target subterm replaced by one of its operands of plausibly the same type
KINDS = ("drop-attr", "axis", "int", "enum", "perm", "swap", "nudge", "drop-cond", "unwrap")

#: The verdicts that vouch for a rule: a mutant given one survived. The others (refuted,
#: unknown) kill it: the verifier did not let the wrong rule through.
SURVIVING = frozenset({"proven", "tested"})
KILLING = frozenset({"refuted", "unknown"})


@dataclass(frozen=True)
class Mutant:
    """A mutated rule (named `<rule>/<kind><i>`), the operator that made it and what it
    changed, in words."""

    rule: Rule
    kind: str
    description: str


@dataclass(frozen=True)
class MutationScore:
    """How the verifier did on a set of mutants. `other` counts verdicts that are neither
    killing nor surviving (a caller's own status for a verification that crashed)."""

    refuted: int = 0
    unknown: int = 0
    proven: int = 0
    tested: int = 0
    other: int = 0

    @property
    def total(self) -> int:
        return self.refuted + self.unknown + self.proven + self.tested + self.other

    @property
    def killed(self) -> int:
        return self.refuted + self.unknown

    @property
    def survived(self) -> int:
        return self.proven + self.tested

    @property
    def score(self) -> float:
        """The share of mutants killed, among those with a killing or surviving verdict (1.0
        when there are none: nothing got through)."""
        decided = self.killed + self.survived
        return self.killed / decided if decided else 1.0


def mutation_score(verdicts: Iterable[Verdict]) -> MutationScore:
    """Counts of `verdicts` (the verifier's, one per mutant) by status."""
    counts = {"refuted": 0, "unknown": 0, "proven": 0, "tested": 0, "other": 0}
    for v in verdicts:
        counts[v.status if v.status in counts else "other"] += 1
    return MutationScore(**counts)


# ---- where a mutation can be made ---------------------------------------------------------

def _op_def(op: str) -> OpDef | None:
    """The registry's operator, or None for the rule language's own forms (`constant`)."""
    try:
        return get_op(op)
    except GraphsubError:
        return None


#: An operator term of a rule's target side, the rule rebuilt with another term in its
#: place, and where it is, in words ("target 1, operand 0.2": the third operand of the first
#: operand of the second target term).
Site = tuple[OpTerm, Callable[[Term], Rule], str]


def _term_sites(term: Term, rebuild: Callable[[Term], Rule], place: str,
                path: tuple[int, ...] = ()) -> Iterator[Site]:
    """Every operator term within `term` (itself first)."""
    if not isinstance(term, OpTerm):
        return
    yield term, rebuild, place + (", operand " + ".".join(map(str, path)) if path else "")
    for i, arg in enumerate(term.args):
        def inner(new: Term, t: OpTerm = term, i: int = i) -> Rule:
            return rebuild(replace(t, args=t.args[:i] + (new,) + t.args[i + 1:]))
        yield from _term_sites(arg, inner, place, path + (i,))


def _target_sites(rule: Rule) -> Iterator[Site]:
    """Every operator term of the rule's target side: its targets and its `let` bindings."""
    for i, t in enumerate(rule.targets):
        def at_target(new: Term, i: int = i) -> Rule:
            return replace(rule, targets=rule.targets[:i] + (new,) + rule.targets[i + 1:])
        yield from _term_sites(t, at_target, f"target {i}")
    for i, (name, t) in enumerate(rule.lets):
        def at_let(new: Term, i: int = i, name: str = name) -> Rule:
            return replace(rule, lets=rule.lets[:i] + ((name, new),) + rule.lets[i + 1:])
        yield from _term_sites(t, at_let, f"let {name}")


def _expr_sites(e: Expr) -> Iterator[tuple[Expr, Callable[[Expr], Expr]]]:
    """Every subexpression of `e` (itself first), each with `e` rebuilt around another
    expression in its place."""
    yield e, lambda new: new
    if isinstance(e, ListExpr):
        for i, item in enumerate(e.items):
            for sub, rebuild in _expr_sites(item):
                def in_list(new: Expr, e: ListExpr = e, i: int = i,
                            rebuild: Callable[[Expr], Expr] = rebuild) -> Expr:
                    return ListExpr(e.items[:i] + (rebuild(new),) + e.items[i + 1:])
                yield sub, in_list
    elif isinstance(e, Call):
        for i, arg in enumerate(e.args):
            for sub, rebuild in _expr_sites(arg):
                def in_call(new: Expr, e: Call = e, i: int = i,
                            rebuild: Callable[[Expr], Expr] = rebuild) -> Expr:
                    return Call(e.fn, e.args[:i] + (rebuild(new),) + e.args[i + 1:])
                yield sub, in_call


def _with_attr(term: OpTerm, key: str, value: Expr | None) -> OpTerm:
    """`term` with attribute `key` set to `value`, or removed (None)."""
    if value is None:
        return replace(term, attrs=tuple((k, v) for k, v in term.attrs if k != key))
    return replace(term, attrs=tuple((k, value if k == key else v) for k, v in term.attrs))


def _is_literal(e: Expr) -> bool:
    return isinstance(e, Lit) or (isinstance(e, ListExpr) and all(_is_literal(i) for i in e.items))


def _literal_value(e: Expr) -> Any:
    """A literal expression's value: a list's is a tuple, as the expression evaluator gives."""
    if isinstance(e, ListExpr):
        return tuple(_literal_value(i) for i in e.items)
    assert isinstance(e, Lit)
    return e.value


def _canonical(convert: Callable[[Any], Any] | None, value: Any) -> Any:
    """`value` in the attribute's canonical form (`:stride 1` is `(1, 1)`), or as written
    where the converter refuses it."""
    if convert is None or value is None:
        return value
    try:
        return convert(value)
    except (TypeError, ValueError):
        return value


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


# ---- the operators --------------------------------------------------------------------------

Candidate = tuple[str, str, Rule]  # kind, description, mutated rule (named as the original)


def _drop_attrs(rule: Rule) -> Iterator[Candidate]:
    """A target attribute forgotten: the operator then takes its default. Only where the
    written value can differ from the default (a variable, a computed value, another
    literal), since dropping `:padding same` from a convolution whose default is `same`
    changes nothing."""
    for term, rebuild, place in _target_sites(rule):
        op = _op_def(term.op)
        if op is None:
            continue
        for key, value in term.attrs:
            spec = op.attr_spec(key)
            if spec is None or spec.default is REQUIRED:
                continue
            if _is_literal(value) and _canonical(spec.convert, _literal_value(value)) == \
                    _canonical(spec.convert, spec.default):
                continue
            yield ("drop-attr", f"dropped :{key} {print_expr(value)} from {term.op} at {place} "
                   f"(its default is {spec.default!r})", rebuild(_with_attr(term, key, None)))


def _other_axes(axis: int) -> list[int]:
    """Neighbouring axes, counted from the same end as `axis` (so that they exist wherever
    `axis` and one more do), and the first axis for the last."""
    if axis >= 0:
        return [axis + 1] + ([axis - 1] if axis > 0 else [])
    return [axis - 1, axis + 1 if axis + 1 < 0 else 0]


def _attr_literals(rule: Rule) -> Iterator[Candidate]:
    """Attribute values changed: axes moved, integers changed, booleans and enumerated values
    switched, permutations and numbers (`nudge`) altered."""
    for term, rebuild, place in _target_sites(rule):
        op = _op_def(term.op)
        for key, value in term.attrs:
            def at_attr(new: Expr, term: OpTerm = term, key: str = key,
                        rebuild: Callable[[Term], Rule] = rebuild) -> Rule:
                return rebuild(_with_attr(term, key, new))

            where = f"{term.op} at {place}"
            spec = op.attr_spec(key) if op is not None else None
            if key == "perm":
                yield from _perms(value, where, at_attr)
            elif term.op == "constant" and key == "value":
                yield _nudge_value(value, where, at_attr)
            elif spec is not None and isinstance(value, Lit) \
                    and isinstance(value.value, (bool, str)):
                yield from _switch(key, value.value, spec.default, spec.tries, spec.convert,
                                   where, at_attr)
            else:
                yield from _numbers(key, value, where, at_attr)


def _numbers(key: str, value: Expr, where: str,
             at_attr: Callable[[Expr], Rule]) -> Iterator[Candidate]:
    """Each number within an attribute value changed: an axis (of `:axis`, `:axes`) moved to
    its neighbours, another integer (a size, a stride, `dim`'s axis) plus one, a float times
    1.5."""
    for e, rebuild in _expr_sites(value):
        if not isinstance(e, Lit):
            continue
        v = e.value
        if _is_int(v) and key in ("axis", "axes"):
            for a in _other_axes(v):
                yield _changed("axis", key, value, rebuild(Lit(a)), where, at_attr)
        elif _is_int(v):
            yield _changed("int", key, value, rebuild(Lit(v + 1)), where, at_attr)
        elif isinstance(v, float):
            yield _changed("nudge", key, value, rebuild(Lit(v * 1.5 if v else 1.0)), where,
                           at_attr)


def _changed(kind: str, key: str, old: Expr, new: Expr, where: str,
             at_attr: Callable[[Expr], Rule]) -> Candidate:
    """The candidate with attribute `key` set to `new` in place of `old`."""
    return kind, f":{key} {print_expr(old)} -> {print_expr(new)} in {where}", at_attr(new)


def _perms(value: Expr, where: str, at_attr: Callable[[Expr], Rule]) -> Iterator[Candidate]:
    """Two entries of a literal permutation swapped; the two permutations of a `compose`
    (not commutative) exchanged."""
    if isinstance(value, ListExpr):
        items = value.items
        for i in range(len(items)):
            for j in range(i + 1, len(items)):
                swapped = list(items)
                swapped[i], swapped[j] = items[j], items[i]
                yield _changed("perm", "perm", value, ListExpr(tuple(swapped)), where, at_attr)
    elif isinstance(value, Call) and value.fn == "compose" and len(value.args) == 2:
        p, q = value.args
        yield _changed("perm", "perm", value, Call("compose", (q, p)), where, at_attr)


def _switch(key: str, value: bool | str, default: Any, tries: Any,
            convert: Callable[[Any], Any] | None, where: str,
            at_attr: Callable[[Expr], Rule]) -> Iterator[Candidate]:
    """A boolean negated; a string (padding mode, activation, dtype) replaced by each other
    value the attribute is known to take: its default and the values the numerical check
    draws for it (`AttrSpec.tries`)."""
    if isinstance(value, bool):
        alternatives: list[Any] = [not value]
    else:
        known = [default] + (list(tries) if isinstance(tries, tuple) else [])
        written = _canonical(convert, value)
        alternatives = []
        for v in known:
            if isinstance(v, str) and v not in alternatives and _canonical(convert, v) != written:
                alternatives.append(v)
    for v in alternatives:
        yield _changed("enum", key, Lit(value), Lit(v), where, at_attr)


def _nudge_value(value: Expr, where: str, at_attr: Callable[[Expr], Rule]) -> Candidate:
    """A `constant`'s value changed: a number times 1.5 (1 for zero); a computed value (an
    epsilon bound in the source, a reciprocal) plus one."""
    if isinstance(value, Lit) and _is_number(value.value):
        new: Expr = Lit(value.value * 1.5 if value.value else 1.0)
    else:
        new = Call("+", (value, Lit(1)))
    return _changed("nudge", "value", value, new, where, at_attr)


def _swaps(rule: Rule) -> Iterator[Candidate]:
    """Neighbouring operands of a non-commutative operator exchanged, where they differ (add
    and mul commute: swapping theirs gives the same rule)."""
    for term, rebuild, place in _target_sites(rule):
        op = _op_def(term.op)
        if op is None or op.commutative:
            continue
        for i in range(len(term.args) - 1):
            a, b = term.args[i], term.args[i + 1]
            if a == b:
                continue
            args = term.args[:i] + (b, a) + term.args[i + 2:]
            yield ("swap", f"swapped operands {i} and {i + 1} of {term.op} at {place}: "
                   f"{print_term(a)} and {print_term(b)}", rebuild(replace(term, args=args)))


def _same_type_operands(term: OpTerm) -> list[int]:
    """Positions of the operands of `term` whose type is plausibly the term's own: every
    operand of an element-wise operator that the numerical check draws as more than a scalar
    (not smul's factor) and that is not a `constant` (a scalar); the first operand of a
    coarse operator (GELU, softmax, the norms, attention: each keeps the shape of its first
    operand); a transpose's operand (its type, where the permuted axes are equal, as the
    check's square draws make them). Not an alias view: identity and dropout would leave the
    rule right, the reshapes change the shape; not a cast, which changes the dtype."""
    op = _op_def(term.op)
    if op is None or op.view == "alias" or term.op == "cast":
        return []
    if op.category == Category.ELEMENTWISE:
        return [i for i, a in enumerate(term.args)
                if op.role(i).shapes != ((),)
                and not (isinstance(a, OpTerm) and a.op == "constant")]
    if op.category == Category.COARSE or term.op == "transpose":
        return [0] if term.args else []
    return []


def _unwraps(rule: Rule) -> Iterator[Candidate]:
    """An operator left out: a target subterm replaced by one of its operands of plausibly the
    same type (relu, neg, transpose dropped; an add replaced by one of its terms)."""
    for term, rebuild, place in _target_sites(rule):
        for i in _same_type_operands(term):
            arg = term.args[i]
            yield ("unwrap", f"({term.op} ...) at {place} replaced by its operand {i}, "
                   f"{print_term(arg)}", rebuild(arg))


def _drop_conditions(rule: Rule) -> Iterator[Candidate]:
    """One condition left out (one mutant per condition)."""
    for i, c in enumerate(rule.conditions):
        yield ("drop-cond", f"dropped condition {i}: {print_expr(c)}",
               replace(rule, conditions=rule.conditions[:i] + rule.conditions[i + 1:]))


_OPERATORS: tuple[Callable[[Rule], Iterator[Candidate]], ...] = (
    _drop_attrs, _attr_literals, _swaps, _drop_conditions, _unwraps)


def _round_trips(rule: Rule) -> bool:
    """Whether the rule's text parses back to the rule: a mutant reaches the verifier's
    workers as text (proofs.batch), so one that does not would be verified as another rule."""
    try:
        return parse_rules(print_rule(rule), origin=rule.origin) == [rule]
    except GraphsubError:
        return False


def mutants(rule: Rule) -> list[Mutant]:
    """The mutants of `rule`, each named `<rule>/<kind><i>` (i counting from 1 within the
    kind), in the order of `KINDS`. A mutation that gives back the original's text, or the
    text of an earlier mutant, or a rule that does not survive printing and parsing, is
    left out."""
    seen = {print_rule(rule)}
    found: list[Candidate] = []
    for operator in _OPERATORS:
        for kind, description, mutated in operator(rule):
            text = print_rule(mutated)
            if text in seen:
                continue
            seen.add(text)
            found.append((kind, description, mutated))
    found.sort(key=lambda c: KINDS.index(c[0]))
    out: list[Mutant] = []
    numbers = dict.fromkeys(KINDS, 0)
    origin = f"mutant of {rule.origin or rule.name}"
    for kind, description, mutated in found:
        candidate = replace(mutated, name=f"{rule.name}{SEPARATOR}{kind}{numbers[kind] + 1}",
                            origin=origin)
        if not _round_trips(candidate):
            continue
        numbers[kind] += 1
        out.append(Mutant(candidate, kind, description))
    return out
