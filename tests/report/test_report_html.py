"""report.html: self-contained (plotly.js inlined once, no external resource), escaped, small."""
from __future__ import annotations

import base64
import gzip
import re

import pytest
from sweep_frames import HOSTILE, frame, steps_for, sweep_trials, trial

from dpo_sweep.analysis.pareto import analyse_frontier, objectives_from_spec
from dpo_sweep.analysis.recommend import recommend
from dpo_sweep.analysis.results import load_steps
from dpo_sweep.records import StepRecord, write_steps
from dpo_sweep.report.data import build_report_data
from dpo_sweep.report.html import packed_js, plotly_js, render_html, script_safe_json

OBJS = objectives_from_spec(None)
FAKE_JS = "/* plotly.js stand-in */"


def render(tmp_path, trials, steps=(), env=None, budget=20.0, js=FAKE_JS):
    analysed = analyse_frontier(frame(tmp_path, trials), OBJS)
    steps_df = None
    if steps:
        write_steps(tmp_path / "frame", steps)
        steps_df = load_steps(tmp_path / "frame")
    data = build_report_data(analysed, recommend(analysed, budget), OBJS, steps_df, env)
    return render_html(data, js=js)


def packed_block(html: str) -> str:
    return html.split('id="plotly-packed">', 1)[1].split("</script>", 1)[0]


def test_plotly_is_inlined_once_and_nothing_is_fetched(tmp_path):
    trials = sweep_trials()
    steps = [s for t in trials if t.status == "ok" for s in steps_for(t.trial_id, 3, t.peak_mem_gb)]
    html = render(tmp_path, trials, steps, js=None)
    packed = packed_block(html)
    assert gzip.decompress(base64.b64decode(packed)).decode() == plotly_js()  # the bundle, once, for 8 plots
    assert html.count(packed) == 1 and html.count('id="plotly-packed"') == 1
    html = html.replace(packed, "")  # the rest is ours: check it loads nothing
    assert html.count("Plotly.newPlot(") == 1  # one loop draws every figure
    assert len(re.findall(r'<div id="plot-[a-z-]+" class="plot">', html)) == 10  # scatter, panels, the micro_batch x level grid, parallel coordinates, 6 per step
    assert not re.search(r"<(link|img|iframe|object|embed)\b", html, re.I)
    assert not re.search(r"""\b(src|href)\s*=""", html, re.I)  # no attribute can load anything
    assert "default-src 'none'" in html  # and the page forbids it besides
    assert "GB = 1e9 bytes" in html


def test_hostile_strings_are_escaped(tmp_path):
    # Every text cell a user can write (a checkpoint level outside the levels is refused on load).
    trials = [trial(HOSTILE, 10.0, 100.0, 0.02, model=HOSTILE, error=HOSTILE),
              trial("ok2", 12.0, 90.0, 0.03, model=HOSTILE),
              trial("oom", status="oom", mb=8, model=HOSTILE, error=f'"quoted" & {HOSTILE}')]
    steps = steps_for(HOSTILE, 3, 10.0)
    env = {"gpu": {"name": HOSTILE}, HOSTILE: HOSTILE}
    html = render(tmp_path, trials, steps, env)
    assert HOSTILE not in html
    assert "<script>alert" not in html.lower()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html  # shown as text
    assert html.lower().count("<script") == 4  # plotly.js, the figure JSON, the filter JSON, the drawing code
    assert "</script" not in html.split('id="figure-data">', 1)[1].split("</script>", 1)[0]


def test_script_safe_json():
    text = script_safe_json({"a": "</script><!-- & \u2028"})
    assert "<" not in text and ">" not in text and "&" not in text and "\u2028" not in text
    with pytest.raises(ValueError):
        script_safe_json({"a": float("nan")})


def test_a_report_of_100_trials_with_50_steps_each_is_at_most_1_5_mb(tmp_path):
    levels = ("none", "L1", "L2", "L3", "full")
    trials, steps = [], []
    for i in range(100):
        tid = f"trial_{i:03d}_abcdef"
        status = "oom" if i % 10 == 0 else "ok"
        mem = 10.0 + (i % 7) * 3.3 + i * 0.01
        trials.append(trial(tid, mem, 100.0 + i * 7.1, 0.01 + (i % 13) * 0.0031, status=status,
                            mb=2 ** (i % 4), level=levels[i % 5], ga=1 + i % 3, beta=0.1 * (1 + i % 2),
                            model="meta-llama/Llama-3.2-1B-Instruct"))
        if status == "ok":
            steps += [StepRecord(tid, s, 0.693 - 0.00123 * s, 1.234 + 0.01 * s, 101.23 + s, mem + 0.001 * s,
                                 0.51, 0.123, -123.456, -124.567, 0.0123, logratio_std=0.1 + 0.01 * s)
                      for s in range(50)]
    html = render(tmp_path, trials, steps, env={"gpu": {"name": "NVIDIA H200"}}, budget=40.0, js=None)
    assert len(html.encode()) <= 1_500_000, len(html.encode())


def test_plotly_js_is_the_offline_bundle():
    js = plotly_js()
    assert len(js) > 1_000_000 and "plotly.js (basic - minified) v" in js[:200] and "window.Plotly" in js[-100:]
    assert len(packed_js(js)) < 600_000 and packed_js(js) == packed_js(js)  # deterministic


def test_every_trace_type_is_in_the_bundle(tmp_path):
    # The basic bundle has the scatter, bar and pie traces only: another type would draw nothing.
    trials = sweep_trials()
    steps = [s for t in trials if t.status == "ok" for s in steps_for(t.trial_id, 3, t.peak_mem_gb)]
    analysed = analyse_frontier(frame(tmp_path, trials), OBJS)
    write_steps(tmp_path / "frame", steps)
    data = build_report_data(analysed, recommend(analysed, 20.0), OBJS, load_steps(tmp_path / "frame"))
    assert {t["type"] for f in data.figures for t in f.spec["data"]} <= {"scatter", "bar", "pie"}


def test_a_browser_without_javascript_is_told_where_the_figures_are(tmp_path):
    html = render(tmp_path, sweep_trials())
    note = html.split("<noscript>", 1)[1].split("</noscript>", 1)[0]
    assert "JavaScript" in note and "the tables below hold every trial's figures" in note and "steps.csv" in note
    assert html.index("<noscript>") > html.index('id="plots"')
