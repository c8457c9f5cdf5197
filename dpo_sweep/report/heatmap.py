"""The micro_batch x checkpoint-level grid: peak memory and tokens/s of each cell, one row of two
panels per adapter (full fine-tuning, LoRA, QLoRA), as a practitioner reads a grid of "what does
this cost" at a glance.

A cell holds the lightest peak and the highest tokens/s among its completed trials (the other
swept dimensions - grad_acc, beta, the train fields - vary inside it); a cell without a completed
trial says how its trials ended (``OOM``, ``pruned``, ...). The grid is drawn with square scatter
markers coloured by value, not plotly's heatmap trace: the report's vendored bundle is plotly's
basic one (scatter, bar, pie), and a scatter grid renders without WebGL.
"""
from __future__ import annotations

from typing import Any

import pandas as pd

from dpo_sweep.analysis import tables
from dpo_sweep.core.status import Status
from dpo_sweep.report.figures import axis_suffix, esc, level_order, num

#: (column, panel title, how a cell's completed trials become one value, colour scale from the
#: panel's lowest value to its highest). Darker is better in both (less memory, more tokens/s), and
#: the darkest stays light enough for the cell's number to be read on it.
METRICS: tuple[tuple[str, str, str, list[list[Any]]], ...] = (
    ("peak_mem_gb", "peak memory (GB)", "min", [[0.0, "#6baed6"], [1.0, "#f7fbff"]]),
    ("tokens_per_s", "tokens/s", "max", [[0.0, "#f7fcf5"], [1.0, "#74c476"]]),
)
CELL_PX = 44  # a cell's marker size; the figure grows with the grid
_GAP = 0.08


def _adapters(analysed: pd.DataFrame) -> pd.Series:
    """Each row's adapter, ``full`` where the column is empty or absent (rows of before it)."""
    if "adapter" not in analysed:
        return pd.Series("full", index=analysed.index)
    return analysed["adapter"].fillna("").astype(str).replace("", "full")


def adapters_of(analysed: pd.DataFrame) -> list[str]:
    """The adapters the sweep measured, in a stable order (``full`` first)."""
    return sorted(set(_adapters(analysed)), key=lambda a: (a != "full", a))


def cells(analysed: pd.DataFrame, adapter: str) -> pd.DataFrame:
    """One row per micro_batch x checkpoint_level of ``adapter``'s trials: ``peak_mem_gb`` (the
    lightest completed), ``tokens_per_s`` (the fastest completed), ``ended`` (how the cell's trials
    ended when none completed: their statuses, joined)."""
    rows = analysed[_adapters(analysed) == adapter]
    out = []
    for (mb, level), group in rows.groupby([rows["micro_batch"].astype(int), rows["checkpoint_level"].astype(str)]):
        ok = group[group["status"] == Status.OK]
        cell = {"micro_batch": int(mb), "checkpoint_level": level}
        for metric, _title, how, _scale in METRICS:
            cell[metric] = getattr(ok[metric].astype(float), how)() if len(ok) else float("nan")
        cell["ended"] = "" if len(ok) else " / ".join(sorted({_ending(s) for s in group["status"]}))
        out.append(cell)
    return pd.DataFrame(out, columns=["micro_batch", "checkpoint_level", *(m for m, *_ in METRICS), "ended"])


def _ending(status: object) -> str:
    return "OOM" if status == Status.OOM else str(status)


def wanted(analysed: pd.DataFrame) -> bool:
    """Whether the grid says more than the other plots: micro_batch or the level varies."""
    return analysed["micro_batch"].nunique() > 1 or analysed["checkpoint_level"].astype(str).nunique() > 1


def _label(metric: str, value: float) -> str:
    return tables.fmt_float(value, 2) if metric == "peak_mem_gb" else f"{value:,.0f}"


def level_grid(analysed: pd.DataFrame) -> dict[str, Any]:
    """The figure: per adapter (rows) peak memory and tokens/s (columns) over micro_batch (x) x
    checkpoint level (y, weakest at the bottom)."""
    adapters = adapters_of(analysed)
    mbs = [str(m) for m in sorted({int(m) for m in analysed["micro_batch"]})]
    levels = level_order(analysed["checkpoint_level"])
    n_rows = len(adapters)
    height = 110 + n_rows * max(160, CELL_PX * len(levels) + 90)
    band = (1.0 - _GAP * (n_rows - 1)) / n_rows
    layout: dict[str, Any] = {"title": {"text": "Each micro_batch x checkpoint level: peak memory and tokens/s"},
                              "height": height, "showlegend": False, "margin": {"t": 70, "b": 50},
                              "annotations": []}
    traces: list[dict[str, Any]] = []
    for r, adapter in enumerate(adapters):
        grid = cells(analysed, adapter)
        top = 1.0 - r * (band + _GAP)
        for c, (metric, title, _how, scale) in enumerate(METRICS):
            k = r * len(METRICS) + c + 1
            sfx = axis_suffix(k)
            layout[f"xaxis{sfx}"] = {"domain": [c * 0.54, c * 0.54 + 0.46], "anchor": f"y{sfx}", "type": "category",
                                     "categoryorder": "array", "categoryarray": mbs,
                                     "title": {"text": "micro_batch" if r == n_rows - 1 else ""}}
            layout[f"yaxis{sfx}"] = {"domain": [max(top - band, 0.0), top], "anchor": f"x{sfx}", "type": "category",
                                     "categoryorder": "array", "categoryarray": [esc(lv) for lv in levels],
                                     "title": {"text": "checkpoint" if c == 0 else ""}}
            layout["annotations"].append({"text": esc(f"{title}, adapter {adapter}"), "showarrow": False,
                                          "xref": f"x{sfx} domain", "yref": f"y{sfx} domain", "x": 0.5, "y": 1.0,
                                          "xanchor": "center", "yanchor": "bottom"})
            done, failed = grid[grid[metric].notna()], grid[grid[metric].isna()]
            if len(done):
                traces.append(_cells_trace(done, sfx, [_label(metric, v) for v in done[metric]],
                                           [f"{_label(metric, v)} {title}" for v in done[metric]], adapter,
                                           {"color": [num(v) for v in done[metric]], "colorscale": scale,
                                            "showscale": False},
                                           {"size": 11}))
            if len(failed):
                traces.append(_cells_trace(failed, sfx, list(failed["ended"]),
                                           [f"no completed trial ({e})" for e in failed["ended"]], adapter,
                                           {"color": "#eeeeee"}, {"size": 10, "color": "#555"}))
    return {"data": traces, "layout": layout}


def _cells_trace(cells_: pd.DataFrame, sfx: str, texts: list[str], hovers: list[str], adapter: str,
                 colour: dict[str, Any], font: dict[str, Any]) -> dict[str, Any]:
    """One panel's squares: a cell each, ``texts`` on them, ``hovers`` after the cell's name."""
    return {
        "type": "scatter", "mode": "markers+text", "showlegend": False, "xaxis": f"x{sfx}", "yaxis": f"y{sfx}",
        "x": [str(m) for m in cells_["micro_batch"]], "y": [esc(lv) for lv in cells_["checkpoint_level"]],
        "text": [esc(t) for t in texts], "textfont": font, "hoverinfo": "text",
        "hovertext": [esc(f"mb {m}, {lv}, {adapter}: {h}")
                      for m, lv, h in zip(cells_["micro_batch"], cells_["checkpoint_level"], hovers)],
        "marker": {"symbol": "square", "size": CELL_PX, **colour, "line": {"width": 1, "color": "#999"}},
    }
