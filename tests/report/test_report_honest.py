"""What the report must never imply: a plot that can send its data away, a failed trial drawn at
a throughput it never had, a swept dimension left out of the scatter, a diverging trial on the
frontier or coloured as the most stable, a recommended point that looks like another trial."""
from __future__ import annotations

import json
import re
from dataclasses import replace

from sweep_frames import trial

from dpo_sweep.analysis.pareto import analyse_frontier, objectives_from_spec
from dpo_sweep.analysis.recommend import recommend
from dpo_sweep.analysis.results import load_results
from dpo_sweep.report import scatter
from dpo_sweep.report.data import build_report_data
from dpo_sweep.report.figures import panel_dimensions
from dpo_sweep.report.html import render_html
from sweep_frames import write_dir

OBJS = objectives_from_spec(None)


def levers_sweep() -> list:
    """adapter x optimizer at two micro-batches and two levels, one OOM and one pruned."""
    rows = []
    for a, adapter in enumerate(("full", "lora")):
        for o, optimizer in enumerate(("adamw", "adamw_8bit")):
            for m, mb in enumerate((4, 8)):
                for lv, level in enumerate(("L1", "L2")):
                    tid = f"t{a}{o}{m}{lv}"
                    rows.append(replace(trial(tid, 20.0 + 10 * a - 5 * o + 8 * m - 2 * lv, 100.0 + 10 * lv - 5 * m,
                                              0.02 + 0.001 * len(rows), mb=mb, level=level, seed=0),
                                        adapter=adapter, optimizer=optimizer))
    rows.append(replace(trial("oom", status="oom", mb=16, level="L1", seed=0, error="CUDA out of memory"),
                        adapter="full", optimizer="adamw"))
    rows.append(replace(trial("pru", status="pruned", mb=16, level="L2", seed=0, error="pruned"),
                        adapter="full", optimizer="adamw", predicted_peak_gb=95.0))
    return rows


def build(tmp_path, rows, budget=80.0):
    analysed = analyse_frontier(load_results(write_dir(tmp_path / "r", rows)), OBJS)
    rec = recommend(analysed, budget)
    return analysed, rec, build_report_data(analysed, rec, OBJS)


def test_every_plot_config_sends_nothing(tmp_path):
    _, _, data = build(tmp_path, levers_sweep())
    page = render_html(data, js="/* plotly */")
    figures = json.loads(re.search(r'id="figure-data">(.*?)</script>', page, re.S).group(1))
    assert len(figures) >= 2
    for fig in figures:  # plotly.js 4 defaults showSendToCloud to true
        config = fig["config"]
        assert config["showSendToCloud"] is False and config["showEditInChartStudio"] is False, fig["id"]
        assert config["sendData"] is False and config["showLink"] is False and config["displaylogo"] is False


def test_every_swept_dimension_is_in_the_scatter_and_the_panels(tmp_path):
    analysed, _, data = build(tmp_path, levers_sweep())
    enc = scatter.encoding(analysed)
    assert (enc.symbol, enc.size, enc.facets) == ("checkpoint_level", "micro_batch", ("adapter", "optimizer"))
    spec = data.figures[0].spec
    titles = [a["text"] for a in spec["layout"]["annotations"] if a["text"].startswith("<b>adapter")]
    assert titles == ["<b>adapter full, optimizer adamw</b>", "<b>adapter full, optimizer adamw_8bit</b>",
                      "<b>adapter lora, optimizer adamw</b>", "<b>adapter lora, optimizer adamw_8bit</b>"]
    sizes = {t["name"]: t["marker"]["size"] for t in spec["data"] if t["name"].endswith("(size)")}
    assert sizes == {"micro_batch 4 (size)": 9, "micro_batch 8 (size)": 12}
    assert [c for c, _ in panel_dimensions(analysed)] == ["micro_batch", "checkpoint_level", "adapter", "optimizer"]
    assert "One panel per adapter x optimizer" in data.figures[0].caption


def test_a_swept_train_field_takes_the_shape_when_the_level_does_not_vary(tmp_path):
    rows = [replace(trial(f"t{i}", 10.0 + i, 100.0 - i, 0.02, seed=0), extra={"seed": 0, "lr": lr})
            for i, lr in enumerate((1e-6, 5e-6, 2e-5))]
    analysed, _, data = build(tmp_path, rows)
    assert scatter.encoding(analysed).symbol == "lr"
    keys = [t["name"] for t in data.figures[0].spec["data"] if t.get("hoverinfo") == "skip" and t["x"] == [None]
            and t.get("showlegend") is not False]
    assert keys == ["lr 1e-06", "lr 5e-06", "lr 2e-05"]


def test_failed_trials_sit_in_their_own_strip_never_at_a_throughput(tmp_path):
    _, _, data = build(tmp_path, levers_sweep())
    spec = data.figures[0].spec
    for name in ("OOM (no throughput; at its measured peak, else the budget)", "pruned (never ran; at its predicted peak)"):
        trace = next(t for t in spec["data"] if t["name"] == name)
        strip = spec["layout"]["yaxis" + trace["yaxis"][1:]]
        assert strip["ticktext"] == ["OOM", "pruned"] and strip["range"] == [-0.6, 1.6]
        assert all(t.get("yaxis") != trace["yaxis"] for t in spec["data"] if t["name"].startswith("checkpoint"))
    pruned = next(t for t in spec["data"] if t["name"].startswith("pruned"))
    assert pruned["x"] == [95.0] and pruned["y"] == [1]


def test_the_recommended_marker_is_used_by_no_other_trace(tmp_path):
    _, rec, data = build(tmp_path, levers_sweep())
    traces = data.figures[0].spec["data"]
    win = [t for t in traces if t["name"].startswith("recommended")]
    assert len(win) == 1 and win[0]["name"] == f"recommended ({rec.trial_id})"
    others = [t for t in traces if not t["name"].startswith("recommended") and "marker" in t]
    used = {s for t in others for s in (t["marker"]["symbol"] if isinstance(t["marker"]["symbol"], list)
                                        else [t["marker"]["symbol"]])}
    assert win[0]["marker"]["symbol"] not in used
    assert any(a["text"] == "<b>recommended</b>" for a in data.figures[0].spec["layout"]["annotations"])


def test_a_collapsed_run_is_off_the_frontier_and_off_the_colour_scale(tmp_path):
    # The learning example's shape: the diverging run's loss collapsed to the sweep's lowest std.
    rows = [replace(trial("stable", 30.0, 100.0, 0.05, seed=0), stability="stable"),
            replace(trial("noisy", 30.0, 100.0, 0.2, seed=1), stability="noisy"),
            replace(trial("collapsed", 30.0, 100.0, 1e-7, seed=2), stability="diverging", rollback_step=9)]
    analysed, rec, data = build(tmp_path, rows)
    on = dict(zip(analysed["trial_id"], analysed["on_frontier"]))
    assert on == {"stable": True, "noisy": False, "collapsed": False}
    assert sorted(r[-1].text for r in data.frontier_table.rows) == ["no", "no", "yes"]
    layout = data.figures[0].spec["layout"]
    assert layout["coloraxis"]["cmin"] == 0.05  # the scale spans the runs that learn
    coloured = [v for t in data.figures[0].spec["data"] if t["marker"].get("coloraxis") for v in t["marker"]["color"]]
    assert 1e-7 not in coloured
    assert rec.trial_id == "stable"
    assert dict(data.summary)["on the frontier"] == "1"


def test_curves_one_legend_entry_per_visible_line_whole_steps_and_an_unflattened_log_ratio(tmp_path):
    import pandas as pd

    from dpo_sweep.report.curves import step_curves, step_dtick

    rows = [trial(t, 10.0, 100.0, 0.02, seed=0) for t in ("a", "b", "c")]
    analysed = analyse_frontier(load_results(write_dir(tmp_path / "r", rows)), OBJS)
    steps = pd.DataFrame([{"trial_id": t, "step": s, "logratio_std": 0.01 * s + (0.5 if t == "c" else 0.0)}
                          for t in ("a", "b", "c") for s in range(1, 7)])
    spec = step_curves(steps, analysed, "logratio_std", "t", "y", (1.5, "rollback threshold 1.5"))
    assert [t["name"] for t in spec["data"]] == ["a mb1 none ga1 \u03b20.1 seed 0 and 1 more (the same curve)",
                                                 "c mb1 none ga1 \u03b20.1 seed 0"]
    assert spec["layout"]["xaxis"]["dtick"] == 1 and spec["layout"]["xaxis"]["tickformat"] == "d"
    assert "shapes" in spec["layout"]  # 1.5 is within 3x of c's 0.56: drawn
    low = steps.assign(logratio_std=steps["logratio_std"] / 10)
    flat = step_curves(low, analysed, "logratio_std", "t", "y", (1.5, "rollback threshold 1.5"))
    assert "shapes" not in flat["layout"] and "above every value" in flat["layout"]["annotations"][0]["text"]
    assert [step_dtick(n) for n in (6, 10, 11, 40, 500)] == [1, 1, 2, 5, 50]


def test_no_negative_predicted_peak_and_no_minus_zero():
    from dpo_sweep.analysis.tables import _predicted, signed_pct

    assert _predicted(-0.17) == "-" and _predicted(12.345) == "12.35"
    assert [signed_pct(v) for v in (-0.04, 0.04, -1.26, 2.0)] == ["0.0%", "0.0%", "-1.3%", "+2.0%"]


def test_parallel_coordinates_one_line_per_trial_over_the_swept_dimensions_and_objectives(tmp_path):
    analysed, rec, data = build(tmp_path, levers_sweep())
    fig = next(f for f in data.figures if f.dom_id == "plot-parallel")
    names = [a["name"] for a in data.filter_data["axes"]]
    assert names == ["micro_batch", "checkpoint", "adapter", "optimizer", "peak GB", "tokens/s", "loss std"]
    assert len(fig.spec["data"]) == len(data.filter_data["trials"]) == len(analysed)
    assert all(t["type"] == "scatter" for t in fig.spec["data"])  # SVG: no WebGL parcoords
    last = fig.spec["data"][-1]  # drawn on top
    assert last["name"] == "recommended" and last["line"]["color"] == "#2ca02c"
    assert data.filter_data["trials"][-1]["id"] == rec.trial_id
    oom = next(t for t in data.filter_data["trials"] if t["id"] == "oom")
    assert oom["group"] == "oom" and oom["values"][names.index("tokens/s")] is None  # a gap, not a value


def test_a_swept_train_field_with_a_fixed_column_of_its_own_shows_like_any_other(tmp_path, monkeypatch):
    # A train field that results.csv carries in a fixed column of its own (the trainer, native | trl):
    # no list names it; being a train field and a results column is enough.
    from dpo_sweep.analysis import tables

    class Spec:
        model_fields = {**tables.TrainSpec.model_fields, "trainer": None}

    monkeypatch.setattr(tables, "TrainSpec", Spec)
    monkeypatch.setattr(tables, "RESULTS_COLUMNS", [*tables.RESULTS_COLUMNS, "trainer"])
    rows = [replace(trial(f"{t}{mb}", 10.0 + mb + (2 if t == "trl" else 0), 100.0, 0.02, mb=mb, seed=0),
                    extra={"seed": 0, "trainer": t}) for t in ("native", "trl") for mb in (1, 2)]
    analysed, _, data = build(tmp_path, rows)
    assert scatter.encoding(analysed).symbol == "trainer"  # the level does not vary: the shape is free
    assert "trainer" in [c for c, _ in panel_dimensions(analysed)]
    assert "trainer" in data.frontier_table.header and "trainer" in [a["name"] for a in data.filter_data["axes"]]
