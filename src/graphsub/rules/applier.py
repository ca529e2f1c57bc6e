"""Applying a match: build the target, redirect the source roots' readers to it, clean up.

A match is rejected (None is returned, with the reason counted) when a matched node that is not
a mapped root is read outside the match (its value would be lost), when a target's type differs
from its source's, when the target cannot be built (shapes that do not fit), or when the result
has a cycle (TASO figure 6).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from graphsub.errors import CycleError, GraphsubError, ShapeError
from graphsub.ir.graph import Graph, GraphEditor, Value
from graphsub.rules.ast import OpTerm, Ref, Term, Var
from graphsub.rules.expr import Env, try_evaluate
from graphsub.rules.matcher import SAME_SHAPES, Match

#: Why matches were rejected, across the process (reported in search statistics).
REJECTIONS: Counter[str] = Counter()


class Rejected(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _external_use(graph: Graph, match: Match) -> str | None:
    roots = set(match.roots)
    outputs = set(graph.outputs)
    users = graph.users()
    for nid in match.nodes:
        for i in range(len(graph[nid].outputs)):
            v = Value(nid, i)
            if v in roots:
                continue
            if v in outputs:
                return "unmapped output"
            for user, pos in users.get(nid, ()):
                if graph[user].inputs[pos] == v and user not in match.nodes:
                    return "unmapped external use"
    return None


class _TargetBuilder:
    """Instantiates target terms, sharing identical subterms (hash-consing)."""

    def __init__(self, editor: GraphEditor, match: Match, graph: Graph) -> None:
        self.ed = editor
        self.match = match
        self.env = Env(graph, match.tensors, match.attrs, match.roots)
        self.memo: dict[Any, tuple[Value, ...]] = {}
        self.lets: dict[str, tuple[Value, ...]] = {}

    def build(self, term: Term) -> Value:
        if isinstance(term, Var):
            if term.name not in self.match.tensors:
                raise Rejected(f"target variable ?{term.name} is not bound by the source")
            return self.match.tensors[term.name]
        if isinstance(term, Ref):
            outs = self.lets.get(term.name)
            if outs is None:
                raise Rejected(f"let name {term.name!r} is not defined")
            return outs[term.index]
        assert isinstance(term, OpTerm)
        outs = self.build_outputs(term)
        if term.index >= len(outs):
            raise Rejected(f"{term.op} has no output {term.index}")
        return outs[term.index]

    def build_outputs(self, term: Term) -> tuple[Value, ...]:
        if isinstance(term, Ref):
            if term.name not in self.lets:
                raise Rejected(f"let name {term.name!r} is not defined")
            return self.lets[term.name]
        if isinstance(term, Var):
            return (self.build(term),)
        assert isinstance(term, OpTerm)
        inputs = tuple(self.build(a) for a in term.args)
        attrs = target_attrs(term, self.env, [self.ed.type_of(v).shape for v in inputs])
        key = (term.op, tuple(sorted((k, repr(v)) for k, v in attrs.items())), inputs)
        if key in self.memo:
            return self.memo[key]
        if term.op == "constant":
            outs = self._constant(attrs, inputs)
        else:
            outs = self.ed.add(term.op, inputs, attrs)
        self.memo[key] = outs
        return outs

    def _constant(self, attrs: dict[str, Any], inputs: tuple[Value, ...]) -> tuple[Value, ...]:
        return self.ed.add("weight", (), {"value": constant_from_attrs(attrs)})


def target_attrs(term: OpTerm, env: Any, input_shapes: Sequence[tuple[int, ...]]
                 ) -> dict[str, Any]:
    """A target term's attributes evaluated for a match (an Env, or anything that reads like
    one), after checking its :same-shapes flag against the shapes of its built inputs."""
    attrs = {}
    for k, e in term.attrs:
        if k != SAME_SHAPES:
            ok, attrs[k] = try_evaluate(e, env)
            if not ok:
                raise Rejected("a target attribute has no value for this match")
    if any(k == SAME_SHAPES for k, _ in term.attrs) and len(set(input_shapes)) > 1:
        raise Rejected("broadcasting where the rule forbids it")
    return attrs


def constant_from_attrs(attrs: dict[str, Any]) -> np.ndarray:
    """(constant :value v :shape [..] [:dtype d] [:pattern p]): a weight of one value, or
    an identity (TASO's I_matmul, I_conv) with `:pattern eye` or `:pattern conv-identity`."""
    return constant_array(tuple(attrs.get("shape", ())), attrs.get("value", 1.0),
                          attrs.get("pattern", "full"), attrs.get("dtype", "float32"))


def constant_array(shape: tuple[int, ...], value: float, pattern: str, dtype: str) -> np.ndarray:
    if pattern == "full":
        return np.full(shape, value, dtype=dtype)
    arr = np.zeros(shape, dtype=dtype)
    if pattern == "eye" and len(shape) == 2 and shape[0] == shape[1]:
        arr[np.arange(shape[0]), np.arange(shape[0])] = value
    elif pattern == "conv-identity" and len(shape) == 4 and shape[0] == shape[1]:
        arr[np.arange(shape[0]), np.arange(shape[0]), shape[2] // 2, shape[3] // 2] = value
    else:
        raise Rejected(f"constant pattern {pattern!r} does not fit shape {shape}")
    return arr


def apply_match(graph: Graph, match: Match) -> Graph | None:
    """The graph with the match rewritten, or None when the rewrite is not allowed."""
    reason = _external_use(graph, match)
    if reason is not None:
        REJECTIONS[reason] += 1
        return None
    editor = graph.edit()
    builder = _TargetBuilder(editor, match, graph)
    rule = match.rule
    try:
        for name, term in rule.lets:
            builder.lets[name] = builder.build_outputs(term)
        targets = [builder.build(t) for t in rule.targets]
        for old, new in zip(match.roots, targets):
            if old != new:
                editor.replace_uses(old, new)
        return editor.finish()
    except Rejected as exc:
        REJECTIONS[exc.reason] += 1
    except ShapeError:
        REJECTIONS["shape or type mismatch"] += 1
    except CycleError:
        REJECTIONS["cycle"] += 1
    except GraphsubError:
        REJECTIONS["target not buildable"] += 1
    return None
