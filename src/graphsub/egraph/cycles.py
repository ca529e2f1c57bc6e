"""Tensat's cycle filtering (Yang et al. 2021, section 4.3): extraction must never return a
cyclic graph, and the e-graph of a tensor program grows cycles as soon as a rule equates a
tensor with an expression that reads it (TASO figure 6).

Two parts. The *efficient filter*: at the start of an iteration the descendants of every class
are computed once; a match whose target would read a class that has the matched root among its
descendants is not applied, since the root would become its own descendant. The filter is
approximate because the e-graph changes during the iteration, so at the end of each iteration
the remaining cycles are found and broken by blacklisting the most recently added e-node of
each cycle. The input graph is acyclic, so every cycle holds at least one added e-node and the
original program stays extractable.
"""

from __future__ import annotations

from collections.abc import Iterator

from graphsub.egraph.egraph import EGraph


class Descendants:
    """Descendant sets of every class at one moment, as bit masks over class ids."""

    def __init__(self, eg: EGraph) -> None:
        self.eg = eg
        self._masks: dict[int, int] = {}
        for cls in _post_order(eg):
            mask = 0
            for n in eg.nodes_of(cls):
                for c in eg.node(n).children:
                    c = eg.find(c)
                    mask |= (1 << c) | self._masks.get(c, 0)
            self._masks[cls] = mask

    def reaches(self, src: int, dst: int) -> bool:
        """Whether dst is src or one of its descendants (classes unknown then: no)."""
        src, dst = self.eg.find(src), self.eg.find(dst)
        return src == dst or bool(self._masks.get(src, 0) >> dst & 1)


def _post_order(eg: EGraph) -> list[int]:
    """Classes, children before readers, over live e-nodes (on a cycle, any order)."""
    order: list[int] = []
    state: dict[int, int] = {}
    for start in eg.classes:
        if start in state:
            continue
        stack = [(start, iter(_children(eg, start)))]
        state[start] = 1
        while stack:
            cls, it = stack[-1]
            for c in it:
                if c not in state:
                    state[c] = 1
                    stack.append((c, iter(_children(eg, c))))
                    break
            else:
                stack.pop()
                state[cls] = 2
                order.append(cls)
    return order


def _children(eg: EGraph, cls: int) -> list[int]:
    return [eg.find(c) for n in eg.nodes_of(cls) for c in eg.node(n).children]


def break_cycles(eg: EGraph) -> int:
    """Blacklist the newest e-node on each cycle until none is left; how many were."""
    removed = 0
    while True:
        cycle = find_cycle(eg)
        if cycle is None:
            return removed
        eg.blacklist.add(max(cycle))
        removed += 1


def find_cycle(eg: EGraph) -> list[int] | None:
    """The e-nodes of one cycle (each reads the next one's class), or None when acyclic."""
    state: dict[int, int] = {}
    for start in eg.classes:
        if start in state:
            continue
        # Each frame: (class, the e-node we entered it through, iterator over (e-node, child)).
        stack: list[tuple[int, int, Iterator[tuple[int, int]]]] = [
            (start, -1, iter(_edges(eg, start)))]
        on_stack = {start: 0}
        state[start] = 1
        while stack:
            cls, via, it = stack[-1]
            advanced = False
            for n, c in it:
                if state.get(c) == 1:  # back edge: the path from c to cls, closed by n
                    first = on_stack[c]
                    return [stack[i][1] for i in range(first + 1, len(stack))] + [n]
                if c not in state:
                    state[c] = 1
                    on_stack[c] = len(stack)
                    stack.append((c, n, iter(_edges(eg, c))))
                    advanced = True
                    break
            if not advanced:
                stack.pop()
                del on_stack[cls]
                state[cls] = 2
    return None


def _edges(eg: EGraph, cls: int) -> list[tuple[int, int]]:
    return [(n, eg.find(c)) for n in eg.nodes_of(cls) for c in eg.node(n).children]
