"""The rule language's syntax tree: tensor terms, attribute expressions and rules.

A rule maps one or more *source* terms (the roots of a pattern, sharing variables) to as many
*target* terms: the i-th target replaces the i-th source. Terms build operators; attribute
expressions compute attribute values, from literals, variables bound in the source, and the
shapes of matched tensors. See docs/rules.md for the text format.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from graphsub.rules.roles import DEFAULT_ROLES, Role


# ---- attribute expressions ------------------------------------------------------------------

@dataclass(frozen=True)
class Lit:
    """A literal: int, float, string (an identifier such as same or relu) or bool."""

    value: Any


@dataclass(frozen=True)
class AVar:
    """An attribute variable (?name): bound by a source attribute, used in the target."""

    name: str


@dataclass(frozen=True)
class ListExpr:
    """A list of expressions, [a b c]; it evaluates to a tuple."""

    items: tuple[Expr, ...]


@dataclass(frozen=True)
class Call:
    """A function of expressions: (dim ?w 0), (max a b), (eq a b), ..."""

    fn: str
    args: tuple[Expr, ...]


@dataclass(frozen=True)
class OutRef:
    """$i: the i-th source root, as a tensor whose shape expressions may read."""

    index: int


Expr = Lit | AVar | ListExpr | Call | OutRef


# ---- tensor terms ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Var:
    """A tensor variable (?name): binds any value in the source, stands for it in the target."""

    name: str


@dataclass(frozen=True)
class OpTerm:
    """(op :attr expr ... args ...), optionally projected to one output with .N."""

    op: str
    attrs: tuple[tuple[str, Expr], ...]
    args: tuple[Term, ...]
    index: int = 0


@dataclass(frozen=True)
class Ref:
    """A name bound by `let` in the target, optionally projected (.N)."""

    name: str
    index: int = 0


Term = Var | OpTerm | Ref


@dataclass(frozen=True)
class Rule:
    """A rewrite (sources => targets where conditions), what it is for (`roles`, as its file
    declares them: graphsub.rules.roles) and where it came from (`origin`). Two rules are
    equal when they rewrite alike, are documented alike and declare the same roles."""

    name: str
    sources: tuple[Term, ...]
    targets: tuple[Term, ...]
    lets: tuple[tuple[str, Term], ...] = ()
    conditions: tuple[Expr, ...] = ()
    doc: str = ""
    origin: str = field(default="", compare=False)  # the file (or TASO rule) it came from
    roles: frozenset[Role] = DEFAULT_ROLES
    _vars: frozenset[str] = field(default=frozenset(), compare=False, repr=False)

    def __post_init__(self) -> None:
        names: set[str] = set()
        for s in self.sources:
            names |= term_vars(s)
        object.__setattr__(self, "_vars", frozenset(names))

    @property
    def source_vars(self) -> frozenset[str]:
        return self._vars


def term_vars(term: Term) -> set[str]:
    """Tensor variables of a term."""
    if isinstance(term, Var):
        return {term.name}
    if isinstance(term, OpTerm):
        out: set[str] = set()
        for a in term.args:
            out |= term_vars(a)
        return out
    return set()


def term_ops(term: Term) -> list[str]:
    if isinstance(term, OpTerm):
        ops = [term.op]
        for a in term.args:
            ops += term_ops(a)
        return ops
    return []
