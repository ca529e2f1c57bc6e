"""Reports as one self-contained HTML page: what a person opens to see why graphsub chose
what it chose.

The pages are rendered from the reports' plain data (what --report writes as JSON), so a
saved report renders the same later (`graphsub report`). Everything is inline: the style, and
the figures as SVG (graphsub.report.plots); no script, font or image is fetched, and the file
opens from disk without a network.
"""

from __future__ import annotations

import html
import math
import warnings
from statistics import median as _median
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from graphsub.report import plots
from graphsub.report.evidence import TESTED
from graphsub.report.words import stopped
from graphsub.verdicts.speedup import describe

#: Rewrite drawings per rule at most, and in all: past these, the page says how many more.
DRAWINGS_PER_RULE, DRAWINGS_TOTAL = 4, 40

STYLE = """
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #222;
       margin: 0 auto; max-width: 1180px; padding: 24px 32px 64px; }
h1 { font-size: 24px; margin-bottom: 4px; } h2 { font-size: 19px; margin-top: 36px;
  border-bottom: 1px solid #ddd; padding-bottom: 4px; } h3 { font-size: 15px; margin: 22px 0 6px; }
.verdict { font-size: 17px; padding: 12px 16px; border-radius: 6px; margin: 16px 0; }
.verdict.good { background: #e6f4ea; border-left: 6px solid #2e7d32; }
.verdict.kept { background: #fff4e5; border-left: 6px solid #ed8c00; }
table { border-collapse: collapse; margin: 8px 0 12px; font-size: 13.5px; }
th, td { padding: 4px 10px; border-bottom: 1px solid #eee; text-align: left; vertical-align: top; }
th { background: #f6f6f6; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
table.facts th { background: none; color: #666; font-weight: normal; }
figure.plot { margin: 12px 0 20px; } figure.plot svg { max-width: 100%; height: auto; }
figcaption { color: #555; font-size: 13px; margin-top: 4px; max-width: 900px; }
pre.rule { background: #f6f8fa; padding: 8px 12px; border-radius: 4px; font-size: 12.5px;
  white-space: pre-wrap; overflow-wrap: anywhere; } code { font-size: 12.5px; }
.badge { display: inline-block; font-size: 12px; padding: 1px 8px; border-radius: 10px;
  margin-left: 8px; } .badge.proven { background: #e6f4ea; color: #1b5e20; }
.badge.unproven { background: #f1f1f1; color: #555; }
.ok { color: #2e7d32; } .bad { color: #c62828; } .muted { color: #777; }
ul.notes li { margin: 3px 0; }
"""


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _page(title: str, body: Sequence[str]) -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{esc(title)}</title><style>{STYLE}</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")


def _figure(plot_id: str, svg: str, caption: str) -> str:
    return (f'<figure class="plot" id="plot-{esc(plot_id)}">{svg}'
            f"<figcaption>{caption}</figcaption></figure>")


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]], numeric: Sequence[int] = (),
           css: str = "") -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f'<td class="num">{c}</td>' if i in numeric else f"<td>{c}</td>"
                         for i, c in enumerate(row)) + "</tr>" for row in rows)
    return f'<table class="{css}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _facts(rows: Sequence[tuple[str, Any]]) -> str:
    return ('<table class="facts"><tbody>'
            + "".join(f"<tr><th>{esc(k)}</th><td>{v}</td></tr>" for k, v in rows)
            + "</tbody></table>")


def _ms(value: float | None, digits: int = 3) -> str:
    return "" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def _cost_ms(value: float | None) -> str:
    """A predicted cost, ms (more digits than a latency: predictions of small graphs)."""
    return "" if value is None or not math.isfinite(value) else f"{value:.4f}"


# ---- optimize ------------------------------------------------------------------------------

def _header(r: Mapping[str, Any]) -> list[str]:
    good = r["outcome"] == "faster"
    device = r.get("device", {})
    versions = ", ".join(f"{k} {v}" for k, v in r.get("versions", {}).items())
    settings = r.get("settings", {})
    seconds = r.get("seconds", {})
    rows = [("model", esc(r["model"])),
            ("target", f"{esc(r['target'])} on {esc(device.get('name', ''))}"),
            ("search", esc(f"{settings.get('algorithm')}, {settings.get('cost')} cost, "
                           f"time limit {settings.get('time_limit')} s"
                           + (", fission" if settings.get("fission") else "")
                           + (", onnxruntime fusions" if settings.get("ort_fusions") else ""))),
            ("time spent", esc(", ".join(f"{k} {v:.1f} s" for k, v in seconds.items()
                                         if k not in ("time_limit", "measure_limit")
                                         and v is not None))),
            ("operators", f"{r['nodes_before']} before, {r['nodes_after']} after")]
    if versions:
        rows.append(("versions", esc(versions)))
    if r.get("command"):
        rows.append(("command", f"<code>{esc(' '.join(r['command']))}</code>"))
    return [f"<h1>graphsub optimize: {esc(r['model'])}</h1>",
            f'<p class="verdict {"good" if good else "kept"}" id="verdict">{esc(r["verdict"])}</p>',
            _facts(rows)]


def _latency(r: Mapping[str, Any]) -> list[str]:
    timings = r.get("timings") or {}
    screen = timings.get("screen") or {}
    if not screen:
        return ["<h2>Latency</h2>", '<p class="muted">Nothing was timed end to end: '
                + esc(r["verdict"]) + "</p>"]
    confirms = timings.get("confirms", [])
    return ["<h2>Latency</h2>",
            _figure("latency", plots.latency_distributions(screen, confirms),
                    esc(_latency_caption(screen, confirms)))]


def _latency_caption(screen: Mapping[str, Any], confirms: Sequence[Mapping[str, Any]]) -> str:
    """What the latency figure draws, panel by panel, and nothing it does not."""
    caption = ("Latency of the whole model on the target, as medians of rounds of runs (the "
               "box: middle half of the rounds; whiskers: the rest but outliers). "
               + ("The screening times the original and every candidate side by side. "
                  if len(screen) > 1 else "The screening timed the original alone. "))
    if not confirms:
        return caption + ("No candidate was timed head to head against the original."
                          if len(screen) > 1 else "")
    caption += ("Then " + ("the fastest candidate runs" if len(confirms) == 1 else
                           f"{len(confirms)} candidates run, one after the other,")
                + " head to head against the original, round by round (a grey line joins the "
                "two runs of one round); a panel's title gives the median round's speedup")
    if "required" not in confirms[0]:  # a report from before the intervals
        return caption + "."
    return caption + (" with its interval. A candidate is kept when the interval's lower end "
                      f"clears {confirms[0]['required']:.3f}x.")


def _featured_label(r: Mapping[str, Any]) -> str:
    op = r.get("op_times") or {}
    index = op.get("candidate_index")
    if index is None:
        return ""
    return (f"candidate {index} (kept)" if not r["kept_original"]
            else f"candidate {index} (not kept)")


def _where_time_goes(r: Mapping[str, Any]) -> list[str]:
    op = r.get("op_times") or {}
    out = ["<h2>Where the time goes</h2>"]
    if op.get("original"):
        label = _featured_label(r)
        out.append(_figure(
            "op-times", plots.op_time_bars(op["original"], op.get("candidate"), label,
                                           op.get("unit", "")),
            esc(f"Predicted time per operator type, from the {op.get('unit', '')} costs the "
                "search priced the graphs with: the original and "
                + (label or "no candidate") + ". Weight-only nodes are folded at export and "
                "cost nothing.")))
    screen = (r.get("timings") or {}).get("screen") or {}
    original_ms = _median(screen["original"]) if screen.get("original") \
        else r.get("latency_before_ms")
    points = [("original", r["predicted_ms_before"], original_ms)]
    for i, cand in enumerate(r.get("candidates", [])):
        rounds = screen.get(f"candidate {i}")  # like the original's: the rounds' median
        measured_ms = _median(rounds) if rounds else cand.get("measured_ms")
        if measured_ms is not None:
            points.append((f"candidate {i}", cand["predicted_ms"], measured_ms))
    measured = [(label, p, m) for label, p, m in points if m is not None and math.isfinite(p)]
    if len(measured) >= 2:
        out.append(_figure(
            "fidelity", plots.predicted_vs_measured(measured),
            esc("The cost model's fidelity: each model's predicted cost (a sum of one-operator "
                "costs) against its measured latency in the screening. Points below the dashed "
                "line run faster than their prediction, relative to the original.")))
    return out




def _search(r: Mapping[str, Any]) -> list[str]:
    s = r["search"]
    settings = r.get("settings", {})
    rows = [("stopped", esc(stopped(s["stopped_by"]).removeprefix("stopped "))),
            ("seconds", f"{s['seconds']:.2f}"),
            ("graphs expanded", s["explored"]), ("graphs generated", s["generated"]),
            ("duplicates", s.get("duplicates", 0)), ("pruned", s.get("pruned", 0)),
            ("matches tried", s.get("matches", 0))]
    eg = s.get("egraph")
    if eg:
        rows += [("e-graph", esc(f"{eg.get('nodes')} e-nodes, {eg.get('classes', '?')} e-classes, "
                                 f"{eg.get('applications')} rewrites applied"))]
    if s.get("split"):
        sp = s["split"]
        rows.append(("split", esc(f"{sp.get('parts')} parts of sizes {sp.get('part_sizes')}")))
    out = ["<h2>The search</h2>", _facts(rows)]
    if eg and eg.get("log"):
        out.append(_iterations(eg["log"]))
    progress = s.get("progress") or []
    if len(progress) >= 2:
        out.append(_figure(
            "search", plots.search_progress({settings.get("algorithm", "search"): progress}),
            esc("Best predicted cost found so far against search time (the dot: where the "
                "search stopped).")))
    return out


def _iterations(log: Sequence[Mapping[str, Any]]) -> str:
    """Equality saturation's iterations, as egg's runner reports them: what each applied
    (its three most applied rules), what the scheduler banned, where its time went."""
    rows = []
    for it in log:
        top = sorted(it["applied"].items(), key=lambda kv: -kv[1])[:3]
        rows.append([it["iteration"], esc(", ".join(f"{k} x{v}" for k, v in top) or "-"),
                     sum(it["applied"].values()), esc(", ".join(it["banned"]) or "-"),
                     f"{it['search_s']:.3f}", f"{it['apply_s']:.3f}", f"{it['rebuild_s']:.3f}",
                     it["nodes"]])
    return _table(["iteration", "most applied", "applied", "banned", "search s", "apply s",
                   "rebuild s", "e-nodes"], rows, numeric=(0, 2, 4, 5, 6, 7))


def _rewrites(r: Mapping[str, Any]) -> list[str]:
    ev = r.get("rewrites") or {}
    out = ["<h2>Rewrites</h2>"]
    if not ev or not ev.get("steps"):
        out.append('<p class="muted">No rewrite to show: the search found no graph predicted '
                   "cheaper than the original.</p>" if not ev else
                   '<p class="muted">This candidate applies no rule.</p>')
        return out
    index = ev["candidate"]
    kept = not r["kept_original"]
    out.append(f"<p>The rewrites of candidate {index} "
               + ("(the model written)" if kept else "(the best candidate found; the original "
                  "was kept)") + ", grouped by rule. Red: the nodes a rewrite replaced; green: "
               "what replaced them; grey: their unchanged neighbours. Node labels give the "
               "operator and its output shape.</p>")
    if not ev["stepwise"]:
        out.append('<p class="muted">The search does not record its rewrites in an order '
                   "that can be replayed (an e-graph extraction, or a split search's parts): "
                   "the drawing shows all of them at once.</p>")
    if ev.get("other_steps"):
        out.append(f"<p>Then: {esc(', '.join(ev['other_steps']))} (see below).</p>")
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for step in ev["steps"]:
        groups.setdefault(step["rule"], []).append(step)
    drawn = 0
    for n, (rule, steps) in enumerate(groups.items()):
        info = ev["rules"].get(rule, {})
        proof = info.get("proof", "")
        tested = proof.startswith(TESTED)
        badge = ('<span class="badge proven">Z3-proven</span>' if proof == "proven" else
                 f'<span class="badge proven" title="{esc(proof)}">tested exactly</span>'
                 if tested else
                 f'<span class="badge unproven" title="{esc(proof)}">not proven'
                 "</span>" if proof else "")
        times = f"applied {len(steps)} time{'s' if len(steps) > 1 else ''}"
        out.append(f'<h3 id="rule-{n}"><code>{esc(rule)}</code>{badge} '
                   f'<span class="muted">{times}</span></h3>')
        if tested:
            out.append(f'<p class="muted">Not proven by Z3 (the axioms do not cover it); '
                       f"{esc(proof[len(TESTED):])}.</p>")
        elif proof and proof != "proven":
            out.append(f'<p class="muted">Z3: {esc(proof)}. Every rule is also checked on '
                       "random inputs when it is loaded.</p>")
        if info.get("text"):
            out.append(f'<pre class="rule">{esc(info["text"])}</pre>')
        looks = _distinct_looks(steps)
        for i, (step, count) in enumerate(looks):
            if i >= DRAWINGS_PER_RULE or drawn >= DRAWINGS_TOTAL:
                rest = sum(c for _, c in looks[i:])
                out.append(f'<p class="muted">({rest} more application(s) of this rule not '
                           "drawn)</p>")
                break
            alike = (f", and {count - 1} more that look the same" if count > 1 else "")
            out.append(_figure(f"rewrite-{n}-{i}", plots.rewrite_drawing(step),
                               esc(f"{rule}{alike}")))
            drawn += 1
    return out


def _distinct_looks(steps: Sequence[Mapping[str, Any]]) -> list[tuple[Mapping[str, Any], int]]:
    """The steps that would be drawn differently, each with how many look the same (a rule
    applied once per layer draws the same subgraph every time; which graph input a step
    reads does not make it look different)."""
    def look(step: Mapping[str, Any]) -> tuple[Any, ...]:
        def side(view: Mapping[str, Any]) -> tuple[Any, ...]:
            index = {n["id"]: k for k, n in enumerate(view["nodes"])}
            labels = ["input" if n["label"].startswith("input ") else n["label"]
                      for n in view["nodes"]]
            return (tuple((label, n["shape"], n["changed"])
                          for label, n in zip(labels, view["nodes"])),
                    tuple((index[a], index[b]) for a, b in view["edges"]), view.get("hidden"))
        return side(step["before"]), side(step["after"])

    groups: dict[tuple[Any, ...], list[Any]] = {}
    for step in steps:
        groups.setdefault(look(step), [step, 0])[1] += 1
    return [(step, count) for step, count in groups.values()]


def _fission(r: Mapping[str, Any]) -> list[str]:
    f = r.get("fission") or {}
    if not f:
        return []
    split = ", ".join(f"{n} {op}" for op, n in f.get("split", {}).items())
    what = f"Split {esc(split)}" if split else "No operator needed splitting"
    out = ["<h2>Operator fission and kernel orchestration</h2>",
           f"<p>{what}: {f.get('primitives', 0)} primitives in all; the binary linear "
           f"program chose among {sum(f.get('candidates', {}).values())} candidate kernels "
           f"({esc(f.get('status', ''))}, {f.get('seconds', 0):.1f} s). The orchestrated graph "
           + ("was kept." if f.get("kept") else "was not the one kept.") + "</p>"]
    kernels = f.get("kernels", [])
    if kernels:
        rows = [(esc(k["kernel"]), esc(k["kind"]), k["count"],
                 esc(", ".join(f"{n} {op}" for op, n in k["replaced"].items())),
                 _cost_ms(k["total_ms"])) for k in kernels]
        out.append(_table(["kernel", "kind", "count", "replaces (primitives)",
                           "predicted ms"], rows, numeric=(2, 4)))
    else:
        out.append('<p class="muted">No fused kernel was chosen: every primitive runs as its '
                   "own operator or the target's library kernel.</p>")
    return out


def _candidates(r: Mapping[str, Any]) -> list[str]:
    cands = r.get("candidates", [])
    if not cands:
        return []
    chosen = None if r["kept_original"] else (r.get("op_times") or {}).get("candidate_index")
    screen = (r.get("timings") or {}).get("screen") or {}

    def screened(label: str, fallback: float | None) -> str:
        return _ms(_median(screen[label]) if screen.get(label) else fallback)

    rows = [("original", _cost_ms(r["predicted_ms_before"]), screened("original", None),
             "", "", "")]
    for i, c in enumerate(cands):
        rules = ", ".join(dict.fromkeys(c["rules"])) or \
            "(none: the original graph as graphsub writes it)"
        rows.append((f"candidate {i}" + (" <b>kept</b>" if i == chosen else ""),
                     _cost_ms(c["predicted_ms"]), screened(f"candidate {i}", c["measured_ms"]),
                     esc(describe(c["screening"])) if c.get("screening") else "",
                     esc(f"{len(c['rules'])}: {rules}"), esc(c.get("note", ""))))
    return ["<h2>Candidates</h2>",
            _table(["model", "predicted ms", "screening ms (median round)",
                    "speedup over the original (median round ratio)", "rewrites", "note"],
                   rows, numeric=(1, 2))]


def _verification(r: Mapping[str, Any]) -> list[str]:
    v = r.get("verification") or {}
    out = ["<h2>Verification</h2>"]
    if v.get("outputs"):
        tol = (f"|diff| ≤ atol + rtol·|expected|, rtol {v['rtol']:g}, atol {v['atol']:g} "
               f"(at least {v['atol_scale']:g} × the output's largest magnitude)")
        out.append(f"<p>The model written, against the original on {v['trials']} set(s) of "
                   f"random inputs: <b class=\"{'ok' if v['equivalent'] else 'bad'}\">"
                   f"{'equivalent' if v['equivalent'] else 'different'}</b>. Tolerance: "
                   f"{esc(tol)}. Tolerance used: the worst element's difference as a share of "
                   "what the tolerance allows there (over 100% fails).</p>")
        rows = [(esc(o["name"]), f"{o['max_abs']:.3g}", f"{o['max_rel']:.3g}",
                 _used(o)) for o in v["outputs"]]
        out.append(_table(["output", "worst |diff|", "worst relative", "tolerance used"], rows,
                          numeric=(1, 2, 3)))
    else:
        note = v.get("note", "nothing to verify")
        out.append(f"<p>{esc(note[:1].upper() + note[1:])}.</p>")
    checked = [(i, c) for i, c in enumerate(r.get("candidates", [])) if c.get("check")]
    if checked:
        worst_rows = []
        for i, c in checked:
            worst = max(c["check"], key=lambda o: o.get("used", 0.0))
            worst_rows.append((f"candidate {i}", esc(worst["name"]), f"{worst['max_abs']:.3g}",
                               f"{worst['max_rel']:.3g}", _used(worst), len(c["check"])))
        out.append("<p>Every timed candidate's outputs were first compared with the original's "
                   "on the timing inputs (a candidate that differs ends the run as an error):</p>")
        out.append(_table(["candidate", "worst output", "worst |diff|", "worst relative",
                           "tolerance used", "outputs"], worst_rows, numeric=(2, 3, 4, 5)))
    return out


def _used(output: Mapping[str, Any]) -> str:
    """The share of the tolerance the worst element used, coloured by whether it passed."""
    used = output.get("used")
    text = "" if used is None else f"{used:.1%}" if math.isfinite(used) else "∞"
    return f'<span class="{"ok" if output["ok"] else "bad"}">{text}</span>'


def _notes(r: Mapping[str, Any]) -> list[str]:
    if not r.get("notes"):
        return []
    return ["<h2>Notes</h2>", '<ul class="notes">'
            + "".join(f"<li>{esc(n)}</li>" for n in r["notes"]) + "</ul>"]


def _section(make: Callable[[Mapping[str, Any]], list[str]], data: Mapping[str, Any]
             ) -> list[str]:
    """A section of the page, or, when it cannot be made (a report from another version, a
    figure matplotlib refuses), a line saying so: one section never costs the whole page."""
    try:
        return make(data)
    except Exception as exc:  # noqa: BLE001 (matplotlib and networkx raise their own types)
        name = make.__name__.strip("_").replace("_", " ")
        warnings.warn(f"the report's {name} section could not be drawn: {exc!r}",
                      RuntimeWarning, stacklevel=2)
        return [f'<p class="bad">The {esc(name)} section could not be drawn '
                f"({esc(type(exc).__name__)}: {esc(exc)}).</p>"]


def optimize_html(report: Mapping[str, Any]) -> str:
    """The page for an optimize report (OptimizeReport.as_dict())."""
    sections = (_header, _latency, _where_time_goes, _search, _rewrites, _fission,
                _candidates, _verification, _notes)
    body = [part for make in sections for part in _section(make, report)]
    return _page(f"graphsub optimize: {report['model']}", body)


# ---- a torch.export program -----------------------------------------------------------------

def exported_html(data: Mapping[str, Any]) -> str:
    """The page for `graphsub optimize model.pt2` (frontends.exported's CompileReport, with
    the files): what was returned and why, the race under AOTInductor, each part's rewrites
    and predicted costs, what stayed in torch."""
    changed = data["chosen"] != "original" and not data["fallback"]
    verdict = ("graphsub's rewrites returned" if changed else
               f"the program returned unchanged: {data['fallback'] or 'not faster'}")
    if data.get("speedup") is not None:
        verdict += f"; under AOTInductor {data['speedup']:.3f}x the original's speed"
    parts = data["parts"]
    body = [f"<h1>graphsub optimize: {esc(data['program'])}</h1>",
            f'<p class="verdict {"good" if changed else "kept"}" id="verdict">{esc(verdict)}</p>',
            _facts([("target", esc(data["target"])), ("cost model", esc(data["cost"])),
                    ("written", f"{esc(data['output'])} ({esc(data['written'])})"),
                    ("seconds", f"{data['seconds']:.1f}"),
                    ("buffers written", esc(", ".join(data["writes"])) or "none"),
                    ("sizes", esc(data["sizes"].get("symbols", "static")) if data["sizes"]
                     else "static"),
                    # (a report written before masks were proven has none)
                    ("masks proven causal",
                     esc(", ".join(data.get("causal_masks", []))) or "none")]
                   + [("command", f"<code>{esc(' '.join(data['command']))}</code>")]),
            "<h2>Race under AOTInductor</h2>",
            _table(["contender", "speedup over the original"],
                   [(esc(k), f"{v:.3f}x") for k, v in data["race"].items()], numeric=(1,))
            if data["race"] else '<p class="muted">No race was run.</p>']
    if parts:
        body += ["<h2>Parts</h2>",
                 _figure("parts", plots.op_time_bars(
                     {f"part {i}": p["predicted_before"] * 1e3 for i, p in enumerate(parts)},
                     {f"part {i}": p["predicted_after"] * 1e3 for i, p in enumerate(parts)},
                     "optimized", data["cost"], per="part"),
                     esc("Each part's predicted time before and after graphsub's rewrites.")),
                 _table(["part", "operators", "rules applied", "predicted ms before",
                         "after", "kept as it was because"],
                        [(i, p["nodes"], esc(", ".join(f"{k} x{v}" for k, v in
                                                       sorted(p["rules_used"].items()))),
                          _cost_ms(p["predicted_before"] * 1e3),
                          _cost_ms(p["predicted_after"] * 1e3), esc(p["kept"]))
                         for i, p in enumerate(parts)], numeric=(0, 1, 3, 4))]
    if data["dropped"]:
        body += ["<h2>Left out</h2>",
                 _table(["what", "why"], [(esc(k), esc(v)) for k, v in data["dropped"].items()])]
    if data["left_in_torch"]:
        body += ["<h2>Left in torch</h2>",
                 _table(["operator", "count"], [(esc(k), v) for k, v in
                                               sorted(data["left_in_torch"].items())],
                        numeric=(1,))]
    return _page(f"graphsub optimize: {data['program']}", body)


# ---- compare -------------------------------------------------------------------------------

def compare_html(data: Mapping[str, Any]) -> str:
    """The page for `graphsub compare`: OCGGS's figures for one model, cost against search
    time per algorithm and the final costs side by side."""
    runs = data["runs"]
    initial = runs[0]["initial_ms"] if runs else float("nan")
    best = min((r["final_ms"] for r in runs), default=float("nan"))
    improved = best < initial
    body = [f"<h1>graphsub compare: {esc(data['model'])}</h1>",
            f'<p class="verdict {"good" if improved else "kept"}" id="verdict">'
            f"{esc(_compare_verdict(runs))}</p>",
            _facts([("target", esc(data["target"])),
                    ("cost model", esc(data["cost"])),
                    ("time limit", f"{data['time_limit']:g} s per algorithm"),
                    ("K (pruning, dpp, sampling)", data.get("k")),
                    ("initial cost", f"{_cost_ms(initial)} ms")]
                   + ([("versions", esc(", ".join(f"{k} {v}" for k, v in
                                                  data["versions"].items())))]
                      if data.get("versions") else [])
                   + ([("command", f"<code>{esc(' '.join(data['command']))}</code>")]
                      if data.get("command") else [])),
            "<h2>Cost against search time</h2>",
            _figure("search", plots.search_progress(
                {r["algorithm"]: r.get("progress") or [] for r in runs}),
                esc("Best predicted cost each algorithm had found against its search time "
                    "(OCGGS figure 9's view): lower and further left is better; the dot is "
                    "where it stopped.")),
            "<h2>Final cost</h2>",
            _figure("final-cost", plots.final_cost_bars(
                {r["algorithm"]: r["final_ms"] for r in runs}, initial),
                esc("How much cheaper each algorithm's best graph is predicted to be than the "
                    "original, with its predicted cost.")) if improved else
            '<p class="muted">No bars to draw: every algorithm ended where it started, at '
            f"{_cost_ms(initial)} ms.</p>",
            _table(["algorithm", "cost ms", "/best", "gain", "seconds", "expanded",
                    "generated", "stopped by"],
                   [(esc(r["algorithm"]), _cost_ms(r["final_ms"]),
                     f"{r['final_ms'] / best:.3f}" if best else "",
                     f"{r['improvement']:.3f}x", f"{r['seconds']:.2f}", r["explored"],
                     r["generated"], esc(r["stopped_by"])) for r in runs],
                   numeric=(1, 2, 3, 4, 5, 6))]
    return _page(f"graphsub compare: {data['model']}", body)


def _compare_verdict(runs: Sequence[Mapping[str, Any]]) -> str:
    if not runs:
        return "No algorithm ran."
    best = min(r["final_ms"] for r in runs)
    if best >= runs[0]["initial_ms"]:
        return (f"No algorithm found a graph predicted cheaper than the original in "
                f"{max(r['seconds'] for r in runs):.1f} s.")
    gain = runs[0]["initial_ms"] / best if best else float("inf")
    reached = {r["algorithm"]: _reached(r) for r in runs if r["final_ms"] == best}
    first = min(reached, key=lambda name: reached[name])
    return (f"{', '.join(reached)} found the cheapest graph ({gain:.3f}x cheaper than the "
            f"original, predicted); {first} got there first, after {reached[first]:.1f} s.")


def _reached(run: Mapping[str, Any]) -> float:
    """When a run first had its final cost (its whole time when it recorded no progress)."""
    final = run["final_ms"]
    seconds: float = next((s for s, c in run.get("progress") or []
                           if c is not None and c <= final), run["seconds"])
    return seconds
