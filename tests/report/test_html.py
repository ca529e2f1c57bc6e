"""The HTML reports: their data checked against the run that made them, every plot present,
nothing fetched from outside the file, and the commands that write them."""

from __future__ import annotations

import json
import re
import statistics
from html.parser import HTMLParser

import pytest
from typer.testing import CliRunner

from graphsub.cli import app
from graphsub.report.files import load_report, render_html
from graphsub.report.html import _distinct_looks
from graphsub.report.optimize import OptimizeReport

runner = CliRunner()


class PageParser(HTMLParser):
    """What the report tests look for in a page: the figures by id, the SVGs, and every
    attribute or tag that could fetch something."""

    def __init__(self) -> None:
        super().__init__()
        self.figures: list[str] = []
        self.svgs = 0
        self.fetching: list[str] = []
        self.tags: list[str] = []
        self._in_style = False
        self.styles: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        attrs = dict(attrs)
        if tag == "figure":
            self.figures.append(attrs.get("id", ""))
        if tag == "svg":
            self.svgs += 1
        if tag in ("script", "link", "img", "iframe", "object", "embed"):
            self.fetching.append(tag)
        for name in ("src", "href", "xlink:href"):
            value = attrs.get(name) or ""
            if value and not value.startswith("#"):  # in-page references are fine
                self.fetching.append(f"{tag} {name}={value}")
        self._in_style = tag == "style"

    def handle_endtag(self, tag):
        self._in_style = False

    def handle_data(self, data):
        if self._in_style:
            self.styles.append(data)


def parse(page: str) -> PageParser:
    parser = PageParser()
    parser.feed(page)
    parser.close()
    return parser


def check_self_contained(page: str) -> PageParser:
    parsed = parse(page)
    assert page.startswith("<!DOCTYPE html>")
    assert parsed.fetching == []
    assert not any("url(" in s or "@import" in s for s in parsed.styles)
    assert "Traceback" not in page
    assert parsed.svgs == len(parsed.figures) > 0
    return parsed


def test_report_data_matches_the_run(optimize_run):
    graph, report = optimize_run
    assert report.candidates, "the search must find candidates for this test to mean anything"
    assert report.outcome == "faster" and report.verification["outputs"], report.verdict
    screen = report.timings["screen"]
    assert set(screen) == {"original"} | {f"candidate {i}" for i, c in
                                          enumerate(report.candidates)
                                          if c.measured_ms is not None}
    confirms = report.timings["confirms"]
    assert confirms
    # the verdict's confirmation is one of the head-to-head attempts, recomputed from its rounds
    c = report.confirmation
    attempt = next(a for a in confirms if len(a["after_ms"]) == c["rounds"]
                   and a["speedup"] == pytest.approx(c["speedup"]))
    ratios = [b / a for b, a in zip(attempt["before_ms"], attempt["after_ms"])]
    assert statistics.median(ratios) == pytest.approx(c["speedup"], rel=1e-9)
    assert sum(r > 1 for r in ratios) / len(ratios) == pytest.approx(c["wins"])
    # the time per operator type adds up to the predicted costs of the graphs it describes
    op = report.op_times
    assert sum(op["original"].values()) == pytest.approx(report.predicted_ms_before, rel=1e-9)
    featured = report.candidates[op["candidate_index"]]
    assert sum(op["candidate"].values()) == pytest.approx(featured.predicted_ms, rel=1e-9)
    # the rewrites drawn are the featured candidate's, in order
    ev = report.rewrites
    assert ev["candidate"] == op["candidate_index"] and ev["stepwise"]
    assert [s["rule"] for s in ev["steps"]] == featured.rules
    assert set(ev["rules"]) == set(featured.rules)
    # the search's progress starts at the input's cost and never rises
    costs = [cost for _, cost in report.search["progress"]]
    assert costs[0] == pytest.approx(report.predicted_ms_before)
    assert costs == sorted(costs, reverse=True)
    # each timed candidate's first outputs were compared with the original's
    assert all(o["ok"] for c in report.candidates if c.measured_ms is not None for o in c.check)


def test_optimize_page_has_every_plot_and_fetches_nothing(optimize_run):
    _, report = optimize_run
    page = report.to_html()
    parsed = check_self_contained(page)
    figures = set(parsed.figures)
    assert {"plot-latency", "plot-op-times", "plot-fidelity", "plot-search"} <= figures
    drawn = [f for f in parsed.figures if f.startswith("plot-rewrite-")]
    rules = {s["rule"] for s in report.rewrites["steps"]}
    assert len(drawn) == sum(len(_distinct_looks([s for s in report.rewrites["steps"]
                                                  if s["rule"] == r])) for r in rules) > 0
    assert report.verdict.split(";")[0].replace("%", "") in page.replace("%", "")
    for rule in report.rewrites["rules"]:
        assert f"<code>{rule}</code>" in page
    # every id is unique in the page (one page holds many figures), and every reference
    # inside it points to one of them
    ids = re.findall(r'\bid="([^"]+)"', page)
    assert len(ids) == len(set(ids))
    refs = re.findall(r'(?:href="#|url\(#)([^")]+)', page)
    assert refs and set(refs) <= set(ids)


def test_a_saved_report_renders_as_the_run_does(optimize_run, tmp_path):
    _, report = optimize_run
    saved = tmp_path / "report.json"
    saved.write_text(json.dumps(report.as_dict(), default=str))
    back = OptimizeReport.from_dict(json.loads(saved.read_text()))
    assert back.as_dict() == json.loads(json.dumps(report.as_dict(), default=str))
    r = runner.invoke(app, ["report", str(saved), "-o", str(tmp_path / "page.html")],
                      catch_exceptions=False)
    assert r.exit_code == 0, r.output
    again = parse((tmp_path / "page.html").read_text())
    assert again.figures == parse(report.to_html()).figures


def test_optimize_writes_html_or_json_by_suffix(tmp_path):
    for name in ("r.html", "r.json"):
        r = runner.invoke(app, ["optimize", "resnet_blocks:n=1", "-o", str(tmp_path / "o.onnx"),
                                "--time-limit", "6", "--cost", "analytic", "--threads", "1",
                                "--report", str(tmp_path / name)], catch_exceptions=False)
        assert r.exit_code == 0, r.output
    page = (tmp_path / "r.html").read_text()
    data = json.loads((tmp_path / "r.json").read_text())
    check_self_contained(page)
    assert data["command"][:2] == ["graphsub", "optimize"] and "onnxruntime" in data["versions"]
    assert "plot-latency" in page


def test_compare_page_has_ocggs_figures(tmp_path):
    # SRU under the analytic cost: every algorithm finds its cheaper graph within a second
    out = tmp_path / "compare.html"
    r = runner.invoke(app, ["compare", "sru", "--algorithms", "greedy,pruning",
                            "--time-limit", "2", "--report", str(out)], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    parsed = check_self_contained(out.read_text())
    assert parsed.figures == ["plot-search", "plot-final-cost"]
    data_out = tmp_path / "compare.json"
    r = runner.invoke(app, ["compare", "sru", "--algorithms", "greedy",
                            "--time-limit", "2", "--report", str(data_out)])
    data = json.loads(data_out.read_text())
    run = data["runs"][0]
    assert run["progress"][0][1] == pytest.approx(run["initial_ms"])
    assert run["progress"][-1][1] == pytest.approx(run["final_ms"])
    assert parse(render_html(data)).figures == ["plot-search", "plot-final-cost"]


@pytest.mark.parametrize("args, message", [
    (["optimize", "resnet_blocks:n=1", "-o", "{tmp}/o.onnx", "--report", "{tmp}/r.txt"],
     "give a .json file"),
    (["compare", "resnet_blocks:n=1", "--report", "{tmp}/r.pdf"], "give a .json file"),
    (["report", "{tmp}/missing.json", "-o", "{tmp}/p.html"], "does not exist"),
    (["report", "{tmp}/bad.json", "-o", "{tmp}/p.html"], "is not JSON"),
    (["report", "{tmp}/other.json", "-o", "{tmp}/p.html"], "not a graphsub report"),
    (["report", "{tmp}/other.json", "-o", "{tmp}/p.json"], "give a .html file"),
])
def test_bad_report_arguments_are_one_clear_line(tmp_path, args, message):
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "other.json").write_text('{"a": 1}')
    r = runner.invoke(app, [a.format(tmp=tmp_path) for a in args])
    assert r.exit_code == 2, r.output
    assert message in r.output and "Traceback" not in r.output
    assert not (tmp_path / "p.html").exists() and not (tmp_path / "o.onnx").exists()


def test_rewrites_that_look_the_same_are_drawn_once_and_counted():
    def step(shape):
        view = {"nodes": [{"id": 1, "label": "relu", "shape": shape, "changed": True},
                          {"id": 2, "label": "tanh", "shape": shape, "changed": False}],
                "edges": [[1, 2]], "hidden": 0}
        return {"rule": "r", "before": view, "after": {**view, "nodes": view["nodes"][1:],
                                                       "edges": []}}

    looks = _distinct_looks([step("4×4"), step("4×4"), step("8×8"), step("4×4")])
    assert [(s["before"]["nodes"][0]["shape"], n) for s, n in looks] == [("4×4", 3), ("8×8", 1)]
    x, y = step("4×4"), step("4×4")
    x["before"]["nodes"][0]["label"], y["before"]["nodes"][0]["label"] = "input a", "input b"
    assert [n for _, n in _distinct_looks([x, y])] == [2]  # which input: not a new look


def test_a_report_saved_before_the_figures_existed_still_renders(optimize_run):
    _, report = optimize_run
    data = json.loads(json.dumps(report.as_dict(), default=str))
    for key in ("timings", "op_times", "rewrites", "command", "versions"):
        data.pop(key)
    data["search"].pop("progress")
    for c in data["candidates"]:
        c.pop("check")
    parsed = check_self_contained(render_html(data))
    assert parsed.figures == ["plot-fidelity"] and "Nothing was timed" in render_html(data)


def test_an_egraph_search_reports_its_rewrites_and_egraph():
    from tests.report.conftest import transposes_model
    from graphsub.optimizer import optimize_model

    _, report = optimize_model(transposes_model(), None, "transposes", algorithm="eqsat",
                               time_limit=6, cost="analytic", target="ort-cpu", threads=1)
    page = report.to_html()
    check_self_contained(page)
    assert "e-nodes" in page and report.search["egraph"]["nodes"] > 0
    log = report.search["egraph"]["log"]  # egg's per-iteration records, one row each
    assert len(log) == report.search["egraph"]["iterations"]
    assert "<th>rebuild s</th>" in page and page.count("<tr>") >= len(log)
    ev = report.rewrites
    assert ev["steps"] and all(s["before"]["nodes"] for s in ev["steps"])
    assert {r for s in ev["steps"] for r in s["rule"].split(", ")} <= set(ev["rules"])


def test_a_section_that_cannot_be_drawn_costs_only_itself(optimize_run):
    _, report = optimize_run
    data = json.loads(json.dumps(report.as_dict(), default=str))
    data["timings"]["confirms"][0]["before_ms"] = "not a list of numbers"
    with pytest.warns(RuntimeWarning, match="latency section could not be drawn"):
        page = render_html(data)
    parsed = check_self_contained(page)
    assert "The latency section could not be drawn" in page
    assert "plot-latency" not in parsed.figures and "plot-op-times" in parsed.figures


def _numbers_named(data, suffix=""):
    """Every (key path, value) of a report's data whose key ends with `suffix`."""
    out = []

    def walk(value, path):
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{path}.{k}")
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(v, f"{path}[{i}]")
        elif isinstance(value, (int, float)) and path.endswith(suffix):
            out.append((path, value))

    walk(data, "")
    return out


def test_the_json_report_gives_predicted_costs_and_latencies_in_one_unit(optimize_run):
    _, report = optimize_run
    data = json.loads(json.dumps(report.as_dict(), default=str))
    assert not [path for path, _ in _numbers_named(data) if path.endswith("_cost")]
    # predicted and measured figures are both in ms: the same order of magnitude
    assert 0.001 < data["predicted_ms_before"] < 1000 and 0.001 < data["latency_before_ms"]
    assert sum(data["op_times"]["original"].values()) == pytest.approx(
        data["predicted_ms_before"])
    assert data["search"]["progress"][0][1] == pytest.approx(data["predicted_ms_before"])


def test_a_report_saved_with_costs_in_seconds_reads_back_in_ms(optimize_run, tmp_path):
    _, report = optimize_run
    data = json.loads(json.dumps(report.as_dict(), default=str))
    old = dict(data, predicted_cost_before=data["predicted_ms_before"] / 1e3,
               predicted_cost_after=data["predicted_ms_after"] / 1e3)
    del old["predicted_ms_before"], old["predicted_ms_after"]
    old["candidates"] = [{**{k: v for k, v in c.items() if k != "predicted_ms"},
                          "predicted_cost": c["predicted_ms"] / 1e3} for c in data["candidates"]]
    old["search"] = {**data["search"],
                     "progress": [(s, c / 1e3) for s, c in data["search"]["progress"]]}
    old["op_times"] = {**data["op_times"], "original": {
        k: v / 1e3 for k, v in data["op_times"]["original"].items()},
        "candidate": {k: v / 1e3 for k, v in (data["op_times"]["candidate"] or {}).items()}}
    (tmp_path / "old.json").write_text(json.dumps(old))
    back = OptimizeReport.from_dict(load_report(tmp_path / "old.json"))
    assert back.predicted_ms_before == pytest.approx(data["predicted_ms_before"])
    assert [c.predicted_ms for c in back.candidates] == pytest.approx(
        [c["predicted_ms"] for c in data["candidates"]])
    assert sum(back.op_times["original"].values()) == pytest.approx(data["predicted_ms_before"])


def test_a_compare_where_nothing_improved_says_so_without_an_empty_chart():
    run = {"algorithm": "greedy", "split": None, "initial_ms": 2.0, "final_ms": 2.0,
           "seconds": 1.0, "explored": 3, "generated": 0, "matches_computed": 0,
           "matches_reused": 0, "stopped_by": "exhausted", "rules_used": {},
           "progress": [(0.0, 2.0)], "improvement": 1.0}
    data = {"model": "m", "target": "ort-cpu", "cost": "analytic", "time_limit": 1, "k": 10,
            "split": None, "runs": [run, {**run, "algorithm": "dpp"}]}
    page = render_html(data)
    parsed = check_self_contained(page)
    assert "plot-final-cost" not in parsed.figures and "No bars to draw" in page
    assert 'class="verdict kept"' in page and "No algorithm found" in page
    improved = {**data, "runs": [run, {**run, "algorithm": "dpp", "final_ms": 1.5,
                                       "progress": [(0.0, 2.0), (0.5, 1.5)]}]}
    page = render_html(improved)
    assert 'class="verdict good"' in page and "plot-final-cost" in parse(page).figures


def test_the_seconds_a_report_gives_add_up_and_agree(optimize_run):
    """The page's time spent per stage adds up to the total, and the search stage's seconds
    are the search section's (they once said 39.2 s and 33.3 s, and the CLI "load+search")."""
    _, report = optimize_run
    t = report.seconds
    stages = {k: v for k, v in t.items() if k not in ("total", "time_limit", "measure_limit")}
    assert {"load", "search", "measure", "verify", "report"} <= set(stages)
    assert sum(stages.values()) == pytest.approx(t["total"], abs=0.01)
    assert t["search"] == pytest.approx(report.search["seconds"], abs=0.25)
