"""`graphsub explain RULE MODEL`: why a rule does or does not match a model, node by node
(graphsub.rules.explain), registered on the app of graphsub.cli.app (the package graphsub.cli imports
this module)."""

from __future__ import annotations

import difflib
from collections import Counter
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from graphsub.cli.app import (JsonOpt, app, emit_json, handle_errors, out,
                                 parse_input_shapes)
from graphsub.errors import GraphsubError


@app.command()
@handle_errors
def explain(rule: Annotated[str, typer.Argument(help="The rule's name (see the .rules files).")],
            model: Annotated[str, typer.Argument(help="ONNX file or zoo model.")],
            input_shape: Annotated[Optional[list[str]], typer.Option(
                "--input-shape", help="Fix an input's shape, NAME=1x3x224x224 (repeatable).")
            ] = None,
            rules: Annotated[Optional[list[Path]], typer.Option(
                "--rules", help="Rule files to look the rule up in, beside the built-in "
                "library (a rule named as a library rule in its place).")] = None,
            show: Annotated[int, typer.Option(
                "--show", min=1, help="The most nodes listed (all are counted).")] = 40,
            as_json: JsonOpt = False) -> None:
    """Why RULE does or does not match MODEL: for every node of the operator its first
    pattern starts with, whether it matches and is rewritten, or the pattern node, graph
    node and condition where it fails."""
    from graphsub.loaded import open_model
    from graphsub.pipeline.rule_sets import load_rule_files
    from graphsub.rules.explain import explain as explain_rule
    from graphsub.rules.parser import print_term

    by_name = {r.name: r for r in load_rule_files(rules or []).rules}
    if rule not in by_name:
        close = difflib.get_close_matches(rule, list(by_name), n=3)
        where = "the built-in library or the rule files given" if rules else \
            "the built-in library"
        raise GraphsubError(f"no rule named {rule!r} in {where}"
                            + (f"; did you mean {', '.join(close)}?" if close else
                               "; give a rule's name as its .rules file writes it "
                               "(rule NAME:)"))
    chosen = by_name[rule]
    loaded = open_model(model, parse_input_shapes(input_shape))
    graph = loaded.graph
    found = explain_rule(graph, chosen)
    first = print_term(chosen.sources[0])
    if as_json:
        emit_json({"rule": chosen.name, "origin": chosen.origin, "model": loaded.label,
                   "first_pattern": first, "nodes": [e.as_dict() for e in found]})
        return
    out.print(f"rule [bold]{escape(chosen.name)}[/] ({escape(Path(chosen.origin).name)}): "
              f"its first pattern {escape(first)}", highlight=False)
    op = getattr(chosen.sources[0], "op", "?")
    if not found:
        out.print(f"{escape(loaded.label)} has no {escape(op)} node: the rule cannot match "
                  "anywhere", highlight=False)
        return
    matched = sum(e.matched for e in found)
    rewritten = sum(e.rewritten for e in found)
    out.print(f"{len(found)} {escape(op)} node(s) in {escape(loaded.label)}: {matched} "
              f"match, {rewritten} rewritten, {len(found) - matched} do not match",
              highlight=False)
    table = Table("node", "output", "result", "where it fails", box=None, show_edge=False)
    for e in found[:show]:
        node = graph[e.node]
        shape = "x".join(str(d) for d in node.outputs[0].shape) if node.outputs else ""
        where = "" if e.pattern is None else \
            f"{e.pattern}" + (f" at node {e.at} ({graph[e.at].op})" if e.at is not None
                              and e.at in graph else "")
        style = "green" if e.rewritten else "yellow" if e.matched else ""
        table.add_row(str(e.node), escape(shape),
                      f"[{style}]{escape(e.reason)}[/]" if style else escape(e.reason),
                      escape(where))
    out.print(table)
    if len(found) > show:
        reasons = Counter(e.reason for e in found[show:]).most_common(3)
        common = "; ".join(f"{n} x {escape(r)}" for r, n in reasons)
        out.print(f"... and {len(found) - show} more ({common}); --show N lists more",
                  highlight=False)


__all__ = ["explain"]
