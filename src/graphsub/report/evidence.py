"""What an HTML report shows besides the figures a run keeps anyway: where the time goes by
operator type, and each rewrite as the small subgraph it changed.

A search records where each rewrite applied its rule (`Step.match`: the matched nodes and
the bindings). To draw the rewrites, they are replayed on the original graph at those
matches: node ids carry over between a graph and its rewrite, and the applier numbers new
nodes the same way every time, so the replay makes the search's own graphs and ends at the
candidate's. A path without recorded matches (an e-graph extraction, a split search's parts)
is drawn as the whole difference between the two graphs at once, and the report says so.
All of it is plain data (JSON), so a saved report can be rendered later.
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict
from collections.abc import Sequence
from typing import Any

from graphsub.cost.base import CostModel
from graphsub.ir.graph import Graph, Node, Value
from graphsub.rules.applier import Rejection, apply_match
from graphsub.rules.ast import Rule
from graphsub.rules.matcher import Match, find_matches
from graphsub.rules.parser import print_rule
from graphsub.search.result import Candidate, Step, StepKind, StepMatch

#: Changed nodes drawn per rewrite at most (a drawing of hundreds of boxes shows nothing).
MAX_DRAWN = 24
#: Z3's time per rule when a report says whether the rules it shows are proven.
PROOF_MS = 1000


def op_times(graph: Graph, cost_model: CostModel) -> dict[str, float]:
    """The predicted cost of `graph` by operator type (the cost model's unit: seconds for
    the measured model), largest first. Weight-only nodes are folded at export and cost
    nothing."""
    folded = graph.weight_only()
    totals: dict[str, float] = defaultdict(float)
    for nid, node in graph.nodes.items():
        if node.op in ("input", "weight") or nid in folded:
            continue
        totals[_op_type(node)] += cost_model.node_cost(graph, nid)
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))


def _op_type(node: Node) -> str:
    """The operator's name as a user knows it: an opaque node's ONNX type."""
    return str(node.attrs["op_type"]) if node.op == "opaque" else node.op


def _label(graph: Graph, nid: int) -> str:
    node = graph[nid]
    return f"input {node.attrs['name']}" if node.op == "input" else _op_type(node)


def _shape(graph: Graph, nid: int) -> str:
    shape = graph[nid].type.shape
    return "×".join(str(d) for d in shape) if shape else "scalar"


def _same_operator(a: Node, b: Node) -> bool:
    """Whether two nodes apply the same operator with the same attributes to inputs of the
    same types (what they read aside)."""
    if a.op != b.op or a.op in ("input", "weight") or len(a.inputs) != len(b.inputs):
        return False
    try:
        return a.outputs == b.outputs and a.attrs == b.attrs
    except (TypeError, ValueError):  # attributes that do not compare: never the same
        return False


def graph_diff(before: Graph, after: Graph) -> tuple[set[int], set[int], dict[int, int]]:
    """The nodes of `before` that are gone, the nodes of `after` that are new, and which node
    of `before` each remaining node of `after` is. Nodes correspond when they compute the
    same thing (equal fingerprints: everything upstream of a rewrite), or, walking back from
    the outputs, when they apply the same operator where their readers read corresponding
    nodes (everything downstream): a rewrite changes its subgraph, not all that follows."""
    by_fp: dict[int, list[int]] = defaultdict(list)
    fp_before = before.fingerprints()
    for nid in before.topo_order():
        by_fp[fp_before[nid]].append(nid)
    fp_after = after.fingerprints()
    mapping: dict[int, int] = {}
    used: set[int] = set()
    for nid in after.topo_order():
        alike = by_fp.get(fp_after[nid])
        if alike:  # equal weights, equal subgraphs: pair them off in order
            same = next((n for n in alike if n not in used), alike[0])
            mapping[nid] = same
            used.add(same)
    pending = [(a.node, b.node) for a, b in zip(after.outputs, before.outputs)
               if a.index == b.index]
    pending_pairs: set[int] = set()  # after-nodes paired walking back, checked below
    while pending:
        a, b = pending.pop()
        if a not in mapping:
            if b in used or not _same_operator(after[a], before[b]):
                continue
            mapping[a] = b
            used.add(b)
            pending_pairs.add(a)
        elif mapping[a] != b:
            continue
        pending.extend((va.node, vb.node) for va, vb in zip(after[a].inputs, before[b].inputs)
                       if va.index == vb.index and va.node not in mapping)
    # A pair found walking back is the same node only if it reads the same inputs, or reads,
    # where it differs, what the rewrite replaced on both sides (the replacement's readers).
    for a in after.topo_order():
        if a not in pending_pairs or a not in mapping:
            continue
        b = mapping[a]
        for va, vb in zip(after[a].inputs, before[b].inputs):
            agree = (va.node in mapping and mapping[va.node] == vb.node and va.index == vb.index)
            replaced = vb.node not in used  # it reads what took the place of vb
            if not (agree or replaced):
                del mapping[a]
                used.discard(b)
                break
    removed = {nid for nid in before.nodes if nid not in used}
    added = {nid for nid in after.nodes if nid not in mapping}
    return removed, added, mapping


def _context(graph: Graph, shown: set[int]) -> set[int]:
    """The direct producers and readers of `shown`, outside it."""
    users = graph.users()
    context: set[int] = set()
    for nid in shown:
        context.update(v.node for v in graph[nid].inputs)
        context.update(user for user, _ in users.get(nid, ()))
    return context - shown


def _view(graph: Graph, shown: set[int], context: set[int], hidden: int) -> dict[str, Any]:
    members = shown | context
    nodes = [{"id": nid, "label": _label(graph, nid), "shape": _shape(graph, nid),
              "changed": nid in shown}
             for nid in graph.topo_order() if nid in members]
    edges = sorted({(v.node, nid) for nid in members for v in graph[nid].inputs
                    if v.node in members})
    return {"nodes": nodes, "edges": [list(e) for e in edges], "hidden": hidden}


def _first(graph: Graph, nodes: set[int]) -> set[int]:
    return set([nid for nid in graph.topo_order() if nid in nodes][:MAX_DRAWN])


def change_view(before: Graph, after: Graph) -> dict[str, Any]:
    """The subgraph a rewrite (or several) changed, before and after, as drawable data: the
    changed nodes (at most MAX_DRAWN each side, the first in topological order) and, on both
    sides, their direct producers and readers on either side, for context."""
    removed, added, mapping = graph_diff(before, after)
    gone, new = _first(before, removed), _first(after, added)
    back = {b: a for a, b in mapping.items()}
    context_before = _context(before, gone) - removed
    context_after = _context(after, new) - added
    context_before |= {mapping[n] for n in context_after if n in mapping}
    context_after |= {back[n] for n in context_before if n in back}
    return {"before": _view(before, gone, context_before, len(removed) - len(gone)),
            "after": _view(after, new, context_after, len(added) - len(new))}


def _recorded(graph: Graph, rule: Rule, step: Step) -> Match[Value] | None:
    """The match `step` recorded, found again in `graph` (which must be the graph the search
    applied it to: node ids carry over); None when it is not there."""
    if step.match is None:
        return None
    first_root = step.match.roots[0][0]
    if first_root not in graph.nodes:
        return None
    return next((m for m in find_matches(graph, rule, first_roots=[first_root])
                 if StepMatch.of(m) == step.match), None)


def replay(graph: Graph, candidate: Candidate, rules: Sequence[Rule]
           ) -> list[tuple[str, Graph, Graph]] | None:
    """The candidate's rewrites as (rule, graph before, graph after) from `graph`, the graph
    the search started from, each applied at the match the search recorded; None when a
    step has no match to replay (an e-graph extraction, a split search's part) or its match
    is not where it was recorded (the trace is not this graph's). Steps that apply no rule
    (fission, onnxruntime's fusions) come last in a trace and are not replayed: the report
    shows them in sections of their own, and the replay ends where they began."""
    by_name = {r.name: r for r in rules}
    steps: list[tuple[str, Graph, Graph]] = []
    current = graph
    for step in candidate.trace:
        if step.kind != StepKind.RULE:
            return steps
        rule = by_name.get(step.rule)
        if rule is None:
            return None
        match = _recorded(current, rule, step)
        if match is None:
            return None
        result = apply_match(current, match)
        if isinstance(result, Rejection):
            return None
        steps.append((rule.name, current, result))
        current = result
    return steps if current.fingerprint() == candidate.graph.fingerprint() else None


def rewrite_evidence(graph: Graph, candidate: Candidate, rules: Sequence[Rule],
                     index: int) -> dict[str, Any]:
    """Candidate `index`'s rewrites for the report: each step drawn, grouped by rule with the
    rule's text and whether Z3 proves it; or, when they cannot be replayed one by one, the
    whole change at once."""
    used = {s.rule for s in candidate.trace}
    texts = {rule.name: {"text": print_rule(rule), "origin": rule.origin,
                         "proof": proof_status(rule)}
             for rule in rules if rule.name in used}
    others = [s.rule for s in candidate.trace if s.kind != StepKind.RULE]
    steps = replay(graph, candidate, rules)
    if steps is not None:
        drawn = [{"rule": rule, **change_view(before, after)} for rule, before, after in steps]
        return {"candidate": index, "stepwise": True, "steps": drawn, "rules": texts,
                "other_steps": list(dict.fromkeys(others))}
    return {"candidate": index, "stepwise": False, "rules": texts, "other_steps": [],
            "steps": [{"rule": ", ".join(dict.fromkeys(s.rule for s in candidate.trace)),
                       **change_view(graph, candidate.graph)}]}


def proof_status(rule: Rule, timeout_ms: int = PROOF_MS) -> str:
    """The rule's verdict as `graphsub verify` decides it (graphsub.proofs.prover.verify_rule):
    'proven' when Z3 derives it from the axioms, 'tested: ...' when it passes the exact
    identity test (with its chance of a false pass), else why neither. Kept per process and,
    across runs, in the cache folder (graphsub.proofs.stored)."""
    from graphsub.proofs.prover import verify_rule

    from graphsub.proofs import stored

    key = (print_rule(rule), timeout_ms)
    if key in _PROOFS:
        _PROOFS.move_to_end(key)
        return _PROOFS[key]
    kept_key = stored.key(*key)
    known = stored.stored(kept_key)
    if known is None:
        try:
            verdict = verify_rule(rule, timeout_ms=timeout_ms)
            known = {"proven": "proven", "tested": f"{TESTED}{verdict.reason}"}.get(
                verdict.status, f"{verdict.status}: {verdict.reason}" if verdict.status ==
                "refuted" else verdict.reason or "not proven")
            stored.store(kept_key, known)  # a timeout is kept too: the report is no proof run
        except Exception as exc:  # noqa: BLE001 (a rule the prover cannot read is unproven)
            known = f"the prover could not read it ({exc})"
    _PROOFS[key] = known
    if len(_PROOFS) > PROOFS_KEPT:
        _PROOFS.popitem(last=False)
    return _PROOFS[key]


#: How proof_status begins for a rule that passed the exact identity test.
TESTED = "tested: "
#: Proof outcomes by rule text, once per process (a notebook renders many reports), the
#: least recently used dropped past PROOFS_KEPT: five times the built-in rules and TASO's
#: together (199), so that a process showing generated rule sets one after another does not
#: keep every rule it ever showed.
PROOFS_KEPT = 1000
_PROOFS: OrderedDict[tuple[str, int], str] = OrderedDict()
