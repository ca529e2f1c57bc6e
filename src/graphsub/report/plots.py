"""The report's figures, drawn with matplotlib and returned as inline SVG text.

Figures are made with `matplotlib.figure.Figure` directly, never pyplot: no global state, no
GUI backend, safe in a notebook or a server. Text stays text in the SVG (smaller files that a
browser renders crisply), and every id in a figure (matplotlib numbers its groups from 1 in
each) gets a prefix of its own, since one HTML page holds many SVGs and an id must be unique
in it.
"""

from __future__ import annotations

import io
import itertools
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from graphsub.verdicts.speedup import describe

#: Operator types drawn by name in the time breakdown; the rest are summed as "other".
TOP_OPS = 12
#: Colours: the original, candidates, changed nodes before and after a rewrite, context.
ORIGINAL, CANDIDATE, REMOVED, ADDED, CONTEXT = "#7f7f7f", "#1f77b4", "#f4b6b6", "#b9e4b3", "#eeeeee"

#: Numbers the figures of a process: every id in a figure's SVG is prefixed with its own.
_figures = itertools.count()


def _figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def to_svg(fig: Any) -> str:
    """The figure as an <svg> element (no XML prolog, no DOCTYPE), ready to inline."""
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "graphsub"}):
        fig.savefig(buf, format="svg")
    text = buf.getvalue()
    prefix = f"f{next(_figures)}-"
    text = re.sub(r'(\bid="|href="#|url\(#)', lambda m: m.group(1) + prefix, text)
    return text[text.index("<svg"):]


def _boxes(ax: Any, data: Sequence[Sequence[float]], labels: Sequence[str],
           colours: Sequence[str]) -> None:
    box = ax.boxplot(data, tick_labels=labels, patch_artist=True, widths=0.55)
    for patch, colour in zip(box["boxes"], colours):
        patch.set_facecolor(colour)
        patch.set_alpha(0.45)


def latency_distributions(screen: Mapping[str, Sequence[float]],
                          confirms: Sequence[Mapping[str, Any]]) -> str:
    """Box plots of round medians: the screening (original and each timed candidate) and
    every head-to-head confirmation (original and candidate, round by round), titled with
    its speedup and interval."""
    panels = 1 + len(confirms)
    fig = _figure(3.2 + 1.0 * len(screen) + 4.0 * len(confirms), 3.6)
    axes = fig.subplots(1, panels, squeeze=False)[0]
    names = list(screen)
    ax = axes[0]
    _boxes(ax, [screen[n] for n in names], names,
           [ORIGINAL if name == "original" else CANDIDATE for name in names])
    ax.set_title("screening: all candidates", fontsize=10)
    ax.set_ylabel("latency per round (ms)")
    for ax, c in zip(axes[1:], confirms):
        _boxes(ax, [c["before_ms"], c["after_ms"]],
               ["original", f"candidate {c['candidate']}"], [ORIGINAL, CANDIDATE])
        alpha = min(0.3, 6 / max(len(c["after_ms"]), 1))
        for b, a in zip(c["before_ms"], c["after_ms"]):  # one line per round: the pairing
            ax.plot([1, 2], [b, a], color="#555555", alpha=alpha, linewidth=0.8)
        measured = (describe(c) if "low" in c  # a report from before the intervals: none
                    else f"{c['speedup']:.3f}x, {len(c['after_ms'])} rounds")
        ax.set_title(f"head to head: {measured}\nfaster in {c['wins']:.0%} of the rounds",
                     fontsize=8)
    for ax in axes:
        ax.grid(axis="y", alpha=0.3)
    return to_svg(fig)


def op_time_bars(before: Mapping[str, float], after: Mapping[str, float] | None,
                 after_label: str, unit: str, per: str = "operator type") -> str:
    """Predicted time per operator type (or `per` other grouping: a program's parts), the
    original beside a candidate: horizontal bars, the TOP_OPS largest by name and the rest as
    'other'."""
    ops = sorted(set(before) | set(after or {}),
                 key=lambda op: -max(before.get(op, 0.0), (after or {}).get(op, 0.0)))
    shown, rest = ops[:TOP_OPS], ops[TOP_OPS:]

    def values(times: Mapping[str, float]) -> list[float]:
        out = [times.get(op, 0.0) for op in shown]
        if rest:
            out.append(sum(times.get(op, 0.0) for op in rest))
        return out

    labels = shown + (["other"] if rest else [])
    fig = _figure(7.5, 0.9 + 0.38 * len(labels))
    ax = fig.subplots()
    y = range(len(labels))
    height = 0.4 if after is not None else 0.7
    ax.barh([i - (height / 2 if after is not None else 0) for i in y], values(before),
            height=height, color=ORIGINAL, label=f"original ({sum(before.values()):.3f} ms)")
    if after is not None:
        ax.barh([i + height / 2 for i in y], values(after), height=height, color=CANDIDATE,
                label=f"{after_label} ({sum(after.values()):.3f} ms)")
    ax.set_yticks(list(y), labels)
    ax.invert_yaxis()
    ax.set_xlabel(f"predicted time per {per} (ms, {unit})")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    return to_svg(fig)


def predicted_vs_measured(points: Sequence[tuple[str, float, float]]) -> str:
    """Each measured model as (label, predicted ms, measured ms): how well the cost model's
    sum of one-operator costs ranks whole-model latency. The dashed line is where the
    measured latency would be proportional to the prediction, through the original."""
    fig = _figure(5.0, 3.8)
    ax = fig.subplots()
    xs, ys = [p for _, p, _ in points], [m for _, _, m in points]
    span_x, span_y = (max(xs) - min(xs)) or 1.0, (max(ys) - min(ys)) or 1.0
    placed: list[tuple[float, float]] = []
    for label, predicted, measured in points:
        original = label == "original"
        ax.scatter([predicted], [measured], s=60 if original else 40, zorder=3,
                   color=ORIGINAL if original else CANDIDATE, marker="s" if original else "o")
        # points that (nearly) coincide get their labels stacked rather than overprinted
        near = sum(abs(predicted - x) < 0.04 * span_x and abs(measured - y) < 0.04 * span_y
                   for x, y in placed)
        placed.append((predicted, measured))
        ax.annotate(label, (predicted, measured), textcoords="offset points",
                    xytext=(6, 4 - 10 * near), fontsize=8)
    base = next(((p, m) for label, p, m in points if label == "original"), None)
    if base is not None and base[0] > 0:
        lo, hi = min(xs) * 0.98, max(xs) * 1.02
        ax.plot([lo, hi], [lo * base[1] / base[0], hi * base[1] / base[0]], "--",
                color="#999999", linewidth=1)
    ax.set_xlabel("predicted cost (ms)")
    ax.set_ylabel("measured latency (ms, median)")
    ax.grid(alpha=0.3)
    return to_svg(fig)


def search_progress(runs: Mapping[str, Sequence[Sequence[float]]], title: str = "") -> str:
    """Best predicted cost against search time, one step line per algorithm; each run is a
    list of (seconds, best cost in ms) points."""
    fig = _figure(7.0, 3.6)
    ax = fig.subplots()
    for name, points in runs.items():
        pts = [(s, c) for s, c in points if c is not None and math.isfinite(c)]
        if not pts:
            continue
        ax.step([s for s, _ in pts], [c for _, c in pts], where="post", label=name,
                linewidth=1.6)
        ax.plot([pts[-1][0]], [pts[-1][1]], "o", color=ax.lines[-1].get_color())
    ax.set_xlabel("search time (s)")
    ax.set_ylabel("best predicted cost (ms)")
    if title:
        ax.set_title(title, fontsize=10)
    if len(runs) > 1:
        ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return to_svg(fig)


def final_cost_bars(costs: Mapping[str, float], initial: float) -> str:
    """Each algorithm's predicted cost reduction from the original (bars from zero, so that
    small differences are not blown up), its final cost (ms) written on the bar."""
    fig = _figure(1.8 + 0.9 * len(costs), 3.4)
    ax = fig.subplots()
    names = list(costs)
    gains = [100 * (1 - costs[n] / initial) if initial else 0.0 for n in names]
    best = max(gains)
    bars = ax.bar(names, gains, color=[CANDIDATE if g == best else "#9ecae1" for g in gains])
    for bar, name in zip(bars, names):
        ax.annotate(f"{costs[name]:.3f} ms", (bar.get_x() + bar.get_width() / 2,
                                                    bar.get_height()),
                    textcoords="offset points", xytext=(0, 3), ha="center", fontsize=7)
    ax.set_ylabel("predicted cost reduction (%)")
    ax.set_ylim(bottom=min(0.0, min(gains)), top=max(1.0, best * 1.2))
    ax.axhline(0, color=ORIGINAL, linewidth=0.8)
    ax.tick_params(axis="x", labelrotation=30)
    ax.grid(axis="y", alpha=0.3)
    return to_svg(fig)


def _rows(view: Mapping[str, Any]) -> list[list[int]]:
    """The nodes by dataflow depth, top to bottom (networkx's topological generations), each
    row ordered by the mean place of what its nodes read (the barycentre heuristic, one sweep
    down and one up), so that few edges cross."""
    import networkx as nx

    g = nx.DiGraph()
    g.add_nodes_from(n["id"] for n in view["nodes"])
    g.add_edges_from(tuple(e) for e in view["edges"])
    rows = [sorted(generation) for generation in nx.topological_generations(g)]
    place = {nid: float(i) for row in rows for i, nid in enumerate(row)}

    def reorder(row: list[int], neighbours: Any) -> list[int]:
        def centre(nid: int) -> float:
            near = [place[m] for m in neighbours(nid)]
            return sum(near) / len(near) if near else place[nid]
        ordered = sorted(row, key=centre)
        place.update({nid: float(i) for i, nid in enumerate(ordered)})
        return ordered

    for depth in range(1, len(rows)):
        rows[depth] = reorder(rows[depth], g.predecessors)
    for depth in reversed(range(len(rows) - 1)):
        rows[depth] = reorder(rows[depth], g.successors)
    return rows


def _positions(rows: list[list[int]]) -> dict[int, tuple[float, float]]:
    """Each row centred, the widest spanning [-0.5, 0.5], one unit between rows."""
    width = max((len(row) for row in rows), default=1)
    return {nid: ((i - (len(row) - 1) / 2) / max(width - 1, 1), -float(depth))
            for depth, row in enumerate(rows) for i, nid in enumerate(row)}


def _draw_view(ax: Any, view: Mapping[str, Any], rows: list[list[int]], changed_colour: str,
               title: str) -> None:
    ax.set_title(title, fontsize=9)
    ax.set_axis_off()
    if not view["nodes"]:
        ax.text(0.5, 0.5, "(nothing)", ha="center", va="center", fontsize=8, color="#777777",
                transform=ax.transAxes)
        return
    pos = _positions(rows)
    for src, dst in view["edges"]:
        ax.annotate("", xy=pos[dst], xytext=pos[src],
                    arrowprops=dict(arrowstyle="-|>", color="#666666", linewidth=0.8,
                                    shrinkA=11, shrinkB=11))
    for n in view["nodes"]:
        x, y = pos[n["id"]]
        colour = changed_colour if n["changed"] else CONTEXT
        ax.text(x, y, f"{n['label']}\n{n['shape']}", ha="center", va="center", fontsize=7,
                bbox=dict(boxstyle="round,pad=0.3", facecolor=colour,
                          edgecolor="#333333" if n["changed"] else "#bbbbbb", linewidth=0.8))
    xs = [p[0] for p in pos.values()]
    ys = [p[1] for p in pos.values()]
    ax.set_xlim(min(xs) - 0.35, max(xs) + 0.35)
    ax.set_ylim(min(ys) - 0.25, max(ys) + 0.25)
    if view.get("hidden"):
        ax.text(0.5, 0.0, f"(+{view['hidden']} more changed nodes not drawn)", ha="center",
                va="top", fontsize=7, color="#777777", transform=ax.transAxes)


def rewrite_drawing(step: Mapping[str, Any]) -> str:
    """One rewrite: the subgraph it replaced (changed nodes red) and what replaced it (green),
    with their unchanged neighbours in grey."""
    rows = {side: _rows(step[side]) for side in ("before", "after")}
    depth = max([1, *(len(r) for r in rows.values())])
    width = max([2, *(len(row) for r in rows.values() for row in r)])
    fig = _figure(min(2.0 + 2.6 * width, 12.0), min(1.0 + 0.75 * depth, 9.0))
    before_ax, after_ax = fig.subplots(1, 2)
    _draw_view(before_ax, step["before"], rows["before"], REMOVED, "before")
    _draw_view(after_ax, step["after"], rows["after"], ADDED, "after")
    return to_svg(fig)
