"""Open report.html in headless Chromium from a file:// URL: no console errors, no network
requests, no script injection, and every plot rendered as non-empty SVG.

Skipped when Chromium is absent; CI installs Debian's `chromium` first (.ci/run).
"""
from __future__ import annotations

import pytest
from cdp_chromium import Chromium, find_chromium
from sweep_frames import HOSTILE, steps_for, sweep_trials, trial, write_dir

from dpo_sweep.analysis.commands import analyse_dir

# For every plot div: how many plotly SVG layers, how many drawn markers/lines, and whether
# any SVG has content.
PLOT_STATE_JS = """
Array.from(document.querySelectorAll('div.plot')).map(function (div) {
  var svgs = div.querySelectorAll('svg.main-svg');
  return {id: div.id, svgs: svgs.length,
          marks: div.querySelectorAll('.scatterlayer path.point, .scatterlayer path.js-line').length,
          nonEmpty: Array.from(svgs).some(function (s) { return s.childElementCount > 0; }),
          width: div.getBoundingClientRect().width};
})
"""


@pytest.fixture(scope="module")
def chromium_binary():
    binary = find_chromium()
    if binary is None:
        pytest.skip("chromium not installed (CI installs it: apt-get install chromium)")
    return binary


def test_report_renders_offline_in_chromium(tmp_path, chromium_binary):
    trials = sweep_trials(model=HOSTILE) + [trial(HOSTILE, 6.0, 500.0, 0.02, level=HOSTILE, error=HOSTILE)]
    steps = [s for t in trials if t.status == "ok" for s in steps_for(t.trial_id, 4, t.peak_mem_gb)]
    env = {"gpu": {"name": HOSTILE, "memory_gb": 20.0}}
    out_dir = write_dir(tmp_path / "results", trials, steps, env=env)
    report = analyse_dir(out_dir).report_path
    url = report.resolve().as_uri()

    with Chromium(chromium_binary, tmp_path / "profile", timeout_s=60) as browser:
        browser.open(url)
        ready = browser.wait_for("document.body && document.body.getAttribute('data-plots-ready')", 45)
        plots = browser.evaluate(PLOT_STATE_JS)
        title = browser.evaluate("document.title")
        injected = browser.evaluate("document.querySelectorAll('script').length")
        browser.pump(0.5)  # let late console messages or requests arrive
        log = browser.log

    assert ready == "4", f"plots not drawn: {ready!r}; errors: {log.errors()}"
    assert log.errors() == []
    assert log.dialogs == []  # alert(1) never ran
    assert injected == 3  # plotly.js, the figure JSON, the drawing code: nothing from the data
    assert HOSTILE in title  # the hostile name is shown, as text
    assert [r for r in log.requests if r != url] == [], "the report made network requests"
    assert [p["id"] for p in plots] == [
        "plot-memory-time", "plot-dimensions", "plot-loss", "plot-memory-steps"]
    for p in plots:
        assert p["svgs"] >= 1 and p["nonEmpty"] and p["marks"] > 0 and p["width"] > 0, p


def test_all_oom_results_only_report_renders_without_errors(tmp_path, chromium_binary):
    # Edge case: nothing completed, no steps.csv, no environment.json, no budget.
    trials = [trial(f"t{i}", status="oom", mb=2 ** i, level="none") for i in range(3)]
    report = analyse_dir(write_dir(tmp_path / "results", trials)).report_path
    with Chromium(chromium_binary, tmp_path / "profile", timeout_s=60) as browser:
        browser.open(report.resolve().as_uri())
        ready = browser.wait_for("document.body && document.body.getAttribute('data-plots-ready')", 45)
        text = browser.evaluate("document.body.innerText")
        browser.pump(0.3)
        log = browser.log
    assert ready == "2", f"plots not drawn: {ready!r}; errors: {log.errors()}"
    assert log.errors() == [] and log.dialogs == []
    assert "No configuration fits" in text and "No trial completed" in text
