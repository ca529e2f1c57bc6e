"""The report's figures: the layout of rewrite drawings, and every figure as inline SVG."""

from __future__ import annotations

import re

from graphsub.report import plots


def test_rewrite_drawings_order_rows_so_that_parallel_paths_do_not_cross():
    # two chains a->c, b->d listed crosswise: the lower row follows the upper one
    view = {"nodes": [{"id": i} for i in (1, 2, 3, 4)], "edges": [[1, 4], [2, 3]]}
    pos = plots._positions(plots._rows(view))
    assert (pos[1][0] < pos[2][0]) == (pos[4][0] < pos[3][0])
    assert pos[1][1] == pos[2][1] > pos[3][1] == pos[4][1]


def test_figures_are_inline_svg_with_ids_of_their_own():
    a = plots.final_cost_bars({"greedy": 2e-3, "dpp": 1.5e-3}, 2e-3)
    b = plots.search_progress({"greedy": [(0.0, 2e-3), (1.0, 1.5e-3)]})
    for svg in (a, b):
        assert svg.startswith("<svg") and svg.rstrip().endswith("</svg>")
        assert "<?xml" not in svg and "DOCTYPE" not in svg
    ids_a = set(re.findall(r'id="([^"]+)"', a))
    assert ids_a and ids_a.isdisjoint(re.findall(r'id="([^"]+)"', b))
