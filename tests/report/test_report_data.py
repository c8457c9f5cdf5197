"""The report's data, built before rendering and tested as data ("compute, then render")."""
from __future__ import annotations

import dataclasses
import json

import pytest
from report_frames import CUDA_OOM, all_oom_sweep, llama_sweep
from sweep_frames import HOSTILE, frame, steps_for, sweep_trials, trial

from dpo_sweep.analysis.pareto import analyse_frontier, objectives_from_spec
from dpo_sweep.analysis.recommend import recommend
from dpo_sweep.analysis.results import load_steps
from dpo_sweep.records import write_steps
from dpo_sweep.report.data import (ERROR_SUMMARY_CHARS, Cell, build_report_data, compact_trial_ids,
                                   error_cell, flatten)

OBJS = objectives_from_spec(None)


def build(tmp_path, trials, budget=20.0, steps=None, env=None):
    analysed = analyse_frontier(frame(tmp_path, trials), OBJS)
    rec = recommend(analysed, budget)
    return analysed, build_report_data(analysed, rec, OBJS, steps, env)


def traces_by_name(fig):
    """Name -> trace; a level's points come before its legend key (figures.level_legend_key)."""
    out = {}
    for t in fig.spec["data"]:
        out.setdefault(t["name"], t)
    return out


def test_scatter_draws_frontier_budget_and_oom(tmp_path):
    analysed, data = build(tmp_path, sweep_trials())
    scatter = data.figures[0]
    assert scatter.dom_id == "plot-memory-time"
    traces = traces_by_name(scatter)
    front = traces["Pareto frontier (memory, throughput, loss_std)"]
    expected = analysed[analysed["on_frontier"]].sort_values(["peak_mem_gb", "tokens_per_s"])
    assert front["x"] == pytest.approx(expected["peak_mem_gb"].tolist(), rel=1e-4)
    assert front["y"] == pytest.approx(expected["tokens_per_s"].tolist(), rel=1e-4)  # throughput axis
    assert front["mode"] == "lines+markers"
    layout = scatter.spec["layout"]
    assert "tokens/s" in layout["yaxis"]["title"]["text"]
    oom = traces["OOM (no throughput; at its measured peak, else the budget)"]
    assert oom["x"] == [20.0, 20.0]  # both OOM trials measured no peak: they sit on the budget line
    # ... in the strip under the panel: an axis of its own, labelled, never a throughput
    assert oom["yaxis"] != "y" and layout["yaxis" + oom["yaxis"][1:]]["ticktext"] == ["OOM", "pruned"]
    # Shaped by level and coloured by loss std on one colour axis; each level's legend entry is a
    # separate key (its shape in grey) in the same legend group.
    levels = [t for t in scatter.spec["data"] if t["name"].startswith("checkpoint ")]
    points = {t["name"]: t for t in levels if t.get("showlegend") is False}
    keys = {t["name"]: t for t in levels if t.get("showlegend") is not False}
    assert set(points) == set(keys) == {"checkpoint none", "checkpoint L1", "checkpoint L2"}
    assert {t["marker"]["symbol"] for t in points.values()} == {"circle", "square", "diamond"}
    assert all(t["marker"]["coloraxis"] == "coloraxis" for t in points.values())
    assert all(keys[n]["legendgroup"] == points[n]["legendgroup"] for n in keys)
    assert all(keys[n]["marker"]["symbol"] == points[n]["marker"]["symbol"] for n in keys)
    assert layout["coloraxis"]["colorbar"]["title"]["text"] == "loss std"
    assert [s["x0"] for s in layout["shapes"]] == [20.0, 19.0]  # budget and usable budget
    assert traces["diverged / error (measured before it stopped)"]["x"] == [9.0]  # the diverged trial measured 9 GB


def test_every_legend_symbol_has_a_colour_string(tmp_path):
    # plotly cannot colour a legend symbol from a colour-axis number: it logs "Invalid color
    # specifier: number 0.0224" and draws it black. Whatever shows in a legend has a colour string.
    _, data = build(tmp_path, sweep_trials(), steps=None)
    for fig in data.figures:
        for t in fig.spec["data"]:
            if t.get("showlegend") is not False and "marker" in t:
                assert isinstance(t["marker"]["color"], str), (fig.dom_id, t["name"])


def test_scatter_bars_show_the_throughput_noise(tmp_path):
    from dataclasses import replace
    trials = [replace(trial("a", 10.0, 100.0, 0.02, tps=1000.0, seed=0), step_time_p10_ms=80.0, step_time_p90_ms=125.0),
              trial("b", 12.0, 90.0, 0.03, tps=1200.0, seed=0)]  # no spread: a zero-length bar
    _, data = build(tmp_path, trials)
    bars = next(t for t in data.figures[0].spec["data"] if "error_y" in t)["error_y"]  # a's and b's: one shape
    assert bars["arrayminus"] == pytest.approx([200.0, 0.0]) and bars["array"] == pytest.approx([250.0, 0.0])


def test_dimension_panels_cover_the_swept_dimensions_that_vary(tmp_path):
    _, data = build(tmp_path, sweep_trials())  # one beta; a swept seed (sweep_frames.trial)
    panels = data.figures[1].spec
    x_titles = [panels["layout"][k]["title"]["text"] for k in ("xaxis5", "xaxis6", "xaxis7", "xaxis8")]
    assert x_titles == ["micro_batch", "checkpoint", "grad_acc", "seed"]
    assert panels["layout"]["xaxis2"]["categoryarray"] == ["none", "L1", "L2", "L3"]
    assert all(t["type"] == "scatter" for t in panels["data"])  # SVG only: renders without WebGL


def test_step_curves_only_with_steps_csv(tmp_path):
    trials = [trial("a", 10.0, 100.0, 0.02), trial("b", 12.0, 90.0, 0.03)]
    _, without = build(tmp_path, trials)
    assert [f.dom_id for f in without.figures] == ["plot-memory-time", "plot-dimensions", "plot-parallel"]
    assert any("steps.csv is absent" in n for n in without.notes)
    (tmp_path / "s").mkdir()
    write_steps(tmp_path / "s", steps_for("a", 5, 10.0) + steps_for("b", 500, 12.0))
    _, with_steps = build(tmp_path, trials, steps=load_steps(tmp_path / "s"))
    loss = with_steps.figures[3]
    assert loss.dom_id == "plot-loss" and len(loss.spec["data"]) == 2
    assert len(loss.spec["data"][0]["x"]) == 5
    assert len(loss.spec["data"][1]["x"]) <= 200 and loss.spec["data"][1]["x"][-1] == 499  # thinned
    by_id = {f.dom_id: f for f in with_steps.figures}
    assert by_id["plot-memory-steps"].spec["data"][0]["y"] == [10.0] * 5
    assert [f.dom_id for f in with_steps.figures[3:]] == ["plot-loss", "plot-grad-norm", "plot-logratio-std",
                                                          "plot-reward-accuracy", "plot-step-time",
                                                          "plot-memory-steps"]
    threshold = by_id["plot-logratio-std"].spec["layout"]["shapes"][0]
    assert threshold["y0"] == threshold["y1"] == 1.5  # stability.py's rollback trigger


def test_tables_summary_environment_and_notes(tmp_path):
    env = {"gpu": {"name": "H200", "memory_gb": 143.8}, "versions": {"torch": "2.9"}, "hosts": ["a", "b"]}
    analysed, data = build(tmp_path, sweep_trials(), env=env)
    assert len(data.frontier_table.rows) == len(data.trials_table.rows) == len(analysed)
    assert data.frontier_table.header[-1] == "on frontier"
    assert "status-oom" in data.frontier_table.row_classes
    assert ("gpu.name", "H200") in data.environment and ("hosts", "a, b") in data.environment
    summary = dict(data.summary)
    assert summary["memory budget"].startswith("20.00 GB")
    assert any("t91 (error)" in n for n in data.notes)  # unplotted rows are named, not dropped
    assert data.recommendation_headline.startswith("Use micro_batch")
    assert data.recommendation_json["trial_id"] == data.recommendation_headline.split("trial ")[1].rstrip(")")


def test_figure_data_is_strict_json(tmp_path):
    trials = sweep_trials() + [trial("nan", 5.0, float("nan"), float("nan"))]
    _, data = build(tmp_path, trials, budget=None)
    json.dumps([f.spec for f in data.figures], allow_nan=False)  # NaN became null


def test_data_strings_are_escaped_for_plotly(tmp_path):
    # Every text cell a user can write (a checkpoint level outside the levels is refused on load).
    trials = [trial(HOSTILE, 10.0, 100.0, 0.02, model=HOSTILE, error=HOSTILE),
              trial("b", 12.0, 90.0, 0.03)]
    _, data = build(tmp_path, trials)
    text = json.dumps([f.spec for f in data.figures])
    assert HOSTILE not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    # Plain data (tables, title) stays raw here; the template's autoescape handles it.
    assert HOSTILE in data.title


def test_trials_table_compacts_ids_and_puts_long_errors_behind_a_toggle(tmp_path):
    trials = llama_sweep()
    _, data = build(tmp_path, trials, budget=40.0)
    table = data.trials_table
    trial_col = table.header.index("trial")
    assert "error" not in table.header  # each error is a full-width line under its trial
    assert len(table.row_notes) == len(table.rows)
    notes = {row[trial_col].title: note for row, note in zip(table.rows, table.row_notes)}
    shown = {row[trial_col].title: row[trial_col].text for row in table.rows}
    assert shown[trials[-1].trial_id] == "t005"  # the knobs have their own columns
    error = notes[trials[-1].trial_id]
    assert error.detail == CUDA_OOM and error.text.startswith("rank 0: CUDA out of memory.")
    assert len(error.text) <= ERROR_SUMMARY_CHARS and "\n" not in error.text
    assert notes[trials[0].trial_id] == Cell("")
    assert all(isinstance(c, Cell) for row in data.frontier_table.rows for c in row)


def test_trials_table_states_columns_shared_by_every_trial_once(tmp_path):
    _, data = build(tmp_path, llama_sweep(), budget=40.0)
    table = data.trials_table
    assert table.shared[:4] == [("model", "meta-llama/Llama-3.2-1B-Instruct"), ("seq_len", "128"),
                                ("beta", "0.1"), ("effective batch", "16")]
    assert all(value != "-" for _, value in table.shared)  # columns without a value: named apart
    assert "MFU" in table.empty and "MFU" not in table.header
    assert {"model", "seq_len", "beta", "effective batch"}.isdisjoint(table.header)
    assert {"micro_batch", "checkpoint", "grad_acc"} <= set(table.header)  # these vary
    assert all(len(row) == len(table.header) for row in table.rows)
    assert data.frontier_table.shared == []  # frontier.md's shape, every column kept


def test_compact_trial_ids_fall_back_to_full_ids_when_prefixes_clash():
    assert compact_trial_ids(["t000_mb1_none", "t001_mb2_none"]) == {
        "t000_mb1_none": "t000", "t001_mb2_none": "t001"}
    ids = ["trial_000_abc", "trial_001_abc", "_x"]
    assert compact_trial_ids(ids) == {i: i for i in ids}


def test_error_cell_keeps_short_errors_and_folds_long_or_multiline_ones():
    assert error_cell("worker died") == Cell("worker died")
    assert error_cell("") == Cell("")
    assert error_cell("CUDA out of memory\ntraceback") == Cell("CUDA out of memory",
                                                                 detail="CUDA out of memory\ntraceback")
    assert error_cell("x" * ERROR_SUMMARY_CHARS) == Cell("x" * ERROR_SUMMARY_CHARS)
    long = error_cell("x" * 200, max_chars=80)
    assert long.text == "x" * 79 + "\u2026" and long.detail == "x" * 200


def test_all_failed_report_names_the_failures_and_draws_no_plot(tmp_path):
    _, data = build(tmp_path, all_oom_sweep() + [trial("t009", status="error", error="worker died")],
                    budget=None)
    assert data.figures == []  # no empty scatter on default axes, no stray subplot
    assert data.plots_note.startswith("No trial completed, so there is nothing to plot")
    assert data.failures == [
        "3 oom: t000, t001, t002. First error: "
        + CUDA_OOM.splitlines()[0][:ERROR_SUMMARY_CHARS - 1] + "\u2026",
        "1 error: t009. First error: worker died"]


def test_all_failed_report_keeps_the_per_step_curves_of_failed_trials(tmp_path):
    trials = [trial("d1", 9.0, 80.0, 3.0, status="diverged"), trial("o1", status="oom", error=CUDA_OOM)]
    (tmp_path / "s").mkdir()
    write_steps(tmp_path / "s", steps_for("d1", 4, 9.0))
    _, data = build(tmp_path, trials, steps=load_steps(tmp_path / "s"))
    assert [f.dom_id for f in data.figures] == ["plot-loss", "plot-grad-norm", "plot-logratio-std",
                                                "plot-reward-accuracy", "plot-step-time", "plot-memory-steps"]
    assert data.plots_note.startswith("No trial completed, so the memory and step-time plots are left out")


def test_normal_report_still_lists_its_failures(tmp_path):
    _, data = build(tmp_path, llama_sweep(), budget=40.0)
    assert data.plots_note == ""
    assert [f.split(":")[0] for f in data.failures] == ["1 oom"]


def test_flatten():
    assert flatten({"a": {"b": 1, "c": [1, 2]}, "d": [{"e": None}]}) == [
        ("a.b", "1"), ("a.c", "1, 2"), ("d[0].e", "")]


def _measured(trial_id, mem, predicted, device, **kw):
    return dataclasses.replace(trial(trial_id, mem=mem, time_ms=100.0, std=0.1, **kw), predicted_peak_gb=predicted,
                               measured_by=trial_id, device=device)


def test_on_a_cpu_sweep_the_model_is_not_compared_with_the_process_rss(tmp_path):
    # CPU RSS (the interpreter, torch, the data) far above the tensors the model predicts: -52%.
    rows = [_measured("t000", 0.50, 0.24, "cpu"), _measured("t001", 0.60, 0.29, "cpu", mb=2)]
    _, data = build(tmp_path, rows, budget=100.0)
    said = dict(data.summary)["memory model"]
    assert "%" not in said and said.startswith("2 CPU trial(s) not compared: the model predicts GPU memory")
    assert "RSS" in said
    # An older results.csv without the device column: environment.json's machine had no GPU.
    old = [dataclasses.replace(r, device="") for r in rows]
    _, data = build(tmp_path / "old", old, budget=100.0, env={"gpu_count": 0, "gpus": []})
    assert dict(data.summary)["memory model"].startswith("2 CPU trial(s) not compared")


def test_gpu_rows_are_compared_and_cpu_rows_beside_them_named(tmp_path):
    rows = [_measured("t000", 10.0, 11.0, "cuda:0"), _measured("t001", 40.0, 38.0, "cuda:0", mb=4),
            _measured("t002", 0.5, 0.24, "cpu", mb=2)]
    _, data = build(tmp_path, rows, budget=100.0, env={"gpu_count": 1, "gpus": [{"name": "H200"}]})
    said = dict(data.summary)["memory model"]
    assert said.startswith("predicted vs measured peak over 2 measured trial(s): median error +2.5%, largest +10.0%")
    assert said.endswith("; 1 CPU trial(s) not compared: the model predicts GPU memory, a CPU trial measures "
                         "the process's RSS (Python, libraries, every buffer)")


def test_the_report_shows_predicted_against_measured_and_the_model_error(tmp_path):
    import dataclasses

    rows = [dataclasses.replace(trial("t000", mem=10.0, time_ms=100.0, std=0.1), predicted_peak_gb=11.0,
                                measured_by="t000"),
            dataclasses.replace(trial("t001", mem=20.0, time_ms=90.0, std=0.1, beta=0.2), predicted_peak_gb=19.0,
                                measured_by="t000"),  # a shared row: not a measurement of the model
            dataclasses.replace(trial("t002", mem=40.0, time_ms=80.0, std=0.1, mb=4), predicted_peak_gb=38.0,
                                measured_by="t002"),
            dataclasses.replace(trial("t003", status="pruned", mb=8, error="pruned: needs at least ..."),
                                predicted_peak_gb=80.0)]
    _, data = build(tmp_path, rows, budget=100.0)
    summary = dict(data.summary)
    # +10% (t000) and -5% (t002): the median of the two and the largest by size.
    assert summary["memory model"].startswith("predicted vs measured peak over 2 measured trial(s): "
                                              "median error +2.5%, largest +10.0%")
    header = list(data.trials_table.header)
    by_trial = {r[0].title: r for r in data.trials_table.rows}
    assert by_trial["t000"][header.index("predicted peak (GB)")].text == "11.00"
    assert by_trial["t001"][header.index("measured by")].text == "t000"
    assert by_trial["t000"][header.index("measured by")].text == "-"
    assert by_trial["t003"][header.index("status")].text == "pruned"


def test_thirty_six_curves_have_thirty_six_colours_and_ten_keep_plotly_s(tmp_path):
    import pandas as pd

    from dpo_sweep.report.curves import PLOTLY_COLOURS, colours, step_curves

    assert colours(10) == list(PLOTLY_COLOURS) and len(set(colours(36))) == 36
    ids = [f"t{i:03d}" for i in range(36)]
    analysed = frame(tmp_path, [trial(t, 10.0 + i, 100.0 + i, 0.02) for i, t in enumerate(ids)])
    steps = pd.DataFrame([{"trial_id": t, "step": s, "loss": 0.7 - 0.01 * s + 0.001 * i}
                          for i, t in enumerate(ids) for s in range(3)])
    spec = step_curves(steps, analysed, "loss", "loss", "loss")
    lines = {t["line"]["color"] for t in spec["data"]}
    assert len(spec["data"]) == 36 and len(lines) == 36
    assert all(t["marker"]["color"] == t["line"]["color"] for t in spec["data"])
