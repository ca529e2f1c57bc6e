"""Symbolic dimensions: a tensor dimension is an int or a sympy expression over named sizes.

A model exported with a dynamic batch and sequence has inputs of shape `batch x seq`; every
shape inside it is then an expression of those sizes (`seq + 1`, `2*seq`,
`floor((h - 3)/2) + 1`). graphsub keeps them as sympy expressions, the representation torch's
ShapeEnv and onnxruntime's symbolic shape inference use, so that arithmetic on dimensions
simplifies (`batch*seq*768 / (batch*seq*12)` is 64) and equalities can be decided for every
value of the sizes, which is what a rewrite's shape condition needs.

Static shapes never touch sympy: a dimension that is a number is a Python int, and every
helper here returns ints for numbers, so concrete graphs keep today's speed; sympy itself is
imported when the first symbol is made (it takes half a second).

Size symbols are positive integers (a dimension of 0 never comes from a symbol), which lets
sympy decide `seq + 1 != seq` and `2*seq > seq` from the assumptions alone.
"""

from __future__ import annotations

import functools
import math
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeGuard, Union

import numpy as np

if TYPE_CHECKING:
    import sympy

#: One dimension: a non-negative int, or a sympy expression over size symbols.
Dim = Union[int, "sympy.Expr"]

_NAME_OK = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@functools.cache
def size_symbol(name: str) -> sympy.Symbol:
    """The symbol of a named size (`batch`, `seq`): a positive integer."""
    import sympy

    return sympy.Symbol(name, integer=True, positive=True)


def _expr(value: Any) -> TypeGuard[sympy.Basic]:
    """Whether `value` is a sympy object (none exists before sympy is imported)."""
    if type(value) is int:
        return False
    sympy = sys.modules.get("sympy")
    return sympy is not None and isinstance(value, sympy.Basic)


def symbol_name(text: str) -> str:
    """A usable symbol name for an exporter's dim_param (`"batch_size"`, `"s0"`, `"Addseq
    _dim_1"`): names that are not identifiers keep their characters' meaning as far as they
    can, with others replaced by underscores."""
    if _NAME_OK.match(text):
        return text
    cleaned = re.sub(r"[^A-Za-z0-9_]", "_", text.strip()) or "dim"
    return cleaned if _NAME_OK.match(cleaned) else f"d_{cleaned}"


def dim(value: Any) -> Dim:
    """A dimension in canonical form: numbers (Python, numpy or sympy) as Python ints,
    expressions simplified by sympy's automatic rules."""
    if isinstance(value, (int, np.integer)):
        return int(value)
    if _expr(value):
        if value.is_Integer:
            return int(value)
        if value.is_Number:
            raise ValueError(f"a dimension must be an integer, got {value}")
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise TypeError(f"a dimension must be an int or a size expression, got {value!r}")


def is_symbolic(d: Any) -> TypeGuard[sympy.Basic]:
    return _expr(d)


def is_static(dims: Iterable[Any]) -> bool:
    """Whether every dimension is a number."""
    return not any(_expr(d) for d in dims)


def symbols_in(dims: Iterable[Any]) -> frozenset[str]:
    """The names of the size symbols the dimensions use."""
    names: set[str] = set()
    for d in dims:
        if _expr(d):
            names.update(s.name for s in d.free_symbols)
    return frozenset(names)


def symbols_in_value(value: Any) -> frozenset[str]:
    """The names of the size symbols an attribute value uses: a size expression, or tuples,
    lists and mappings (attributes) holding them."""
    if is_symbolic(value):
        return symbols_in((value,))
    if isinstance(value, (tuple, list)):
        return frozenset().union(*(symbols_in_value(v) for v in value))
    if hasattr(value, "items"):
        return frozenset().union(*(symbols_in_value(v) for _, v in value.items()))
    return frozenset()


def bind(d: Dim, binding: Mapping[str, int]) -> int:
    """The dimension's value when each size symbol takes the value `binding` gives it."""
    if not _expr(d):
        return d
    value = d.subs({size_symbol(n): v for n, v in binding.items()})
    if not value.is_Integer:
        missing = sorted(s.name for s in value.free_symbols)
        raise KeyError(f"no value for size symbol(s) {', '.join(missing)} in {dict(binding)}")
    return int(value)


def renamed(t: Any, names: Mapping[str, Dim]) -> Any:
    """A TensorType with the size symbols `names` maps replaced by what it maps them to."""
    if not names or t.is_static:
        return t
    subs = {size_symbol(n): v for n, v in names.items()}
    return type(t)(tuple(d.subs(subs) if _expr(d) else d for d in t.shape), t.dtype)


def bind_all(dims: Sequence[Dim], binding: Mapping[str, int]) -> tuple[int, ...]:
    return tuple(bind(d, binding) for d in dims)


def equal(a: Dim, b: Dim) -> bool | None:
    """Whether two dimensions are equal for every value of their symbols: True where they
    provably are, False where they provably never are, None where it depends on the values
    (`seq` and `128`, or two independent sizes)."""
    if not _expr(a) and not _expr(b):
        return a == b
    import sympy

    diff = sympy.expand(sympy.sympify(a) - sympy.sympify(b))
    if diff.is_zero:
        return True
    if diff.is_positive or diff.is_negative:
        return False
    return None


def at_most(a: Dim, b: Dim) -> bool | None:
    """Whether a <= b for every value of the symbols (None: it depends on them)."""
    if not _expr(a) and not _expr(b):
        return a <= b
    import sympy

    diff = sympy.expand(sympy.sympify(b) - sympy.sympify(a))
    if diff.is_nonnegative:
        return True
    if diff.is_negative:
        return False
    return None


def is_negative(d: Dim) -> bool | None:
    """Whether the value is below zero for every value of the symbols (None: it depends)."""
    if not _expr(d):
        return d < 0
    if d.is_negative:
        return True
    if d.is_nonnegative:
        return False
    return None


def provably_equal(a: Dim, b: Dim) -> bool:
    return equal(a, b) is True



def product(dims: Iterable[Dim]) -> Dim:
    return dim(math.prod(dims, start=1))


def floordiv(a: Dim, b: Dim) -> Dim:
    """a // b (both non-negative), exact where sympy can tell that b divides a."""
    if not _expr(a) and not _expr(b):
        return a // b
    import sympy

    q = sympy.cancel(sympy.sympify(a) / sympy.sympify(b))
    if q.is_integer:
        return dim(q)
    return dim(sympy.floor(q))


def ceildiv(a: Dim, b: int) -> Dim:
    """ceil(a / b) for a non-negative a and a positive b."""
    if not _expr(a):
        return -(-a // b)
    import sympy

    q = sympy.cancel(a / b)
    return dim(q if q.is_integer else sympy.ceiling(q))


def evaluate_size(d: Dim, values: Mapping[str, Any]) -> Any:
    """A size expression computed from the values of its symbols with Python arithmetic
    alone (sums, products, floor and ceiling of quotients, minimum and maximum), so that it
    works on ints and on torch's symbolic ints (SymInt) when a program is traced with
    dynamic shapes."""
    if not _expr(d):
        return d
    import sympy

    if d.is_Integer:
        return int(d)
    if d.is_Symbol:
        return values[d.name]
    if isinstance(d, (sympy.floor, sympy.ceiling)):
        num, den = sympy.fraction(sympy.together(d.args[0]))
        n, q = evaluate_size(sympy.expand(num), values), int(den)
        return n // q if isinstance(d, sympy.floor) else -(-n // q)
    args = [evaluate_size(a, values) for a in d.args]
    if isinstance(d, sympy.Add):
        return functools.reduce(lambda a, b: a + b, args)
    if isinstance(d, sympy.Mul):
        return functools.reduce(lambda a, b: a * b, args)
    if isinstance(d, sympy.Pow) and d.exp.is_Integer and int(d.exp) > 0:
        return functools.reduce(lambda a, b: a * b, [args[0]] * int(d.exp))
    if isinstance(d, sympy.Min):
        return functools.reduce(min, args)
    if isinstance(d, sympy.Max):
        return functools.reduce(max, args)
    if isinstance(d, sympy.Mod):
        return args[0] % args[1]
    raise ValueError(f"cannot compute the size {d} with integer arithmetic")


def dim_text(d: Dim) -> str:
    """How a dimension is written in a dim_param and in reports (`seq + 1`, `2*seq`)."""
    return str(d)


@functools.lru_cache(maxsize=4096)
def parse_dim(text: str) -> Dim:
    """A dimension from `dim_text`'s form; every name in it is a size symbol. Cached: a deep
    model names the same few sizes on thousands of values, and sympy's parser is slow."""
    import sympy

    names = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text)) - {"floor", "ceiling", "Min",
                                                                  "Max", "Mod"}
    local = {n: size_symbol(n) for n in names}
    local.update(floor=sympy.floor, ceiling=sympy.ceiling, Min=sympy.Min, Max=sympy.Max,
                 Mod=sympy.Mod)
    return dim(sympy.sympify(text, locals=local))


@dataclass(frozen=True)
class SymbolRange:
    """The values one size symbol may take: at least `low`, at most `high` (None: no bound
    known). An exporter rarely writes a range; graphsub learns upper bounds from the model
    itself (a slice of a 2048-row table by `seq` is defined for `seq <= 2048`)."""

    low: int = 1
    high: int | None = None

    def clamp(self, value: int) -> int:
        value = max(self.low, value)
        return value if self.high is None else min(self.high, value)

    def narrowed(self, low: int | None = None, high: int | None = None) -> SymbolRange:
        lo = self.low if low is None else max(self.low, low)
        hi = self.high if high is None else (high if self.high is None else min(self.high, high))
        return SymbolRange(lo, hi)

    def __str__(self) -> str:
        return f"{self.low}..{'' if self.high is None else self.high}"
