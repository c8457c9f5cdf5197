"""The peak memory vs throughput scatter: every swept dimension encoded, failures in a strip of their own.

* Throughput (tokens/s, with p10-p90 noise bars) against peak memory, colour = loss std. A
  diverging trial's loss std is no stability figure (a collapsed loss has the sweep's lowest): it
  is drawn in a fixed colour of its own, outside the colour scale, and never on the frontier.
* Every swept dimension shows: the marker's shape is the checkpoint level (or, when the level
  does not vary, the first other swept dimension), its size the micro-batch, and one panel
  (facet) per combination of the other swept set-up dimensions (adapter, optimizer, trainer, any
  swept train field), up to :data:`MAX_FACETS`; what is left (beta, grad_acc, a dimension past the
  facet limit) is in each point's hover and in the per-dimension panels.
* OOM and pruned trials never sit at a throughput they did not have: each panel has a strip
  under its axes, labelled, where they sit at their measured (OOM) or predicted (pruned) peak.
* The recommended trial has a marker no other trial uses (a large green ring and an arrow).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from dpo_sweep.analysis import tables
from dpo_sweep.core.levels import Level
from dpo_sweep.core.status import Status
from dpo_sweep.report.figures import (_axis_range, _flat_range, _hover, _noise_bars, _tick_format, esc, legend_below,
                                      level_order, num, nums, oom_x_gb)

OTHER_SYMBOLS = ("circle", "square", "diamond", "triangle-up", "hexagon", "pentagon", "triangle-down",
                 "hourglass", "cross", "bowtie")
#: The recommended trial's marker: no value of any dimension gets it.
RECOMMENDED_SYMBOL = "circle-open-dot"
DIVERGING_COLOUR = "#8a1c1c"
#: Points without a loss std (a sweep that measures one step, or no loss_std objective).
NO_STD_COLOUR = "#4c78a8"
#: Most panels the scatter splits into; past it, a dimension is named in the hover only.
MAX_FACETS = 12
#: Most values a non-checkpoint dimension may have to take the marker's shape.
MAX_SYMBOL_VALUES = len(OTHER_SYMBOLS)
_SIZES = (9, 12, 15, 18, 21)
_STRIP = {Status.OOM: 0, Status.PRUNED: 1}


@dataclass(frozen=True)
class Encoding:
    """Which swept dimension goes to which visual channel."""

    symbol: str
    """The column whose values give the marker's shape."""
    size: str | None
    """The column whose values give the marker's size (``micro_batch`` when it varies)."""
    facets: tuple[str, ...]
    """Columns whose value combinations are one panel each."""
    hover_only: tuple[str, ...]
    """Swept columns shown only in the hover (and the per-dimension panels)."""


def _varies(df: pd.DataFrame, column: str) -> bool:
    return column in df and df[column].astype(str).nunique() > 1


def encoding(analysed: pd.DataFrame) -> Encoding:
    """The channels for ``analysed``'s swept dimensions (see the module doc)."""
    extra = [c for c in tables.swept_columns(analysed, levers=True) if _varies(analysed, c)]
    symbol = "checkpoint_level"
    if not _varies(analysed, symbol):
        fits = [c for c in extra if analysed[c].astype(str).nunique() <= MAX_SYMBOL_VALUES]
        if fits:
            symbol = fits[0]
            extra.remove(symbol)
    facets, count = [], 1
    for c in extra:
        n = analysed[c].astype(str).nunique()
        if count * n <= MAX_FACETS:
            facets.append(c)
            count *= n
    rest = [c for c in extra if c not in facets]
    rest += [c for c in ("grad_acc", "beta") if _varies(analysed, c)]
    return Encoding(symbol, "micro_batch" if _varies(analysed, "micro_batch") else None, tuple(facets), tuple(rest))


def _label(column: str) -> str:
    return {"checkpoint_level": "checkpoint", "micro_batch": "micro_batch"}.get(column, column)


def _values(df: pd.DataFrame, column: str) -> list[str]:
    """A column's values as labels, in order: checkpoint levels weakest to strongest, numbers by value."""
    if column == "checkpoint_level":
        return level_order(df[column])
    labels = {tables.fmt_setting(v) for v in df[column]}
    try:
        return sorted(labels, key=lambda s: (s == "-", float(s) if s != "-" else 0.0))
    except ValueError:
        return sorted(labels)


def _symbols(df: pd.DataFrame, column: str) -> dict[str, str]:
    values = _values(df, column)
    if column == "checkpoint_level":
        # Checkpoint levels keep their own marker (Level.symbol) in every report.
        others = [v for v in values if Level.of(v) is None]
        spare = [s for s in OTHER_SYMBOLS if s not in {lv.symbol for lv in Level}]
        return {v: lv.symbol if (lv := Level.of(v)) else spare[others.index(v) % len(spare)] for v in values}
    return {v: OTHER_SYMBOLS[i % len(OTHER_SYMBOLS)] for i, v in enumerate(values)}


def _sizes(df: pd.DataFrame, column: str | None) -> dict[str, int]:
    if column is None:
        return {}
    values = _values(df, column)
    return {v: _SIZES[min(i, len(_SIZES) - 1)] for i, v in enumerate(values)}


def _facet_keys(df: pd.DataFrame, columns: tuple[str, ...]) -> list[tuple[str, ...]]:
    if not columns:
        return [()]
    present = {tuple(tables.fmt_setting(r[c]) for c in columns) for _, r in df.iterrows()}
    orders = [_values(df, c) for c in columns]
    return sorted(present, key=lambda key: [orders[i].index(v) for i, v in enumerate(key)])


def _facet_of(df: pd.DataFrame, columns: tuple[str, ...], key: tuple[str, ...]) -> pd.DataFrame:
    if not columns:
        return df
    mask = np.ones(len(df), dtype=bool)
    for c, v in zip(columns, key):
        mask &= np.array([tables.fmt_setting(x) == v for x in df[c]], dtype=bool)
    return df[mask]


def _is_diverging(df: pd.DataFrame) -> pd.Series:
    if "stability" not in df:
        return pd.Series(False, index=df.index)
    return df["stability"].astype(object) == "diverging"


def _suffix(k: int) -> str:
    return "" if k == 1 else str(k)


def memory_time_scatter(analysed: pd.DataFrame, budget_gb: float | None, usable_gb: float | None,
                        objective_names: list[str], recommended: str | None = None) -> dict[str, Any]:
    """The scatter's plotly spec (see the module doc)."""
    enc = encoding(analysed)
    swept = tables.swept_columns(analysed, levers=True)
    measured = analysed[analysed["peak_mem_gb"].notna() & analysed["tokens_per_s"].notna()]
    ok = measured[measured["status"] == Status.OK]
    diverging = _is_diverging(ok)
    learning = ok[~diverging]
    std = learning["loss_std"].astype(float)
    std = std[np.isfinite(std)]
    oom = analysed[analysed["status"] == Status.OOM]
    pruned = analysed[(analysed["status"] == Status.PRUNED)
                      & (analysed["predicted_peak_gb"].notna() if "predicted_peak_gb" in analysed else False)]
    x_oom = num(oom_x_gb(analysed, budget_gb))
    has_strip = bool(len(oom) or len(pruned))
    symbols, sizes = _symbols(analysed, enc.symbol), _sizes(analysed, enc.size)
    keys = _facet_keys(analysed, enc.facets)
    n = len(keys)
    cols = min(n, 3)
    rows_n = math.ceil(n / cols)
    gap_x, gap_y = 0.06, 0.1
    width = (1.0 - gap_x * (cols - 1)) / cols
    cell = (1.0 - gap_y * (rows_n - 1)) / rows_n
    y_range = _y_range(ok)
    traces: list[dict[str, Any]] = []
    layout: dict[str, Any] = {
        "title": {"text": "Peak memory vs throughput"}, "showlegend": True,
        "legend": legend_below(170 + 380 * rows_n, 80 if n > 1 else 60, 60),
        "margin": {"t": 80 if n > 1 else 60, "r": 40, "b": 60}, "height": 170 + 380 * rows_n,
        "coloraxis": {"colorscale": "Viridis", "cmin": num(std.min()) if len(std) else None,
                      "cmax": num(std.max()) if len(std) else None,
                      "colorbar": {"title": {"text": "loss std"}, "x": 1.02, "len": 0.6 if rows_n == 1 else 0.4}},
        "annotations": [], "shapes": [],
    }
    shown: set[str] = set()

    def legend_once(name: str) -> bool:
        first = name not in shown
        shown.add(name)
        return first

    for i, key in enumerate(keys):
        k = i + 1
        row_i, col_i = divmod(i, cols)
        x0 = col_i * (width + gap_x)
        top = 1.0 - row_i * (cell + gap_y)
        bottom = top - cell
        strip_h = 0.16 * cell if has_strip else 0.0
        # The panel's axes, and under them the strip's: an x axis of its own that follows the
        # panel's (matches), so the memory ticks are drawn once, under the strip.
        xa, ya, sx, sy = f"x{_suffix(k)}", f"y{_suffix(k)}", f"x{n + k}", f"y{n + k}"
        x_title = {"text": "peak memory (GB)" if row_i == rows_n - 1 or i + cols >= n else ""}
        layout[f"xaxis{_suffix(k)}"] = {
            "domain": [x0, x0 + width], "anchor": ya, "zeroline": False,
            **({"matches": "x"} if k > 1 else {}),
            **({"showticklabels": False} if has_strip else {"title": x_title})}
        layout[f"yaxis{_suffix(k)}"] = {
            "domain": [bottom + strip_h + (0.02 if has_strip else 0.0), top], "anchor": xa, "zeroline": False,
            "tickformat": _tick_format(ok["tokens_per_s"]), "range": y_range,
            "title": {"text": "tokens/s (median; bars widened p10-p90)" if col_i == 0 else ""}}
        if has_strip:
            layout[f"xaxis{n + k}"] = {"domain": [x0, x0 + width], "anchor": sy, "matches": "x", "zeroline": False,
                                      "title": x_title}
            traces.append({"type": "scatter", "mode": "markers", "x": [None], "y": [None], "xaxis": sx, "yaxis": sy,
                           "showlegend": False, "hoverinfo": "skip", "name": ""})  # plotly draws no axes of an unused subplot
            layout[f"yaxis{n + k}"] = {
                "domain": [bottom, bottom + strip_h], "anchor": sx, "range": [-0.6, 1.6], "fixedrange": True,
                "tickvals": [0, 1], "ticktext": ["OOM", "pruned"] if col_i == 0 else ["", ""],
                "showgrid": False, "zeroline": False}
        if enc.facets:
            title = ", ".join(f"{_label(c)} {esc(v)}" for c, v in zip(enc.facets, key))
            layout["annotations"].append({"text": f"<b>{title}</b>", "x": x0 + width / 2, "y": top, "xref": "paper",
                                          "yref": "paper", "xanchor": "center", "yanchor": "bottom",
                                          "showarrow": False, "font": {"size": 12}})
        axes = {"xaxis": xa, "yaxis": ya}
        part = _facet_of(learning, enc.facets, key)
        for value, symbol in symbols.items():
            rows = part[[tables.fmt_setting(v) == value for v in part[enc.symbol]]] if len(part) else part
            if not len(rows):
                continue
            has_std = rows["loss_std"].astype(float).map(math.isfinite)
            # plotly draws no marker whose colour-axis value is null: rows without a loss std get a
            # colour of their own, in a trace of their own.
            for coloured, group in ((True, rows[has_std]), (False, rows[~has_std])):
                if not len(group):
                    continue
                size = [sizes.get(tables.fmt_setting(v), 12) for v in group[enc.size]] if enc.size else 12
                colour = ({"color": nums(group["loss_std"]), "coloraxis": "coloraxis"} if coloured
                          else {"color": NO_STD_COLOUR})
                traces.append({
                    "type": "scatter", "mode": "markers", "name": f"{_label(enc.symbol)} {esc(value)}",
                    "showlegend": False, "legendgroup": f"{enc.symbol} {esc(value)}", **axes,
                    "x": nums(group["peak_mem_gb"]), "y": nums(group["tokens_per_s"]), "error_y": _noise_bars(group),
                    "text": [_hover(r, swept) for _, r in group.iterrows()], "hoverinfo": "text",
                    "marker": {"symbol": symbol, "size": size, **colour, "line": {"width": 1, "color": "#333"}},
                })
        front = part[part["on_frontier"]].sort_values(["peak_mem_gb", "tokens_per_s"])
        if len(front):
            name = "Pareto frontier (" + ", ".join(esc(o) for o in objective_names) + ")"
            traces.append({
                "type": "scatter", "mode": "lines+markers", "name": name, "legendgroup": "frontier",
                "showlegend": legend_once(name), **axes,
                "x": nums(front["peak_mem_gb"]), "y": nums(front["tokens_per_s"]), "hoverinfo": "skip",
                "line": {"color": "#d62728", "width": 1.5, "dash": "dot"},
                "marker": {"symbol": "circle-open", "size": 22, "color": "#d62728", "line": {"width": 2}},
            })
        bad = _facet_of(ok[diverging], enc.facets, key)
        if len(bad):
            name = "stability: diverging (its loss std is no stability figure; never on the frontier)"
            traces.append(_points(bad, name, "diverging", legend_once(name), axes, swept, {
                "symbol": [f"{symbols.get(tables.fmt_setting(v), 'circle')}-open" for v in bad[enc.symbol]],
                "size": 13, "color": DIVERGING_COLOUR, "line": {"width": 2.5, "color": DIVERGING_COLOUR}}))
        failed = _facet_of(measured[measured["status"] != Status.OK], enc.facets, key)
        if len(failed):
            name = "diverged / error (measured before it stopped)"
            traces.append(_points(failed, name, "failed", legend_once(name), axes, swept,
                                  {"symbol": "circle-open", "size": 11, "color": "#7f7f7f", "line": {"width": 2}}))
        win = part[part["trial_id"].astype(str) == str(recommended)] if recommended is not None else part[:0]
        if len(win):
            traces.append({
                "type": "scatter", "mode": "markers", "name": f"recommended ({esc(win['trial_id'].iloc[0])})",
                "legendgroup": "recommended", **axes,
                "x": nums(win["peak_mem_gb"]), "y": nums(win["tokens_per_s"]),
                "text": [_hover(r, swept) for _, r in win.iterrows()], "hoverinfo": "text",
                "marker": {"symbol": RECOMMENDED_SYMBOL, "size": 30, "color": "#2ca02c", "line": {"width": 3}},
            })
            layout["annotations"].append({
                "x": num(win["peak_mem_gb"].iloc[0]), "y": num(win["tokens_per_s"].iloc[0]), "xref": xa, "yref": ya,
                "text": "<b>recommended</b>", "showarrow": True, "arrowhead": 2, "ax": 0, "ay": -38,
                "font": {"color": "#2ca02c", "size": 12}, "arrowcolor": "#2ca02c"})
        if has_strip:
            for status, rows, x, name, style in (
                    (Status.OOM, _facet_of(oom, enc.facets, key), None,
                     "OOM (no throughput; at its measured peak, else the budget)",
                     {"symbol": "x-thin-open", "size": 14, "color": "#000", "line": {"width": 3}}),
                    (Status.PRUNED, _facet_of(pruned, enc.facets, key), "predicted_peak_gb",
                     "pruned (never ran; at its predicted peak)",
                     {"symbol": "circle-open", "size": 13, "color": "#9467bd", "line": {"width": 2}})):
                if not len(rows):
                    continue
                xs = (nums(rows[x]) if x else [num(p) if num(p) is not None else x_oom for p in rows["peak_mem_gb"]])
                if any(v is None for v in xs):
                    continue
                traces.append({
                    "type": "scatter", "mode": "markers", "name": name, "legendgroup": status,
                    "showlegend": legend_once(name), "xaxis": sx, "yaxis": sy,
                    "x": xs, "y": [_STRIP[status]] * len(rows),
                    "text": [_hover(r, swept) for _, r in rows.iterrows()], "hoverinfo": "text", "marker": style,
                })
    drawn = {tables.fmt_setting(v) for v in ok[enc.symbol]}  # a key for each shape on the axes
    sized = {tables.fmt_setting(v) for v in ok[enc.size]} if enc.size else set()
    traces += _legend_keys(enc, {v: sym for v, sym in symbols.items() if v in drawn},
                           {v: px for v, px in sizes.items() if v in sized})
    _budget_lines(layout, traces, budget_gb, usable_gb, n)
    return {"data": traces, "layout": layout}


def _points(rows: pd.DataFrame, name: str, group: str, legend: bool, axes: dict[str, str], swept: list[str],
            marker: dict[str, Any]) -> dict[str, Any]:
    """A marker trace of ``rows`` at their peak and throughput, each with its hover text."""
    return {"type": "scatter", "mode": "markers", "name": name, "legendgroup": group, "showlegend": legend, **axes,
            "x": nums(rows["peak_mem_gb"]), "y": nums(rows["tokens_per_s"]),
            "text": [_hover(r, swept) for _, r in rows.iterrows()], "hoverinfo": "text", "marker": marker}


def _y_range(ok: pd.DataFrame) -> list[float | None] | None:
    """One throughput range for every panel (so panels compare at a glance), fitted to the points
    and their noise bars with a 5% margin; +-10% around throughputs that (nearly) coincide."""
    rates = ok["tokens_per_s"].astype(float)
    flat = _flat_range(rates)
    if flat:
        return flat["range"]
    values = pd.concat([rates, ok["throughput_low"].astype(float), ok["throughput_high"].astype(float)])
    values = values[np.isfinite(values)]
    if not len(values):
        return None
    low, high = float(values.min()), float(values.max())
    pad = 0.05 * (high - low)
    return [num(low - pad), num(high + pad)]


def _legend_keys(enc: Encoding, symbols: dict[str, str], sizes: dict[str, int]) -> list[dict[str, Any]]:
    """One grey legend entry per shape value (and per size, when size encodes micro_batch).

    The points are coloured by loss std through the shared colour axis, and plotly cannot colour a
    legend symbol from a colour-axis number (it logs "Invalid color specifier" and draws it black):
    so the points stay out of the legend and these empty traces stand for them; the shared legend
    group makes one click toggle a value's points."""
    keys = [{"type": "scatter", "mode": "markers", "name": f"{_label(enc.symbol)} {esc(v)}",
             "legendgroup": f"{enc.symbol} {esc(v)}", "x": [None], "y": [None], "hoverinfo": "skip",
             "marker": {"symbol": s, "size": 12, "color": "#999999", "line": {"width": 1, "color": "#333"}}}
            for v, s in symbols.items()]
    if enc.size:
        keys += [{"type": "scatter", "mode": "markers", "name": f"{_label(enc.size)} {esc(v)} (size)",
                  "legendgroup": f"size {esc(v)}", "x": [None], "y": [None], "hoverinfo": "skip",
                  "marker": {"symbol": "circle-open", "size": s, "color": "#666666", "line": {"width": 1.5}}}
                 for v, s in sizes.items()]
    return keys


def _budget_lines(layout: dict[str, Any], traces: list[dict[str, Any]], budget_gb: float | None,
                  usable_gb: float | None, n: int) -> None:
    """The x range fitted to the points, the budget and usable lines across every panel (or a note
    at the edge when the budget is far right of every point)."""
    xs = [x for t in traces for x in t.get("x", []) if x is not None]
    x_range = _axis_range(xs)
    # The budget's label goes right of its line, the usable limit's left of its, so they never overlap.
    for x, label, dash, side in ((budget_gb, "budget", "solid", "left"),
                                 (usable_gb, "minus safety margin", "dash", "right")):
        if x is None:
            continue
        if x_range is not None and x > x_range[1] * 1.25:  # far right of every point: say so at the edge
            if label == "budget":
                layout["annotations"].append({
                    "x": 1.0, "y": 1.0, "xref": "paper", "yref": "paper", "yanchor": "bottom", "xanchor": "right",
                    "showarrow": False, "font": {"size": 11}, "yshift": 22 if n > 1 else 0,
                    "text": f"budget {num(x)} GB (usable {num(usable_gb)} GB): right of every point \u2192"})
            continue
        if x_range is not None:
            room = 0.15 * (x_range[1] - x_range[0])  # for the label beside the line
            x_range = [min(x_range[0], num(x - room)), max(x_range[1], num(x + room))]
        for k in range(1, n + 1):
            layout["shapes"].append({"type": "line", "xref": f"x{_suffix(k)}", "yref": f"y{_suffix(k)} domain",
                                     "x0": num(x), "x1": num(x), "y0": 0, "y1": 1,
                                     "line": {"color": "#555", "width": 1.5, "dash": dash}})
        # At the foot of the first panel: its top holds the panel's title.
        layout["annotations"].append({"x": num(x), "y": 0.0, "xref": "x", "yref": "y domain", "yanchor": "bottom",
                                      "xanchor": side, "text": f" {label} {num(x)} GB ", "showarrow": False,
                                      "font": {"size": 10}, "bgcolor": "rgba(255,255,255,0.8)"})
    if x_range:
        layout["xaxis"]["range"] = x_range
