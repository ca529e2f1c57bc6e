"""One representative per input renaming, chosen before any graph is replayed.

Inputs of the same shape and role are interchangeable: renaming them maps every pair of
equivalent graphs to another pair of equivalent graphs (with another fingerprint, so in
another shard), and every pair yields the same substitution up to renaming. Testing and
writing all of them is most of the generator's work and all of it is thrown away by the
first pruning step (TASO section 4). So a pair is kept only when it is the smallest of its
renamings: its variables of each class are the first ones of that class, and no permutation
of them gives a smaller text. The decision is local (it looks at the pair alone), so the
shards still need nothing from each other.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from graphsub.generate.enumerate import Encoded, GeneratorInput
from graphsub.generate.opset import OPS


def variable_classes(specs: Sequence[GeneratorInput]) -> list[list[int]]:
    """Input ids grouped into interchangeable classes, each in order."""
    classes: dict[tuple[object, ...], list[int]] = {}
    for i, s in enumerate(specs):
        key = (s.shape, s.kernel) if s.constant is None else ("constant", i)
        classes.setdefault(key, []).append(i)
    return list(classes.values())


def _render(enc: Encoded, n_inputs: int, names: dict[int, int]) -> str:
    """The graph's outputs as text, inputs renamed, commutative operands sorted."""
    text: dict[int, str] = {}
    consumed: set[int] = set()
    next_id = n_inputs
    for op, variant, ins in enc:
        args = [text[i] if i >= n_inputs else f"v{names.get(i, i)}" for i in ins]
        consumed.update(ins)
        if OPS[op].commutative:
            args.sort()
        base = f"{op}/{variant}({','.join(args)})"
        for k in range(OPS[op].outputs):
            text[next_id] = f"{base}.{k}"
            next_id += 1
    return "|".join(sorted(t for i, t in text.items() if i not in consumed))


def _used(enc: Encoded, n_inputs: int) -> set[int]:
    return {i for _, _, ins in enc for i in ins if i < n_inputs}


def is_representative(a: Encoded, b: Encoded, classes: Sequence[Sequence[int]],
                      n_inputs: int) -> bool:
    """Whether the unordered pair {a, b} is the smallest of its renamings."""
    used = _used(a, n_inputs) | _used(b, n_inputs)
    moving: list[list[int]] = []
    for cls in classes:
        in_use = [i for i in cls if i in used]
        if in_use != list(cls[:len(in_use)]):
            return False  # uses a later variable of the class while an earlier one is free
        if len(in_use) > 1:
            moving.append(in_use)
    if not moving:
        return True
    identity = min((_render(a, n_inputs, {}), _render(b, n_inputs, {})),
                   (_render(b, n_inputs, {}), _render(a, n_inputs, {})))
    for perms in itertools.product(*(itertools.permutations(c) for c in moving)):
        names = {src: dst for c, p in zip(moving, perms) for src, dst in zip(c, p)}
        ra, rb = _render(a, n_inputs, names), _render(b, n_inputs, names)
        if min((ra, rb), (rb, ra)) < identity:
            return False
    return True
