"""The sizes a model with symbolic dimensions is checked at.

A rewrite that is right at one size can be wrong at another (a reshape that only works
when `seq` is even, a broadcast that only holds at batch 1), so the written model is compared
with the original at several bindings of its size symbols: the profile's, every symbol at its
smallest (1: a batch of one, a sequence of one token, where broadcasting differs), each at its
largest, and odd sizes drawn in between (where an even split or a halving would show).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from graphsub.ir.symbolic import SymbolRange

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
