"""The report says what its data says: every ratio with its interval, a "fastest" figure the
candidates table gives, a caption for what is drawn and nothing else, and stop reasons in
words; on the page and on the command line alike."""

from __future__ import annotations

import copy
import dataclasses
import html
import json
import re

from rich.console import Console

from graphsub.cli import commands as cli
from graphsub.report.files import render_html
from graphsub.report.html import _latency_caption
from graphsub.report.optimize import OptimizeReport, verdict
from graphsub.report.words import stopped
from graphsub.verdicts.speedup import describe
from graphsub.selection import Selection


def as_data(report: OptimizeReport) -> dict:
    return json.loads(json.dumps(report.as_dict(), default=str))


def text_of(page: str) -> str:
    """The page's text, tags dropped and entities read, whitespace folded."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page)).split())


def test_every_ratio_on_the_page_comes_with_its_interval(optimize_run):
    _, report = optimize_run
    c = report.confirmation
    assert c["decision"] == "faster" and c["low"] > 1, report.verdict
    assert describe(c) in report.verdict
    page = report.to_html()
    text = text_of(page)
    for attempt in report.timings["confirms"]:  # each head-to-head panel's title
        assert f"head to head: {describe(attempt)}" in page
    for cand in report.candidates:  # each screened candidate's row
        if cand.screening:
            assert describe(cand.screening) in text


def test_a_fastest_figure_is_the_one_the_candidates_table_gives(optimize_run):
    """A run whose candidates all failed the screening: the verdict's "fastest" is the
    fastest candidate's screening speedup with its interval, as its row in the table has it
    (the table's medians alone give another figure: a ratio of medians is not the median of
    the rounds' ratios, so the table shows the statistic itself)."""
    _, run_report = optimize_run
    report = dataclasses.replace(copy.deepcopy(run_report), outcome="not-faster", confirmation={},
                                 kept_original=True,
                                 timings={"screen": run_report.timings["screen"]})
    report = dataclasses.replace(report, verdict=verdict(report, Selection("not-faster")))
    screened = [(c.screening["speedup"], i, c.screening) for i, c in
                enumerate(report.candidates) if c.screening]
    _, fastest, figures = max(screened)
    assert f"(the fastest: {describe(figures)})" in report.verdict
    row = re.search(rf"<tr><td>candidate {fastest}</td>.*?</tr>", report.to_html())
    assert row and describe(figures) in html.unescape(row.group(0))


def test_the_latency_caption_describes_only_what_is_drawn(optimize_run):
    _, report = optimize_run
    data = as_data(report)
    screen, confirms = data["timings"]["screen"], data["timings"]["confirms"]
    with_confirms = _latency_caption(screen, confirms)
    assert "head to head" in with_confirms and "grey line" in with_confirms
    assert f"clears {confirms[0]['required']:.3f}x" in with_confirms
    screening_only = _latency_caption(screen, [])
    assert "grey line" not in screening_only and "panel" not in screening_only
    assert "No candidate was timed head to head" in screening_only
    data["timings"].pop("confirms")
    page = text_of(render_html(data))
    assert "grey line" not in page and "No candidate was timed head to head" in page


def test_a_report_saved_before_the_intervals_still_renders(optimize_run):
    """Head-to-head attempts of an older version carry no interval: their panels say so
    without one, and the caption does not promise one."""
    _, report = optimize_run
    data = as_data(report)
    for attempt in data["timings"]["confirms"]:
        for key in ("low", "high", "confidence", "required", "decision", "looks"):
            attempt.pop(key)
    page = render_html(data)
    assert "could not be drawn" not in page
    assert "lower end clears" not in text_of(page)


def test_the_command_line_prints_the_ratio_with_its_interval_and_the_stop_in_words(
        optimize_run, monkeypatch, tmp_path):
    _, report = optimize_run
    console = Console(width=400, record=True)
    monkeypatch.setattr(cli, "out", console)
    cli._print_optimize_report(report, tmp_path / "o.onnx", None)
    printed = " ".join(console.export_text().split())
    assert describe(report.confirmation) in printed
    assert stopped(report.search["stopped_by"]) in printed and "stopped by" not in printed
    assert report.verdict in printed
