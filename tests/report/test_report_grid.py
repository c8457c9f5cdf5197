"""The report's micro_batch x checkpoint-level grid (report/heatmap.py): each cell's lightest peak
and highest tokens/s among its completed trials, one row of panels per adapter, and a cell without a
completed trial saying how its trials ended."""
from __future__ import annotations

import dataclasses

import pytest
from sweep_frames import frame, sweep_trials, trial

from dpo_sweep.analysis.pareto import analyse_frontier, objectives_from_spec
from dpo_sweep.analysis.recommend import recommend
from dpo_sweep.report import heatmap
from dpo_sweep.report.data import build_report_data

OBJS = objectives_from_spec(None)


def _grid(fig, panel: int) -> dict[tuple[str, str], str]:
    """(micro_batch, level) -> the cell's text in panel ``panel`` (1: the first axes)."""
    axis = "x" if panel == 1 else f"x{panel}"
    return {(x, y): text for t in fig["data"] if t["xaxis"] == axis
            for x, y, text in zip(t["x"], t["y"], t["text"])}


def test_each_cell_holds_its_lightest_peak_and_fastest_rate_and_a_failed_cell_its_ending(tmp_path):
    analysed = analyse_frontier(frame(tmp_path, sweep_trials()), OBJS)
    fig = heatmap.level_grid(analysed)
    memory, rate = _grid(fig, 1), _grid(fig, 2)
    # mb 2 / none: ga 1 and ga 2 both peak at 10.0 GB; tokens/s 2*1*256*1000/100 = 5,120 both
    assert memory[("2", "none")] == "10.00" and rate[("2", "none")] == "5,120"
    # mb 8 / none and L1 ran out of memory (4 + 24 and 4 + 18 GB > 27): the cell says so, in both panels
    assert memory[("8", "none")] == rate[("8", "none")] == "OOM"
    assert memory[("8", "L2")] == "17.20"
    # mb 4 / L1: its two ok rows (13.0 GB) and a diverged one (9.0 GB): the completed ones only
    assert memory[("4", "L1")] == "13.00"
    # an error row at L3 alone in its cell
    assert memory[("4", "L3")] == "error"
    layout = fig["layout"]
    assert layout["yaxis"]["categoryarray"] == ["none", "L1", "L2", "L3"]  # weakest first: at the bottom
    assert layout["xaxis"]["categoryarray"] == ["2", "4", "8"]
    assert [a["text"] for a in layout["annotations"]] == ["peak memory (GB), adapter full", "tokens/s, adapter full"]


def test_one_row_of_panels_per_adapter_and_the_grid_is_in_the_report(tmp_path):
    rows = []
    for i, (adapter, mb, mem) in enumerate([("full", 1, 20.0), ("full", 2, 30.0), ("lora", 1, 8.0), ("lora", 2, 12.0)]):
        row = trial(f"t{i}", mem, 100.0 / mb, 0.02, mb=mb)
        rows.append(dataclasses.replace(row, adapter=adapter))
    analysed = analyse_frontier(frame(tmp_path, rows), OBJS)
    assert heatmap.adapters_of(analysed) == ["full", "lora"]
    fig = heatmap.level_grid(analysed)
    assert [a["text"] for a in fig["layout"]["annotations"]] == [
        "peak memory (GB), adapter full", "tokens/s, adapter full",
        "peak memory (GB), adapter lora", "tokens/s, adapter lora"]
    assert _grid(fig, 3) == {("1", "none"): "8.00", ("2", "none"): "12.00"}
    assert _grid(fig, 1) == {("1", "none"): "20.00", ("2", "none"): "30.00"}
    data = build_report_data(analysed, recommend(analysed, 40.0), OBJS, None, None)
    assert "plot-grid" in [f.dom_id for f in data.figures]


def test_no_grid_when_neither_micro_batch_nor_the_level_varies(tmp_path):
    rows = [trial("t0", 5.0, 100.0, 0.02, beta=0.1), trial("t1", 5.0, 100.0, 0.02, beta=0.3)]
    analysed = analyse_frontier(frame(tmp_path, rows), OBJS)
    assert not heatmap.wanted(analysed)
    data = build_report_data(analysed, recommend(analysed, 40.0), OBJS, None, None)
    assert "plot-grid" not in [f.dom_id for f in data.figures]


def _luminance(hex_colour: str) -> float:
    r, g, b = (int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def test_darker_is_better_in_both_panels_as_the_caption_says(tmp_path):
    # plotly maps a colour scale's first colour to the panel's lowest value: memory's darkest end
    # is its lowest peak, tokens/s's its highest rate. (Blues reversed and Greens drew the opposite.)
    analysed = analyse_frontier(frame(tmp_path, sweep_trials()), OBJS)
    fig = heatmap.level_grid(analysed)
    coloured = {t["xaxis"]: t["marker"] for t in fig["data"] if isinstance(t["marker"]["color"], list)}
    memory, rate = coloured["x"], coloured["x2"]
    assert "reversescale" not in memory and "reversescale" not in rate
    low, high = (_luminance(c) for _, c in memory["colorscale"])
    assert low < high  # less memory: darker
    low, high = (_luminance(c) for _, c in rate["colorscale"])
    assert high < low  # more tokens/s: darker
    data = build_report_data(analysed, recommend(analysed, 40.0), OBJS, None, None)
    grid = next(f for f in data.figures if f.dom_id == "plot-grid")
    assert "darker is better: less memory, more tokens/s" in grid.caption
