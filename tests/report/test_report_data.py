"""The report's data, built before rendering and tested as data ("compute, then render")."""
from __future__ import annotations

import json

import pytest
from sweep_frames import HOSTILE, frame, steps_for, sweep_trials, trial

from dpo_sweep.analysis.pareto import analyse_frontier, objectives_from_spec
from dpo_sweep.analysis.recommend import recommend
from dpo_sweep.analysis.results import load_steps
from dpo_sweep.report.data import build_report_data, flatten

OBJS = objectives_from_spec(None)


def build(tmp_path, trials, budget=20.0, steps=None, env=None):
    analysed = analyse_frontier(frame(tmp_path, trials), OBJS)
    rec = recommend(analysed, budget)
    return analysed, build_report_data(analysed, rec, OBJS, steps, env)


def traces_by_name(fig):
    return {t["name"]: t for t in fig.spec["data"]}


def test_scatter_draws_frontier_budget_and_oom(tmp_path):
    analysed, data = build(tmp_path, sweep_trials())
    scatter = data.figures[0]
    assert scatter.dom_id == "plot-memory-time"
    traces = traces_by_name(scatter)
    front = traces["Pareto frontier (memory, step_time, loss_std)"]
    expected = analysed[analysed["on_frontier"]].sort_values(["peak_mem_gb", "step_time_ms"])
    assert front["x"] == pytest.approx(expected["peak_mem_gb"].tolist(), rel=1e-4)
    assert front["mode"] == "lines+markers"
    oom = traces["OOM (no step time; drawn at the budget)"]
    assert oom["x"] == [20.0, 20.0]  # both OOM trials sit on the budget line
    # One trace per checkpoint level, shaped by level and coloured by loss std on one colour axis.
    levels = {n: t for n, t in traces.items() if n.startswith("checkpoint ")}
    assert set(levels) == {"checkpoint none", "checkpoint L1", "checkpoint L2"}
    assert {t["marker"]["symbol"] for t in levels.values()} == {"circle", "square", "diamond"}
    assert all(t["marker"]["coloraxis"] == "coloraxis" for t in levels.values())
    layout = scatter.spec["layout"]
    assert layout["coloraxis"]["colorbar"]["title"]["text"] == "loss std"
    assert [s["x0"] for s in layout["shapes"]] == [20.0, 19.0]  # budget and usable budget
    assert "1e9 bytes" in layout["xaxis"]["title"]["text"]
    assert traces["diverged / pruned / error"]["x"] == [9.0]  # the diverged trial measured 9 GB


def test_dimension_panels_cover_the_four_swept_dimensions(tmp_path):
    _, data = build(tmp_path, sweep_trials())
    panels = data.figures[1].spec
    x_titles = [panels["layout"][k]["title"]["text"] for k in ("xaxis5", "xaxis6", "xaxis7", "xaxis8")]
    assert x_titles == ["micro_batch", "checkpoint", "grad_acc", "beta"]
    assert panels["layout"]["xaxis2"]["categoryarray"] == ["none", "L1", "L2", "L3"]
    assert all(t["type"] == "scatter" for t in panels["data"])  # SVG only: renders without WebGL


def test_step_curves_only_with_steps_csv(tmp_path):
    trials = [trial("a", 10.0, 100.0, 0.02), trial("b", 12.0, 90.0, 0.03)]
    _, without = build(tmp_path, trials)
    assert [f.dom_id for f in without.figures] == ["plot-memory-time", "plot-dimensions"]
    assert any("steps.csv is absent" in n for n in without.notes)
    (tmp_path / "s").mkdir()
    from dpo_sweep.records import write_steps
    write_steps(tmp_path / "s", steps_for("a", 5, 10.0) + steps_for("b", 500, 12.0))
    _, with_steps = build(tmp_path, trials, steps=load_steps(tmp_path / "s"))
    loss = with_steps.figures[2]
    assert loss.dom_id == "plot-loss" and len(loss.spec["data"]) == 2
    assert len(loss.spec["data"][0]["x"]) == 5
    assert len(loss.spec["data"][1]["x"]) <= 200 and loss.spec["data"][1]["x"][-1] == 499  # thinned
    assert with_steps.figures[3].spec["data"][0]["y"] == [10.0] * 5


def test_tables_summary_environment_and_notes(tmp_path):
    env = {"gpu": {"name": "H200", "memory_gb": 143.8}, "versions": {"torch": "2.9"}, "hosts": ["a", "b"]}
    analysed, data = build(tmp_path, sweep_trials(), env=env)
    assert len(data.frontier_table.rows) == len(data.trials_table.rows) == len(analysed)
    assert data.frontier_table.header[-1] == "on frontier"
    assert "status-oom" in data.frontier_table.row_classes
    assert ("gpu.name", "H200") in data.environment and ("hosts", "a, b") in data.environment
    summary = dict(data.summary)
    assert "1e9 bytes" in summary["units"] and summary["memory budget"].startswith("20.00 GB")
    assert any("t91 (error)" in n for n in data.notes)  # unplotted rows are named, not dropped
    assert data.recommendation_headline.startswith("Use micro_batch")
    assert data.recommendation_json["trial_id"] == data.recommendation_headline.split("trial ")[1].rstrip(")")


def test_figure_data_is_strict_json(tmp_path):
    trials = sweep_trials() + [trial("nan", 5.0, float("nan"), float("nan"))]
    _, data = build(tmp_path, trials, budget=None)
    json.dumps([f.spec for f in data.figures], allow_nan=False)  # NaN became null


def test_data_strings_are_escaped_for_plotly(tmp_path):
    trials = [trial(HOSTILE, 10.0, 100.0, 0.02, level=HOSTILE, model=HOSTILE, error=HOSTILE),
              trial("b", 12.0, 90.0, 0.03)]
    _, data = build(tmp_path, trials)
    text = json.dumps([f.spec for f in data.figures])
    assert HOSTILE not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    # Plain data (tables, title) stays raw here; the template's autoescape handles it.
    assert HOSTILE in data.title


def test_flatten():
    assert flatten({"a": {"b": 1, "c": [1, 2]}, "d": [{"e": None}]}) == [
        ("a.b", "1"), ("a.c", "1, 2"), ("d[0].e", "")]
