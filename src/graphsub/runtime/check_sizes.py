"""The sizes a model with symbolic dimensions is checked at.

A rewrite that is right at one size can be wrong at another (a reshape that only works
when `seq` is even, a broadcast that only holds at batch 1), so the written model is compared
with the original at several bindings of its size symbols: the profile's, every symbol at its
smallest (1: a batch of one, a sequence of one token, where broadcasting differs), each at its
largest, and odd sizes drawn in between (where an even split or a halving would show).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from graphsub.errors import GraphsubError
from graphsub.tensors.symbolic import SymbolRange

#: The largest size drawn for a symbol with no upper bound: big enough for the sizes where
#: a rewrite's assumptions could break (past any small constant), small enough to check fast.
UNBOUNDED_LARGEST = 64
#: The fewest bindings a symbolic model is checked at.
MIN_BINDINGS = 5


def check_bindings(symbols: Mapping[str, SymbolRange],
                   profile: Sequence[Mapping[str, int]] = (), count: int = MIN_BINDINGS,
                   seed: int = 0) -> list[dict[str, int]]:
    """At least `count` distinct bindings of `symbols` (fewer only where the ranges hold
    fewer): the profile's, all at their smallest, each at its largest with the others at
    their smallest, then odd sizes drawn in their ranges. Empty for a static model."""
    if not symbols:
        return []
    names = sorted(symbols)
    largest = {n: _largest(symbols[n], [p[n] for p in profile if n in p]) for n in names}
    found: list[dict[str, int]] = []

    def add(binding: dict[str, int]) -> None:
        binding = {n: symbols[n].clamp(binding[n]) for n in names}
        if binding not in found:
            found.append(binding)

    for p in profile:
        add({n: p.get(n, symbols[n].low) for n in names})
    add({n: symbols[n].low for n in names})
    for big in names:  # one symbol at a time: all at their largest at once can be huge
        add({n: largest[n] if n == big else symbols[n].low for n in names})
    rng = np.random.default_rng(seed)
    tries = 0
    while len(found) < count and tries < 100 * count:
        tries += 1
        add({n: _odd(rng, symbols[n].low, largest[n]) for n in names})
    return found


def _largest(r: SymbolRange, profiled: list[int]) -> int:
    if r.high is not None:
        return r.high
    return max([UNBOUNDED_LARGEST, *(2 * v for v in profiled)])


def _odd(rng: np.random.Generator, low: int, high: int) -> int:
    value = int(rng.integers(low, high + 1))
    return value if value % 2 or value + 1 > high else value + 1


@dataclass(frozen=True)
class ProfileShape:
    """One concrete binding of the size symbols that costs are measured at, and its weight
    among the profile's shapes (how much of the model's running time it stands for)."""

    binding: tuple[tuple[str, int], ...]
    weight: float = 1.0

    @classmethod
    def of(cls, binding: Mapping[str, int], weight: float = 1.0) -> ProfileShape:
        return cls(tuple(sorted(binding.items())), weight)

    @property
    def values(self) -> dict[str, int]:
        return dict(self.binding)

    def __str__(self) -> str:
        text = ",".join(f"{n}={v}" for n, v in self.binding)
        return text if self.weight == 1.0 else f"{text}:{self.weight:g}"


#: A size symbol whose name says it counts examples: its default profile value is 1.
_BATCH_LIKE = re.compile(r"batch|^(n|b|bs)$", re.IGNORECASE)
#: The default profile value of every other size symbol (a sequence of 128 tokens, an image
#: side of 128 pixels), within the symbol's range.
DEFAULT_SIZE = 128


def default_profile(symbols: Mapping[str, SymbolRange]) -> tuple[ProfileShape, ...]:
    """The profile used when none is given: 1 for batch-like sizes (what latency-bound
    serving runs), DEFAULT_SIZE for the others, each within its range."""
    if not symbols:
        return ()
    return (ProfileShape.of({n: r.clamp(1 if _BATCH_LIKE.search(n) else DEFAULT_SIZE)
                             for n, r in symbols.items()}),)


def parse_profile(text: str) -> ProfileShape:
    """`batch=8,seq=512` or, with a weight, `batch=8,seq=512:0.25`."""
    body, _, weight = text.partition(":")
    values: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in body.split(","))):
        name, eq, value = item.partition("=")
        if not eq or not name.strip() or not value.strip().isdigit() or int(value) < 1:
            raise GraphsubError(f"--shape-profile {text!r}: write sizes as NAME=N with N >= 1, "
                                "separated by commas, e.g. batch=1,seq=128 (a weight after "
                                "a colon: batch=8,seq=512:0.25)")
        values[name.strip()] = int(value)
    try:
        w = float(weight) if weight else 1.0
    except ValueError:
        w = -1.0
    if not values or not w > 0:
        raise GraphsubError(f"--shape-profile {text!r}: give at least one NAME=N and a "
                            "positive weight")
    return ProfileShape.of(values, w)


def complete_profile(profile: Sequence[ProfileShape], symbols: Mapping[str, SymbolRange]
                     ) -> tuple[ProfileShape, ...]:
    """The profile for a model with these symbols: the default where none is given; each
    given shape checked against the symbols (every one given, none unknown, each inside its
    range), with an error naming what is wrong."""
    if not symbols:
        return ()
    if not profile:
        return default_profile(symbols)
    for shape in profile:
        given = shape.values
        unknown = sorted(set(given) - set(symbols))
        missing = sorted(set(symbols) - set(given))
        if unknown or missing:
            raise GraphsubError(f"--shape-profile {shape}: the model's sizes are "
                                f"{', '.join(sorted(symbols))}"
                                + (f"; unknown: {', '.join(unknown)}" if unknown else "")
                                + (f"; missing: {', '.join(missing)}" if missing else ""))
        for name, value in given.items():
            r = symbols[name]
            if r.clamp(value) != value:
                raise GraphsubError(f"--shape-profile {shape}: {name}={value} is outside the "
                                    f"sizes the model is defined for ({name} in {r})")
    return tuple(profile)
