"""What the report shows of what was swept and where each number came from: swept train fields and
the stability verdict as columns, measured / extrapolated / shared / pruned marks, a diverging row
never drawn as a best one, the recommended point marked, axes that fit the points."""
from __future__ import annotations

from dataclasses import replace

import pytest
from sweep_frames import trial, write_dir

from dpo_sweep.analysis.pareto import analyse_frontier, objectives_from_spec
from dpo_sweep.analysis.recommend import recommend
from dpo_sweep.analysis.results import load_results
from dpo_sweep.cli import main
from dpo_sweep.commands.report import analyse_dir
from dpo_sweep.report.data import build_report_data

OBJS = objectives_from_spec(None)


def lr_sweep() -> list:
    """Two lrs of one configuration: the faster lr 2e-05 diverges; a pruned and an OOM row besides."""
    shared = dict(measured_by="a", step_time_source="extrapolated", stability_from="a-learning")
    return [
        replace(trial("a", 9.0, 100.0, 0.02, seed=0), extra={"seed": 0, "lr": 5e-6}, stability="stable",
                measured_by="a", step_time_source="measured", stability_from="a"),
        replace(trial("b", 10.0, 80.0, 0.02, seed=0), extra={"seed": 0, "lr": 2e-5}, stability="diverging",
                **shared),
        replace(trial("c", status="pruned", mb=8, seed=0, error="pruned: needs 90 GB"),
                extra={"seed": 0, "lr": 5e-6}, predicted_peak_gb=90.0),
        replace(trial("d", 35.0, status="oom", mb=4, seed=0, error="CUDA out of memory"),
                extra={"seed": 0, "lr": 5e-6}),
    ]


def build(tmp_path, rows, budget=150.0):
    analysed = analyse_frontier(load_results(write_dir(tmp_path / "r", rows)), OBJS)
    rec = recommend(analysed, budget)
    return analysed, rec, build_report_data(analysed, rec, OBJS)


def column(table, name):
    i = table.header.index(name)
    return {r[0].title or r[0].text: r[i].text for r in table.rows}


def test_swept_fields_and_the_verdict_are_columns_of_both_tables(tmp_path):
    _, rec, data = build(tmp_path, lr_sweep())
    assert data.frontier_table.header[4:6] == ("seed", "lr")  # after beta
    assert "stability" in data.frontier_table.header and "stability" in data.trials_table.header
    assert column(data.trials_table, "lr") == {"a": "5e-06", "b": "2e-05", "c": "5e-06", "d": "5e-06"}
    assert column(data.trials_table, "stability")["b"] == "diverging"
    assert "lr 5e-06" in data.recommendation_headline
    assert rec.config["lr"] == 5e-6  # recommendation.json's config carries the swept field


def test_a_diverging_row_is_never_the_best_row(tmp_path):
    analysed, rec, data = build(tmp_path, lr_sweep())
    # The faster one, diverging: never on the frontier, in the tables, the plot and the reason alike
    assert not bool(analysed.set_index("trial_id").loc["b", "on_frontier"])
    assert rec.trial_id == "a"
    classes = dict(zip([r[0].text for r in data.trials_table.rows], data.trials_table.row_classes))
    assert "verdict-diverging" in classes["b"] and "frontier" not in classes["b"].split()
    scatter = {t["name"]: t for t in data.figures[0].spec["data"]}
    front = next(t for n, t in scatter.items() if n.startswith("Pareto frontier"))
    assert front["x"] == [9.0] and front["y"] == [10_000.0]  # a only
    diverging = scatter["stability: diverging (its loss std is no stability figure; never on the frontier)"]
    assert diverging["y"] == [12_500.0]
    assert "coloraxis" not in diverging["marker"]  # its loss std is not on the colour scale
    assert scatter["recommended (a)"]["marker"]["symbol"] == "circle-open-dot"


def test_marks_for_measured_extrapolated_shared_and_pruned(tmp_path):
    _, _, data = build(tmp_path, lr_sweep())
    assert column(data.trials_table, "time from") == {"a": "measured", "b": "extrapolated", "c": "-", "d": "-"}
    assert column(data.trials_table, "measured by") == {"a": "-", "b": "a", "c": "predicted", "d": "-"}
    assert column(data.trials_table, "stability from") == {"a": "-", "b": "a learning", "c": "-", "d": "-"}
    assert column(data.trials_table, "step time (ms)")["b"] == "\u224880.0"  # extrapolated
    frontier = {r[0].text: r for r in data.frontier_table.rows}
    memory = data.frontier_table.header.index("peak memory (GB)")
    assert frontier["8"][memory].text == "pruned"  # the memory column, not the loss std's


def test_pruned_at_its_predicted_peak_oom_at_its_measured_one_and_the_axis_fits(tmp_path):
    _, _, data = build(tmp_path, lr_sweep())
    spec = data.figures[0].spec
    scatter = {t["name"]: t for t in spec["data"]}
    assert scatter["pruned (never ran; at its predicted peak)"]["x"] == [90.0]
    assert scatter["OOM (no throughput; at its measured peak, else the budget)"]["x"] == [35.0]
    low, high = spec["layout"]["xaxis"]["range"]
    assert low <= 9.0 and 90.0 <= high < 150.0  # the 150 GB budget is named, not stretched to
    assert any("right of every point" in a["text"] for a in spec["layout"]["annotations"])
    assert spec["layout"]["yaxis"]["tickformat"] == ",.0f"  # 12,500, not 12.5k
    assert scatter["OOM (no throughput; at its measured peak, else the budget)"]["y"] == [0]  # the strip's row
    hover = scatter["recommended (a)"]["text"][0]
    assert "lr 5e-06" in hover and "step time: 100.0 ms (measured)" in hover and "stability: stable" in hover


def test_console_and_frontier_md_name_the_swept_values(tmp_path, capsys):
    out = write_dir(tmp_path / "r", lr_sweep())
    assert main(["recommend", str(out), "--memory-budget-gb", "150"]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith("beta=0.1 seed=0 lr=5e-06")
    analyse_dir(out, memory_budget_gb=150.0)
    text = (out / "frontier.md").read_text()
    assert "| micro_batch | checkpoint | grad_acc | beta | seed | lr | peak memory (GB) |" in text
    assert "| stability | on frontier |" in text and "| diverging | no |" in text


def test_one_throughput_gets_a_readable_axis_and_the_usable_line_its_label_room(tmp_path):
    # The 8B seed table: one ok row at 79.6 GB, an 80 GB budget (76 GB usable), pruned rows far right.
    rows = [trial("a", 79.6, 50_000.0, 0.02, tps=10_379.0),
            replace(trial("p", status="pruned", mb=8), predicted_peak_gb=126.0)]
    _, _, data = build(tmp_path, rows, budget=80.0)
    layout = data.figures[0].spec["layout"]
    assert layout["yaxis"]["range"] == [pytest.approx(9341.1), pytest.approx(11417.0)]  # +-10%, not 10,379 x3
    low, high = layout["xaxis"]["range"]
    assert low < 76.0 - 5 and high >= 126.0  # room left of the usable line for its label
