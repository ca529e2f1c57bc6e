"""The reports in a real browser: headless Chromium loads each page from disk, and the test
checks that it renders without console errors and that every plot has a real size. The
screenshots are kept (GRAPHSUB_SCREENSHOTS names a folder to copy them to) so that a person
can look at them.

Chromium and its driver come from Debian's packages (chromium, chromium-driver), which
.ci/run installs where they are missing, and sets GRAPHSUB_REQUIRE_BROWSER=1: there, a missing
browser fails the test instead of skipping it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from graphsub.cli import app

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
REQUIRED = os.environ.get("GRAPHSUB_REQUIRE_BROWSER") == "1"
#: Chromium's flags for a closed network and no display (its background services would
#: otherwise try to reach Google's hosts at every start).
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--hide-scrollbars")


def _missing() -> str | None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install 'graphsub[test]')"
    if not (CHROMIUM and DRIVER):
        return "Chromium and chromedriver are not installed (apt-get install chromium " \
               "chromium-driver)"
    return None


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    missing = _missing()
    if missing:
        if REQUIRED:
            pytest.fail(f"GRAPHSUB_REQUIRE_BROWSER=1 but {missing}")
        pytest.skip(missing)
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    options.add_argument("--window-size=1280,900")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    yield driver
    driver.quit()


FIGURE_SIZES = """
return Array.from(document.querySelectorAll('figure.plot')).map(f => {
  const svg = f.querySelector('svg');
  const r = svg ? svg.getBoundingClientRect() : {width: 0, height: 0};
  return [f.id, r.width, r.height, svg ? svg.querySelectorAll('path, text, use').length : 0];
});
"""


def render(driver, page: Path, shot: Path) -> list:
    """Load `page` from disk, check the console, screenshot the whole page to `shot`;
    returns the figures' (id, width, height, drawn elements)."""
    driver.set_window_size(1280, 900)
    driver.get(page.as_uri())
    assert driver.execute_script("return document.readyState") == "complete"
    errors = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]
    assert errors == [], errors
    assert driver.title.startswith("graphsub ")
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1280, min(height + 40, 16000))
    assert driver.save_screenshot(str(shot)) and shot.stat().st_size > 20_000
    keep = os.environ.get("GRAPHSUB_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(keep) / shot.name)
    return driver.execute_script(FIGURE_SIZES)


def test_optimize_report_renders_in_chromium(browser, optimize_run, tmp_path):
    _, report = optimize_run
    page = tmp_path / "optimize.html"
    page.write_text(report.to_html())
    figures = render(browser, page, tmp_path / "optimize-report.png")
    ids = [f[0] for f in figures]
    assert {"plot-latency", "plot-op-times", "plot-fidelity", "plot-search"} <= set(ids)
    assert any(i.startswith("plot-rewrite-") for i in ids)
    for name, width, height, drawn in figures:
        assert width >= 250 and height >= 120, (name, width, height)
        assert drawn >= 10, name  # axes, ticks, labels: something was drawn
    assert browser.find_element("id", "verdict").text == report.verdict


def test_compare_report_renders_in_chromium(browser, tmp_path):
    page = tmp_path / "compare.html"
    # the analytic cost, under which both find a cheaper decoder: the final-cost chart is
    # drawn only when some algorithm improved (an empty chart says nothing)
    r = CliRunner().invoke(app, ["compare", "llama", "--algorithms", "greedy,pruning",
                                 "--cost", "analytic", "--time-limit", "5",
                                 "--report", str(page)], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    figures = render(browser, page, tmp_path / "compare-report.png")
    assert [f[0] for f in figures] == ["plot-search", "plot-final-cost"]
    for name, width, height, drawn in figures:
        assert width >= 250 and height >= 120, (name, width, height)
        assert drawn >= 10, name
