"""Open report.html in headless Chromium from a file:// URL at 1280 px: no console errors or
warnings, no network requests, no script injection, every plot rendered as non-empty SVG, tables
within the page, and a sweep in which everything failed says what failed instead of plotting.

Skipped when Chromium is absent; CI installs Debian's `chromium` first (.ci/run).
"""
from __future__ import annotations

from pathlib import Path

import pytest
from cdp_chromium import Chromium, find_chromium
from report_frames import CUDA_OOM, all_oom_sweep, llama_sweep
from sweep_frames import HOSTILE, steps_for, sweep_trials, trial, write_dir

from dpo_sweep.commands.report import analyse_dir

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


# For every table: its width against the page and its scroll box, and its tallest row.
TABLE_FIT_JS = """
Array.from(document.querySelectorAll('table')).map(function (t) {
  var box = t.parentElement, rows = Array.from(t.querySelectorAll('tbody tr'));
  return {right: t.getBoundingClientRect().right, page: document.documentElement.clientWidth,
          scrollWidth: box.scrollWidth, boxWidth: box.clientWidth,
          tallestRow: Math.max.apply(null, rows.map(function (r) { return r.getBoundingClientRect().height; }))};
})
"""
OPEN_ALL_DETAILS_JS = "document.querySelectorAll('td details').forEach(function (d) { d.open = true; })"


def assert_tables_fit(tables, max_row_px):
    for t in tables:
        assert t["right"] <= t["page"] and t["scrollWidth"] <= t["boxWidth"], t
        assert t["tallestRow"] <= max_row_px, t


@pytest.fixture(scope="module")
def chromium_binary():
    binary = find_chromium()
    if binary is None:
        pytest.skip("chromium not installed (CI installs it: apt-get install chromium)")
    return binary


def test_report_renders_offline_in_chromium(tmp_path, chromium_binary):
    trials = sweep_trials(model=HOSTILE) + [trial(HOSTILE, 6.0, 500.0, 0.02, error=HOSTILE)]  # a level is one of the levels
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

    assert ready == "10", f"plots not drawn: {ready!r}; errors: {log.errors()}"
    assert log.errors() == []
    assert log.dialogs == []  # alert(1) never ran
    assert injected == 4  # plotly.js (packed), the figure JSON, the filter JSON, the drawing code: nothing from the data
    assert HOSTILE in title  # the hostile name is shown, as text
    assert [r for r in log.requests if r != url] == [], "the report made network requests"
    assert [p["id"] for p in plots] == [
        "plot-memory-time", "plot-dimensions", "plot-grid", "plot-parallel", "plot-loss", "plot-grad-norm", "plot-logratio-std",
        "plot-reward-accuracy", "plot-step-time", "plot-memory-steps"]
    for p in plots:
        assert p["svgs"] >= 1 and p["nonEmpty"] and p["marks"] > 0 and p["width"] > 0, p


def test_tables_fit_1280px_and_long_errors_sit_behind_a_toggle(tmp_path, chromium_binary):
    trials = llama_sweep()
    steps = [s for t in trials if t.status == "ok" for s in steps_for(t.trial_id, 4, t.peak_mem_gb)]
    report = analyse_dir(write_dir(tmp_path / "results", trials, steps)).report_path
    oom_id = trials[-1].trial_id
    with Chromium(chromium_binary, tmp_path / "profile", timeout_s=60) as browser:
        browser.open(report.resolve().as_uri(), width_px=1280)
        ready = browser.wait_for("document.body && document.body.getAttribute('data-plots-ready')", 45)
        closed = browser.evaluate(TABLE_FIT_JS)
        oom_row = browser.evaluate(
            f"(function () {{ var c = document.querySelector('td[title=\"{oom_id}\"]');"
            " var d = c.parentElement.nextElementSibling.querySelector('details');"
            " return {shown: c.textContent, open: d.open, summary: d.querySelector('summary').textContent,"
            " full: d.textContent}; })()")
        browser.evaluate(OPEN_ALL_DETAILS_JS)
        opened = browser.evaluate(TABLE_FIT_JS)
        browser.pump(0.5)
        log = browser.log
    assert ready == "10", f"plots not drawn: {ready!r}; errors: {log.errors()}"
    assert log.errors() == []  # includes plotly's own warnings (console.trace)
    assert len(closed) == 2
    assert_tables_fit(closed, max_row_px=45)  # a line per trial (two for its error), the rest folded
    assert oom_row["shown"] == "t005" and not oom_row["open"]  # compact id, the full one on hover
    assert oom_row["summary"].startswith("error: rank 0: CUDA out of memory.")  # on the line under it
    assert "torch.OutOfMemoryError" in oom_row["full"]  # the whole error is one click away
    assert_tables_fit(opened, max_row_px=600)  # unfolded, it wraps inside its column


def test_all_failed_report_says_what_failed_instead_of_plotting(tmp_path, chromium_binary):
    # Nothing completed, no steps.csv, no environment.json, no budget.
    report = analyse_dir(write_dir(tmp_path / "results", all_oom_sweep())).report_path
    with Chromium(chromium_binary, tmp_path / "profile", timeout_s=60) as browser:
        browser.open(report.resolve().as_uri(), width_px=1280)
        ready = browser.wait_for("document.body && document.body.getAttribute('data-plots-ready')", 45)
        text = browser.evaluate("document.body.innerText")
        plots = browser.evaluate("document.querySelectorAll('div.plot, svg.main-svg').length")
        tables = browser.evaluate(TABLE_FIT_JS)
        browser.pump(0.3)
        log = browser.log
    assert ready == "0", f"unexpected plots: {ready!r}; errors: {log.errors()}"
    assert plots == 0  # no empty scatter on default axes, no stray subplot
    assert log.errors() == [] and log.dialogs == []
    assert "No configuration fits" in text
    assert "No trial completed, so there is nothing to plot" in text
    assert "3 oom: t000, t001, t002" in text
    assert CUDA_OOM.splitlines()[0][:60] in text
    assert_tables_fit(tables, max_row_px=45)


EXAMPLES = Path(__file__).resolve().parents[2] / "reports" / "examples"

# A click on a column's title sorts its rows: the text of that column's cells, top to bottom.
SORT_JS = """
(function (title) {
  var table = document.querySelector('#trials-table table.sortable');
  var heads = Array.from(table.querySelectorAll('thead th'));
  var i = heads.findIndex(function (h) { return h.textContent.replace(/\\s+/g, ' ').trim() === title; });
  heads[i].click();
  return Array.from(table.tBodies[0].rows).filter(function (r) { return !r.classList.contains('error-line'); })
    .map(function (r) { return r.cells[i].textContent.trim(); });
})
"""


@pytest.mark.parametrize("example", sorted(p for p in EXAMPLES.iterdir() if (p / "report.html").is_file()),
                         ids=lambda p: p.name)
def test_every_committed_example_renders_offline_and_fits_1280px(example, tmp_path, chromium_binary):
    url = (example / "report.html").resolve().as_uri()
    with Chromium(chromium_binary, tmp_path / "profile", timeout_s=60) as browser:
        browser.open(url, width_px=1280)
        ready = browser.wait_for("document.body && document.body.getAttribute('data-plots-ready')", 45)
        tables = browser.evaluate(TABLE_FIT_JS)
        tokens = browser.evaluate(SORT_JS + "('tokens/s')")
        browser.pump(0.3)
        log = browser.log
    assert ready not in (None, "error"), f"plots not drawn: {ready!r}; errors: {log.errors()}"
    assert log.errors() == [] and [r for r in log.requests if r != url] == []
    assert_tables_fit(tables, max_row_px=60)
    numbers = [float(t.replace(",", "")) for t in tokens if t != "-"]
    assert numbers == sorted(numbers) and tokens[len(numbers):] == ["-"] * (len(tokens) - len(numbers))


def test_the_parallel_coordinates_filters_hide_lines_and_table_rows(tmp_path, chromium_binary):
    trials = llama_sweep()  # five ok (two checkpoint levels) and one OOM
    report = analyse_dir(write_dir(tmp_path / "results", trials)).report_path
    visible_rows = ("Array.from(document.querySelectorAll('#trials-table tr[data-trial]:not(.error-line)'))"
                    ".filter(function (r) { return r.style.display !== 'none'; }).length")
    visible_lines = ("document.getElementById('plot-parallel').data.filter(function (t) { return t.visible !== false; }).length")
    with Chromium(chromium_binary, tmp_path / "profile", timeout_s=60) as browser:
        browser.open(report.resolve().as_uri(), width_px=800)
        browser.wait_for("document.body && document.body.getAttribute('data-plots-ready')", 45)
        before = (browser.evaluate("document.body.getAttribute('data-filter-shown')"),
                  browser.evaluate(visible_rows), browser.evaluate(visible_lines))
        # untick checkpoint "full": its 3 trials leave the plot and the table
        browser.evaluate("Array.from(document.querySelectorAll('#parallel-filters fieldset')).find(function (f) {"
                         " return f.querySelector('legend').textContent === 'checkpoint'; }).querySelectorAll('input')[1].click()")
        after = (browser.evaluate("document.body.getAttribute('data-filter-shown')"),
                 browser.evaluate(visible_rows), browser.evaluate(visible_lines))
        browser.evaluate("Array.from(document.querySelectorAll('#parallel-filters fieldset')).find(function (f) {"
                         " return f.querySelector('legend').textContent === 'status'; }).querySelector('input').click()")
        count = browser.evaluate("document.getElementById('filter-count').textContent")
        log = browser.log
    assert before == ("6", 6, 6)
    assert after == ("3", 3, 3)
    assert count.endswith("of 6 trials shown (here and in All trials)")
    assert log.errors() == []


# For every plot: its legend's box and the boxes of its axis titles and of its plot areas.
LEGEND_CLEAR_JS = """
Array.from(document.querySelectorAll('div.plot')).map(function (div) {
  function box(el) { var r = el.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; }
  var legend = div.querySelector('g.legend .bg');
  return {id: div.id, legend: legend ? box(legend) : null,
          titles: Array.from(div.querySelectorAll('g.g-xtitle text, g.g-ytitle text')).map(box),
          areas: Array.from(div.querySelectorAll('.nsewdrag')).map(box)};
})
"""


def _meets(a, b):
    return not (a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1])


#: The grid's squares (report/heatmap.py), per panel: [left, top, right, bottom] of each.
GRID_CELLS_JS = """(function () {
  var out = {};
  document.querySelectorAll('#plot-grid .subplot').forEach(function (sub) {
    out[sub.getAttribute('class')] = Array.prototype.map.call(sub.querySelectorAll('path.point'), function (p) {
      var r = p.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; });
  });
  return out;
})()"""


@pytest.mark.parametrize("width", [400, 1280])
def test_the_grids_cells_never_overlap_at_400_and_1280_px(tmp_path, chromium_binary, width):
    trials = llama_sweep()
    report = analyse_dir(write_dir(tmp_path / "results", trials)).report_path
    with Chromium(chromium_binary, tmp_path / "profile", timeout_s=60) as browser:
        browser.open(report.resolve().as_uri(), width_px=width)
        ready = browser.wait_for("document.body && document.body.getAttribute('data-plots-ready')", 45)
        panels = browser.evaluate(GRID_CELLS_JS)
    assert ready not in (None, "error"), ready
    assert panels and all(len(cells) >= 2 for cells in panels.values()), panels
    for name, cells in panels.items():
        for i, a in enumerate(cells):
            assert a[2] - a[0] >= 12, (name, a)  # still a square one can see
            for b in cells[i + 1:]:
                assert not _meets(a, b), (width, name, a, b)


@pytest.mark.parametrize("width", [400, 1280])
def test_no_legend_sits_on_an_axis_title_or_a_plot_at_400_and_1280_px(tmp_path, chromium_binary, width):
    trials = llama_sweep()
    steps = [s for t in trials if t.status == "ok" for s in steps_for(t.trial_id, 4, t.peak_mem_gb)]
    report = analyse_dir(write_dir(tmp_path / "results", trials, steps)).report_path
    with Chromium(chromium_binary, tmp_path / "profile", timeout_s=60) as browser:
        browser.open(report.resolve().as_uri(), width_px=width)
        ready = browser.wait_for("document.body && document.body.getAttribute('data-plots-ready')", 45)
        plots = browser.evaluate(LEGEND_CLEAR_JS)
    assert ready == "10", ready
    with_legend = [p for p in plots if p["legend"] is not None]  # plotly draws none for a single line
    assert {"plot-memory-time", "plot-dimensions", "plot-parallel"} <= {p["id"] for p in with_legend}
    for p in with_legend:
        assert p["areas"], p  # the parallel plot names its axes in annotations: no titles
        assert not any(_meets(p["legend"], t) for t in p["titles"]), p
        assert not any(_meets(p["legend"], a) for a in p["areas"]), p
