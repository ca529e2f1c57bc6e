"""Rules written as two Python functions, a pattern and its replacement, as onnxscript's
rewriter takes them:

    import math
    from graphsub.rules import python_rule

    def erf_gelu(op, x):
        return x * 0.5 * (1.0 + op.erf(x / math.sqrt(2.0)))

    def gelu(op, x):
        return op.gelu(x, approximate="none")

    rule = python_rule("my-gelu", erf_gelu, gelu, where=["(eq (shape $0) (shape ?x))"])

Each parameter after `op` is a pattern variable (`?x`); `op.NAME(*tensors, **attributes)` is
graphsub's operator NAME (docs/operators.md), and Python's `+ - * / @` are add, sub, mul,
div and matmul. A number in the pattern is a scalar constant compared by value (a fresh
variable with `close-to` and rank 0 conditions; a division by one is the product with its inverse, so `x /
math.sqrt(2.0)` matches 0.7071 multiplied or 1.4142 divided, however the graph wrote it;
graphsub.rules.chains); a number in the replacement is a scalar constant of the
first variable's dtype. An attribute given as `op.attr("name")` is an attribute variable
(`?name`). The functions are traced once into the rule language (their text is `print_rule`
of the result), so a Python rule is matched, applied, explained and checked numerically
exactly as a text rule is: `load_python_rules` checks them as `load_rules` checks files.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from graphsub.errors import GraphsubError
from graphsub.rules.ast import AVar, Call, Lit, ListExpr, OpTerm, Rule, Term, Var
from graphsub.rules.parser import parse_rules, print_expr, print_term


class PythonRuleError(GraphsubError):
    """A pattern or replacement function that does not trace to a rule."""


class Traced:
    """A tensor while a rule function is traced: a term of the rule language."""

    __slots__ = ("term", "tracer")

    def __init__(self, term: Term, tracer: _Tracer) -> None:
        self.term = term
        self.tracer = tracer

    def _binary(self, op: str, other: Any, reverse: bool = False) -> Traced:
        a, b = self.term, self.tracer.operand(other)
        return self.tracer.apply(op, (b, a) if reverse else (a, b), {})

    def __add__(self, other: Any) -> Traced:
        return self._binary("add", other)

    def __radd__(self, other: Any) -> Traced:
        return self._binary("add", other, reverse=True)

    def __sub__(self, other: Any) -> Traced:
        return self._binary("sub", other)

    def __rsub__(self, other: Any) -> Traced:
        return self._binary("sub", other, reverse=True)

    def __mul__(self, other: Any) -> Traced:
        return self._binary("mul", other)

    def __rmul__(self, other: Any) -> Traced:
        return self._binary("mul", other, reverse=True)

    def __truediv__(self, other: Any) -> Traced:
        if self.tracer.pattern and isinstance(other, (int, float)) and other:
            return self._binary("mul", 1.0 / other)  # compared by value: x * (1 / c)
        return self._binary("div", other)

    def __rtruediv__(self, other: Any) -> Traced:
        return self._binary("div", other, reverse=True)

    def __matmul__(self, other: Any) -> Traced:
        return self._binary("matmul", other)


class _AttrVar:
    """An attribute variable, `op.attr("name")`."""

    def __init__(self, name: str) -> None:
        self.name = name


class _Tracer:
    """The `op` a rule function is called with: builds terms. In a pattern, numbers become
    constants compared by value; in a replacement, constants of `dtype_of`'s dtype."""

    def __init__(self, pattern: bool, dtype_of: str, constants: list[tuple[str, float]]) -> None:
        self.pattern = pattern
        self.dtype_of = dtype_of
        self.constants = constants

    def attr(self, name: str) -> _AttrVar:
        return _AttrVar(name)

    def operand(self, value: Any) -> Term:
        if isinstance(value, Traced):
            return value.term
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise PythonRuleError(f"{value!r} is neither a tensor of the rule nor a number")
        if self.pattern:
            name = f"c{len(self.constants)}"
            self.constants.append((name, float(value)))
            return Var(name)
        return OpTerm("constant", (("value", Lit(float(value))), ("shape", ListExpr(())),
                                   ("dtype", Call("dtype", (AVar(self.dtype_of),)))), ())

    def apply(self, op: str, args: Sequence[Term], attrs: dict[str, Any]) -> Traced:
        return Traced(OpTerm(op, tuple((k, _attr_expr(v)) for k, v in attrs.items()),
                             tuple(args)), self)

    def __getattr__(self, op: str) -> Callable[..., Traced]:
        if op.startswith("_"):
            raise AttributeError(op)

        def call(*args: Any, **attrs: Any) -> Traced:
            return self.apply(op, [self.operand(a) for a in args], attrs)
        return call


def _attr_expr(value: Any) -> Any:
    if isinstance(value, _AttrVar):
        return AVar(value.name)
    if isinstance(value, (list, tuple)):
        return ListExpr(tuple(_attr_expr(v) for v in value))
    return Lit(value)


def _traced(fn: Callable[..., Any], names: Sequence[str], tracer: _Tracer) -> list[Term]:
    result = fn(tracer, *(Traced(Var(n), tracer) for n in names))
    outputs = result if isinstance(result, tuple) else (result,)
    terms = []
    for out in outputs:
        if not isinstance(out, Traced):
            raise PythonRuleError(f"{fn.__name__} must return tensors of the rule, not "
                                  f"{type(out).__name__}")
        terms.append(out.term)
    return terms


def python_rule(name: str, pattern: Callable[..., Any], replacement: Callable[..., Any],
                where: Iterable[str] = (), doc: str = "") -> Rule:
    """The rule `pattern => replacement` (each `fn(op, x, y, ...)`, see the module's
    docstring), with `where` conditions in the rule language's expression syntax."""
    names = list(inspect.signature(pattern).parameters)[1:]
    if not names:
        raise PythonRuleError(f"{pattern.__name__} takes `op` and at least one tensor")
    constants: list[tuple[str, float]] = []
    sources = _traced(pattern, names, _Tracer(True, names[0], constants))
    targets = _traced(replacement, names, _Tracer(False, names[0], constants))
    # a number is a scalar (a tensor of that value, even of one element, would broadcast the
    # result to its own shape, which the replacement's scalar does not)
    conditions = [f"(close-to ?{c} {print_expr(Lit(v))}), (eq (rank ?{c}) 0)"
                  for c, v in constants]
    lines = [f"# {line}" for line in doc.splitlines()]
    lines.append(f"rule {name}:")
    lines.append("  " + ", ".join(print_term(s) for s in sources))
    lines.append("  => " + ", ".join(print_term(t) for t in targets))
    if conditions or where:
        lines.append("  where " + ", ".join([*conditions, *where]))
    origin = inspect.getsourcefile(pattern) or "<python>"
    [rule] = parse_rules("\n".join(lines) + "\n", origin=origin)
    return rule


def load_python_rules(rules: Iterable[Rule], check: bool = True) -> list[Rule]:
    """Python rules checked numerically, as rule files are (the verdicts cached)."""
    from graphsub.rules.check import CheckedRules

    out = list(rules)
    if check:
        with CheckedRules.load() as passed:
            for r in out:
                passed.check(r)
    return out
