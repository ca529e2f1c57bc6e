"""Why a rule does or does not match: for every node where the rule's first source could
start, the answer a rule author needs (onnxscript's rewriter calls this a matching tracer).

The matcher itself tells a `Tracer` every failure as it matches (graphsub.rules.matcher);
here the furthest one is kept: the failure deepest in the pattern is the one nearest to a
match, and the one an author wants to see. Past the patterns come the rule's `where`
conditions (the first that does not hold, printed), the other source patterns of a
multi-pattern rule, and the rewrite itself (the applier's rejection, if any).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from graphsub.ir.graph import Graph, Value
from graphsub.rules.applier import Rejection, apply_match
from graphsub.rules.ast import OpTerm, Rule, Term
from graphsub.rules.expr import Env, RuleError, try_evaluate
from graphsub.rules.chains import Reciprocal
from graphsub.rules.matcher import find_matches, host_for, match_term, no_bindings, root_ops
from graphsub.rules.parser import print_expr, print_term


@dataclass(frozen=True)
class Explanation:
    """What the rule makes of one node: whether it matches there (and is rewritten), or
    where it fails: the pattern term, the graph node it was tried at, and why."""

    node: int
    matched: bool
    rewritten: bool
    reason: str
    pattern: str | None = None
    at: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"node": self.node, "matched": self.matched, "rewritten": self.rewritten,
                "reason": self.reason, "pattern": self.pattern, "at": self.at}


class _Furthest:
    """A Tracer that keeps the failure deepest in the pattern (the first of equal depth)."""

    def __init__(self, root: Term) -> None:
        self.depth: dict[int, int] = {}
        self._index(root, 0)
        self.best: tuple[int, Term, Any, str] | None = None

    def _index(self, term: Term, depth: int) -> None:
        self.depth[id(term)] = depth
        if isinstance(term, OpTerm):
            for arg in term.args:
                self._index(arg, depth + 1)

    def fail(self, term: Term, where: Any, reason: str) -> None:
        depth = self.depth.get(id(term), 0)
        if self.best is None or depth > self.best[0]:
            self.best = (depth, term, where, reason)


def explain(graph: Graph, rule: Rule) -> list[Explanation]:
    """For each node of the first source pattern's operator: whether the rule matches there
    and is rewritten, or why not. Empty where the graph has no such node."""
    source = rule.sources[0]
    if not isinstance(source, OpTerm):
        raise RuleError(f"rule {rule.name}: a source must be an operator, not a variable")
    host = host_for(graph, rule)
    out = []
    for nid in sorted(n for op in root_ops(rule) for n in graph.nodes_by_op(op)):
        if source.index >= len(graph[nid].outputs):
            out.append(Explanation(nid, False, False, f"the node has no output {source.index}",
                                   print_term(source), nid))
            continue
        tracer = _Furthest(source)
        bindings = list(match_term(host, source, Value(nid, source.index), no_bindings(),
                                   tracer))
        if not bindings:
            assert tracer.best is not None  # a failed match always says where
            _, term, where, reason = tracer.best
            if isinstance(where, Reciprocal):
                where = where.divisor
            at = where.node if isinstance(where, Value) else where
            if isinstance(where, Value) and isinstance(term, OpTerm) \
                    and reason.startswith("not computed by"):
                reason = (f"node {at} is {graph[at].op}" + (
                    f" (its output {where.index})" if where.index else "")
                    + f", the pattern asks for {term.op}"
                    + (f" (output {term.index})" if term.index else ""))
            out.append(Explanation(nid, False, False, reason, print_term(term), at))
            continue
        out.append(_past_the_first_source(graph, rule, nid, bindings))
    return out


def _past_the_first_source(graph: Graph, rule: Rule, nid: int,
                           bindings: list[Any]) -> Explanation:
    """The first source matched at `nid`: the rest of the rule decides."""
    matches = find_matches(graph, rule, first_roots=[nid])
    if not matches:
        if len(rule.sources) > 1:
            others = ", ".join(print_term(s) for s in rule.sources[1:])
            return Explanation(nid, False, False, "the first pattern matches, but nothing "
                               "matches the other pattern(s) with its bindings", others)
        return Explanation(nid, False, False, *_failed_condition(graph, rule, bindings, nid))
    rejections = []
    for match in matches:
        after = apply_match(graph, match)
        if not isinstance(after, Rejection):
            return Explanation(nid, True, True, f"matches and is rewritten ({len(match.nodes)} "
                               "node(s) replaced)")
        rejections.append(after.reason)
    return Explanation(nid, True, False, f"matches, but the rewrite is refused: "
                       f"{rejections[0]}")


def _failed_condition(graph: Graph, rule: Rule, bindings: list[Any], nid: int
                      ) -> tuple[str, str | None, int | None]:
    """The first `where` condition that fails for the first source's bindings at `nid`."""
    host = host_for(graph, rule)
    source = rule.sources[0]
    assert isinstance(source, OpTerm)  # explain() checked it
    for st in bindings:
        env = Env(host, st.tensors, st.attrs, (Value(nid, source.index),))
        for cond in rule.conditions:
            ok, value = try_evaluate(cond, env)
            if not ok or not value:
                why = "cannot be evaluated here" if not ok else "does not hold"
                return f"the condition {print_expr(cond)} {why}", print_expr(cond), nid
    return "the patterns match, but no match survived (its roots overlap)", None, nid


__all__ = ["Explanation", "explain"]
