"""Plotly figure specs as plain dicts (``{"data": [...], "layout": {...}}``), built from the frame.

Pure functions: no plotly import, no HTML. Every string that comes from the data is HTML-escaped
here because plotly renders trace names, hover text and titles as (a subset of) HTML; plotly turns
the entities back into the literal characters on screen. Numbers are rounded to 5 significant
digits and NaN becomes None (JSON null, a gap for plotly) so 100 trials stay small.

Only SVG trace types are used (scatter, not scattergl or parcoords): the report must render
without WebGL, e.g. in a headless browser or over remote desktop.
"""
from __future__ import annotations

import html
import math
from typing import Any

import numpy as np
import pandas as pd

from dpo_sweep.analysis import tables
from dpo_sweep.config import CHECKPOINT_LEVELS

_SYMBOLS = {"none": "circle", "L1": "square", "L2": "diamond", "L3": "triangle-up", "full": "star"}
_OTHER_SYMBOLS = ("hexagon", "pentagon", "cross", "triangle-down", "hourglass")
_STATUS_STYLE = {  # status group -> (legend name, colour, symbol)
    "frontier": ("ok, on frontier", "#d62728", "circle"),
    "ok": ("ok", "#1f77b4", "circle"),
    "oom": ("OOM (at its measured peak, else the budget)", "#000000", "x-thin-open"),
    "diverging": ("ok, stability diverging", "#8a1c1c", "x-thin-open"),
    "other": ("diverged / pruned / error", "#7f7f7f", "circle-open"),
}
SWEPT_DIMENSIONS: tuple[tuple[str, str], ...] = (
    ("micro_batch", "micro_batch"), ("checkpoint_level", "checkpoint"), ("grad_acc", "grad_acc"),
    ("beta", "beta"),
)
PLOT_CONFIG: dict[str, Any] = {"displaylogo": False, "responsive": True, "typesetMath": False}


def esc(value: Any) -> str:
    """A data string made safe for plotly's HTML-ish text rendering."""
    return html.escape(str(value), quote=True)


def num(value: Any) -> float | None:
    """A JSON-ready number: 5 significant digits, None for NaN/inf/missing."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(v):
        return None
    return float(f"{v:.5g}")


def nums(values: Any) -> list[float | None]:
    return [num(v) for v in values]


def checkpoint_symbol(level: str, others: list[str]) -> str:
    """Marker shape of a checkpoint level (unknown levels get the remaining shapes in turn)."""
    if level in _SYMBOLS:
        return _SYMBOLS[level]
    return _OTHER_SYMBOLS[others.index(level) % len(_OTHER_SYMBOLS)] if level in others else "circle"


def level_order(levels: Any) -> list[str]:
    """Checkpoint levels weakest to strongest; unknown ones after, alphabetically."""
    present = sorted({str(x) for x in levels})
    known = [lv for lv in CHECKPOINT_LEVELS if lv in present]
    return known + [lv for lv in present if lv not in CHECKPOINT_LEVELS]


def trial_label(row: pd.Series) -> str:
    """Short escaped label: ``t003 mb4 L1 ga2 β0.1 lr 2e-05`` (the id's index, its knobs and swept
    train fields; the full id is in the tables)."""
    def _i(v: Any) -> str:
        return str(int(v)) if num(v) is not None else "?"
    beta = f"{float(row['beta']):g}" if num(row["beta"]) is not None else "?"
    swept = "".join(f" {c} {tables.fmt_setting(row.get(c))}" for c in tables.swept_train_fields(row.index))
    return esc(f"{tables.short_id(str(row['trial_id']))} mb{_i(row['micro_batch'])} {row['checkpoint_level']} "
               f"ga{_i(row['grad_acc'])} \u03b2{beta}{swept}")


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _hover(row: pd.Series, swept: list[str] = ()) -> str:
    """A point's hover text: the trial, its swept values, each measurement and where it came from."""
    parts = [f"<b>{trial_label(row)}</b>", f"status: {esc(row['status'])}"
             + (f", stability: {esc(row['stability'])}" if _text(row.get("stability")) else "")]
    if swept:
        parts.append(esc(", ".join(f"{c} {tables.fmt_setting(row.get(c))}" for c in swept)))
    mem_by, time_from = _text(row.get("measured_by")), _text(row.get("step_time_source"))
    if num(row["peak_mem_gb"]) is not None:
        shared = f" (measured by {mem_by})" if mem_by and mem_by != row["trial_id"] else ""
        parts.append(f"peak memory: {num(row['peak_mem_gb'])} GB{esc(shared)}")
    elif num(row.get("predicted_peak_gb")) is not None:
        parts.append(f"predicted peak: {num(row['predicted_peak_gb'])} GB (the memory model; not measured)")
    if num(row["step_time_ms"]) is not None:
        parts.append(f"step time: {num(row['step_time_ms'])} ms" + (f" ({esc(time_from)})" if time_from else ""))
    if num(row["tokens_per_s"]) is not None:
        low, high = num(row.get("throughput_low")), num(row.get("throughput_high"))
        spread = f" (p10-p90: {low}-{high})" if low is not None and high is not None and low != high else ""
        parts.append(f"throughput: {num(row['tokens_per_s'])} tokens/s{spread}")
    if num(row["loss_std"]) is not None:
        parts.append(f"loss std: {num(row['loss_std'])}")
    if row.get("error"):
        parts.append("error: " + esc(str(row["error"])[:200]))
    return "<br>".join(parts)


def oom_x_gb(analysed: pd.DataFrame, budget_gb: float | None) -> float | None:
    """Where OOM trials are drawn: the budget, else just right of the largest measured peak."""
    if budget_gb is not None:
        return float(budget_gb)
    peaks = analysed["peak_mem_gb"].astype(float)
    peaks = peaks[np.isfinite(peaks)]
    return float(peaks.max() * 1.05) if len(peaks) else None


def level_legend_key(level: str, symbol: str) -> dict[str, Any]:
    """The legend entry of a checkpoint level in the scatter: its shape, in neutral grey.

    The level's points are coloured by loss std through the shared colour axis, and plotly cannot
    colour a legend symbol from a colour-axis number (it logs "Invalid color specifier: number
    0.0224" and draws the symbol black). So the points' trace stays out of the legend and this
    empty trace stands for it; the shared legend group makes one click toggle the level's points.
    """
    return {"type": "scatter", "mode": "markers", "name": f"checkpoint {esc(level)}",
            "legendgroup": f"checkpoint {esc(level)}", "x": [None], "y": [None], "hoverinfo": "skip",
            "marker": {"symbol": symbol, "size": 12, "color": "#999999",
                       "line": {"width": 1, "color": "#333"}}}


def _noise_bars(rows: pd.DataFrame) -> dict[str, Any]:
    """Error bars from each point's tokens/s down and up to its p10-p90 throughput interval
    (dpo_sweep/noise.py): points whose bars overlap are ties. Zero-length without a spread."""
    tps = rows["tokens_per_s"].astype(float)
    return {"type": "data", "symmetric": False, "visible": True, "thickness": 1, "width": 3,
            "color": "#555", "array": nums(rows["throughput_high"].astype(float) - tps),
            "arrayminus": nums(tps - rows["throughput_low"].astype(float))}


def _axis_range(xs: list[float]) -> list[float] | None:
    """An x range around the plotted points (10% margin), so they are not squeezed against a
    far budget line; None when there is nothing to fit."""
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    if not xs:
        return None
    low, high = min(xs), max(xs)
    pad = 0.1 * (high - low) if high > low else 0.1 * abs(high) or 1.0
    return [num(max(0.0, low - pad)), num(high + pad)]


def _flat_range(values: pd.Series) -> dict[str, Any]:
    """A y range of +-10% around values that (nearly) coincide, which plotly would otherwise span
    with ticks closer than the tick format shows (10,379 / 10,379 / 10,380)."""
    finite = values.astype(float)
    finite = finite[np.isfinite(finite)]
    if not len(finite) or finite.max() - finite.min() > 0.01 * abs(finite.max()):
        return {}
    mid = float(finite.mean()) or 1.0
    return {"range": [num(mid * 0.9), num(mid * 1.1)]}


def _tick_format(values: pd.Series) -> str:
    """Thousands separators for throughputs of 100 and more (``26,197``, not ``26.197k``)."""
    finite = values.astype(float)
    finite = finite[np.isfinite(finite)]
    return ",.0f" if len(finite) and finite.abs().max() >= 100 else ".3~g"


def memory_time_scatter(analysed: pd.DataFrame, budget_gb: float | None, usable_gb: float | None,
                        objective_names: list[str], recommended: str | None = None) -> dict[str, Any]:
    """Peak memory (x) vs throughput (y, tokens/s, with p10-p90 noise bars); colour = loss std,
    shape = checkpoint level. Throughput, not step time: a step of a larger effective batch does
    more work (the frontier's objective, analysis/pareto.py).

    The frontier points are ringed and joined in memory order (diverging rows, never recommended,
    are left out of it and crossed); the recommended trial is a star. Rows without a throughput sit
    at the bottom of the throughput range: OOM trials at their measured peak (else the budget),
    pruned ones hollow at their predicted peak. diverged/error rows that measured something are
    grey rings. The x axis fits the points; a budget far right of them is named, not drawn.
    """
    measured = analysed[analysed["peak_mem_gb"].notna() & analysed["tokens_per_s"].notna()]
    ok = measured[measured["status"] == "ok"]
    swept = tables.swept_columns(analysed, levers=True)
    others = [lv for lv in level_order(analysed["checkpoint_level"]) if lv not in _SYMBOLS]
    std = ok["loss_std"].astype(float)
    std = std[np.isfinite(std)]
    diverging = (ok["stability"].astype(str) == "diverging") if "stability" in ok else pd.Series(False, index=ok.index)
    traces: list[dict[str, Any]] = []
    for level in level_order(ok["checkpoint_level"]):
        rows = ok[ok["checkpoint_level"] == level]
        traces.append({
            "type": "scatter", "mode": "markers", "name": f"checkpoint {esc(level)}",
            "showlegend": False, "legendgroup": f"checkpoint {esc(level)}",  # level_legend_key's
            "x": nums(rows["peak_mem_gb"]), "y": nums(rows["tokens_per_s"]), "error_y": _noise_bars(rows),
            "text": [_hover(r, swept) for _, r in rows.iterrows()], "hoverinfo": "text",
            "marker": {"symbol": checkpoint_symbol(level, others), "size": 12,
                       "color": nums(rows["loss_std"]), "coloraxis": "coloraxis",
                       "line": {"width": 1, "color": "#333"}},
        })
    traces += [level_legend_key(level, checkpoint_symbol(level, others))
               for level in level_order(ok["checkpoint_level"])]
    front = ok[ok["on_frontier"] & ~diverging].sort_values(["peak_mem_gb", "tokens_per_s"])
    if len(front):
        traces.append({
            "type": "scatter", "mode": "lines+markers",
            "name": "Pareto frontier (" + ", ".join(esc(n) for n in objective_names) + ")",
            "x": nums(front["peak_mem_gb"]), "y": nums(front["tokens_per_s"]), "hoverinfo": "skip",
            "line": {"color": "#d62728", "width": 1.5, "dash": "dot"},
            "marker": {"symbol": "circle-open", "size": 20, "color": "#d62728", "line": {"width": 2}},
        })
    if diverging.any():
        rows = ok[diverging]
        traces.append({
            "type": "scatter", "mode": "markers", "name": "stability: diverging (never recommended)",
            "x": nums(rows["peak_mem_gb"]), "y": nums(rows["tokens_per_s"]), "hoverinfo": "skip",
            "marker": {"symbol": "x-thin-open", "size": 18, "color": "#8a1c1c", "line": {"width": 2}},
        })
    win = ok[ok["trial_id"].astype(str) == str(recommended)] if recommended is not None else ok[:0]
    if len(win):
        traces.append({
            "type": "scatter", "mode": "markers", "name": f"recommended ({esc(win['trial_id'].iloc[0])})",
            "x": nums(win["peak_mem_gb"]), "y": nums(win["tokens_per_s"]),
            "text": [_hover(r, swept) for _, r in win.iterrows()], "hoverinfo": "text",
            "marker": {"symbol": "star", "size": 24, "color": "rgba(44,160,44,0.35)",
                       "line": {"width": 2.5, "color": "#2ca02c"}},
        })
    bad = measured[measured["status"] != "ok"]
    if len(bad):
        traces.append({
            "type": "scatter", "mode": "markers", "name": "diverged / error",
            "x": nums(bad["peak_mem_gb"]), "y": nums(bad["tokens_per_s"]),
            "text": [_hover(r, swept) for _, r in bad.iterrows()], "hoverinfo": "text",
            "marker": {"symbol": "circle-open", "size": 11, "color": "#7f7f7f", "line": {"width": 2}},
        })
    rates = ok["tokens_per_s"].astype(float)
    floor_y = num(rates.min()) if len(rates) else None
    oom = analysed[analysed["status"] == "oom"].sort_values(["micro_batch", "trial_id"])
    x_oom = [num(p) if num(p) is not None else num(oom_x_gb(analysed, budget_gb)) for p in oom["peak_mem_gb"]]
    if len(oom) and all(x is not None for x in x_oom):
        traces.append({
            "type": "scatter", "mode": "markers",
            "name": "OOM (no throughput; at its measured peak, else the budget)",
            "x": x_oom, "y": [floor_y if floor_y is not None else 0] * len(oom),
            "text": [_hover(r, swept) for _, r in oom.iterrows()], "hoverinfo": "text",
            "marker": {"symbol": "x-thin-open", "size": 14, "color": "#000", "line": {"width": 3}},
        })
    pruned = analysed[(analysed["status"] == "pruned") & analysed.get("predicted_peak_gb", pd.Series(dtype=float)).notna()] \
        if "predicted_peak_gb" in analysed else analysed[:0]
    if len(pruned):
        traces.append({
            "type": "scatter", "mode": "markers", "name": "pruned (never ran; at its predicted peak)",
            "x": nums(pruned["predicted_peak_gb"]), "y": [floor_y if floor_y is not None else 0] * len(pruned),
            "text": [_hover(r, swept) for _, r in pruned.iterrows()], "hoverinfo": "text",
            "marker": {"symbol": "circle-open", "size": 13, "color": "#9467bd", "line": {"width": 2}},
        })
    xs = [x for t in traces for x in t.get("x", []) if x is not None]
    x_range = _axis_range(xs)
    shapes, annotations = [], []
    # The budget's label goes right of its line, the usable limit's left of its, so they never overlap.
    for x, label, dash, side in ((budget_gb, "budget", "solid", "left"),
                                 (usable_gb, "minus safety margin", "dash", "right")):
        if x is None:
            continue
        if x_range is not None and x > x_range[1] * 1.25:  # far right of every point: say so at the edge
            if label == "budget":
                annotations.append({"x": 1.0, "y": 1.0, "xref": "paper", "yref": "paper", "yanchor": "bottom",
                                    "xanchor": "right", "showarrow": False, "font": {"size": 11},
                                    "text": f"budget {num(x)} GB (usable {num(usable_gb)} GB): right of every point \u2192"})
            continue
        if x_range is not None:
            room = 0.15 * (x_range[1] - x_range[0])  # for the label beside the line
            x_range = [min(x_range[0], num(x - room)), max(x_range[1], num(x + room))]
        shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": num(x), "x1": num(x),
                       "y0": 0, "y1": 1, "line": {"color": "#555", "width": 1.5, "dash": dash}})
        annotations.append({"x": num(x), "y": 1.0, "xref": "x", "yref": "paper", "yanchor": "bottom",
                            "xanchor": side, "text": f"{label} {num(x)} GB", "showarrow": False,
                            "font": {"size": 11}})
    layout = {
        "title": {"text": "Peak memory vs throughput"},
        "xaxis": {"title": {"text": "peak memory (GB = 1e9 bytes)"}, "zeroline": False,
                  **({"range": x_range} if x_range else {})},
        "yaxis": {"title": {"text": "throughput (tokens/s, median; bars: p10-p90 step times)"},
                  "zeroline": False, "tickformat": _tick_format(rates), **_flat_range(rates)},
        "coloraxis": {"colorscale": "Viridis", "cmin": num(std.min()) if len(std) else None,
                      "cmax": num(std.max()) if len(std) else None,
                      "colorbar": {"title": {"text": "loss std"}, "x": 1.02}},
        "legend": {"orientation": "h", "y": -0.2}, "shapes": shapes, "annotations": annotations,
        "margin": {"t": 60, "r": 40}, "height": 520,
    }
    return {"data": traces, "layout": layout}


def _category(values: pd.Series, dim: str) -> tuple[list[str], list[str]]:
    """Category labels of a swept dimension per row, and their axis order."""
    if dim == "checkpoint_level":
        labels = [str(v) for v in values]
        return [esc(v) for v in labels], [esc(v) for v in level_order(labels)]
    if dim not in ("beta", "micro_batch", "grad_acc"):  # a swept train field: numbers or words
        labels = [esc(tables.fmt_setting(v)) for v in values]
        numeric = all(_is_number(lab) for lab in labels if lab != "-")
        key = (lambda lab: (0, float(lab)) if lab != "-" else (1, 0.0)) if numeric else (lambda lab: (0, lab))
        return labels, sorted(set(labels), key=key)
    fmt = (lambda v: f"{float(v):g}") if dim == "beta" else (lambda v: str(int(v)))
    labels = [fmt(v) if num(v) is not None else "?" for v in values]
    order = sorted({(float(v), fmt(v)) for v in values if num(v) is not None})
    return labels, [lab for _, lab in order] + (["?"] if "?" in labels else [])


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _axis_suffix(k: int) -> str:
    """Plotly names the first axis ``x``/``xaxis`` (not ``x1``), then ``x2``, ``x3``, ..."""
    return "" if k == 1 else str(k)


def _status_group(row: pd.Series) -> str:
    if row["status"] == "ok":
        if row.get("stability") == "diverging":
            return "diverging"
        return "frontier" if row["on_frontier"] else "ok"
    return "oom" if row["status"] == "oom" else "other"


def panel_dimensions(analysed: pd.DataFrame) -> list[tuple[str, str]]:
    """(column, label) of the dimensions that vary: the four core ones and the swept train fields;
    all four core ones when nothing varies."""
    dims = list(SWEPT_DIMENSIONS) + [(c, c) for c in tables.swept_columns(analysed)]
    varying = [(c, label) for c, label in dims if analysed[c].astype(str).nunique() > 1]
    return varying or list(SWEPT_DIMENSIONS)


def dimension_panels(analysed: pd.DataFrame, budget_gb: float | None) -> dict[str, Any]:
    """Small multiples: peak memory (top row) and throughput (bottom row) against each swept
    dimension that varies, coloured by status. OOM trials sit at the budget in the memory row."""
    groups = analysed.assign(_group=[_status_group(r) for _, r in analysed.iterrows()])
    x_oom = oom_x_gb(analysed, budget_gb)
    dimensions = panel_dimensions(analysed)
    swept = tables.swept_columns(analysed, levers=True)
    n = len(dimensions)
    gap = 0.04
    width = (1.0 - gap * (n - 1)) / n
    traces: list[dict[str, Any]] = []
    layout: dict[str, Any] = {"title": {"text": "Each swept dimension against memory and throughput"},
                              "height": 560, "legend": {"orientation": "h", "y": -0.12},
                              "margin": {"t": 60}, "annotations": []}
    for col, (dim, label) in enumerate(dimensions):
        cats, order = _category(groups[dim], dim)
        groups_cat = groups.assign(_cat=cats)
        for row_i, (metric, title) in enumerate((("peak_mem_gb", "peak memory (GB)"),
                                                 ("tokens_per_s", "tokens/s"))):
            k = row_i * n + col + 1
            sfx = _axis_suffix(k)
            layout[f"xaxis{sfx}"] = {
                "domain": [col * (width + gap), col * (width + gap) + width], "anchor": f"y{sfx}",
                "type": "category", "categoryorder": "array", "categoryarray": order,
                "title": {"text": label if row_i == 1 else ""}}
            layout[f"yaxis{sfx}"] = {
                "domain": [0.55, 1.0] if row_i == 0 else [0.0, 0.45], "anchor": f"x{sfx}",
                "title": {"text": title if col == 0 else ""}, "zeroline": False,
                "tickformat": _tick_format(analysed[metric]), **_flat_range(analysed[metric])}
            for group, (name, colour, symbol) in _STATUS_STYLE.items():
                rows = groups_cat[groups_cat["_group"] == group]
                if group == "oom":
                    if metric != "peak_mem_gb" or x_oom is None:
                        continue
                    ys = [num(p) if num(p) is not None else num(x_oom) for p in rows["peak_mem_gb"]]
                else:
                    rows = rows[rows[metric].notna()]
                    ys = nums(rows[metric])
                if not len(rows):
                    continue
                traces.append({
                    "type": "scatter", "mode": "markers", "name": name, "legendgroup": group,
                    "showlegend": k == 1 or (group == "oom" and col == 0),
                    "x": list(rows["_cat"]), "y": ys, "xaxis": f"x{sfx}", "yaxis": f"y{sfx}",
                    "text": [_hover(r, swept) for _, r in rows.iterrows()], "hoverinfo": "text",
                    "marker": {"symbol": symbol, "size": 10, "color": colour, "opacity": 0.8,
                               "line": {"width": 2, "color": colour}},
                })
    peaks = analysed["peak_mem_gb"].astype(float)
    highest = float(peaks[np.isfinite(peaks)].max()) if np.isfinite(peaks).any() else None
    if budget_gb is not None and (highest is None or budget_gb <= 1.25 * highest):
        # The budget as a dashed line across each memory panel (the top row: axes 1..n); not when
        # it is far above every peak, where it would squeeze the points to the panel's floor.
        layout["shapes"] = [
            {"type": "line", "xref": f"x{_axis_suffix(k)} domain", "yref": f"y{_axis_suffix(k)}",
             "x0": 0, "x1": 1, "y0": num(budget_gb), "y1": num(budget_gb),
             "line": {"color": "#555", "width": 1, "dash": "dash"}}
            for k in range(1, n + 1)]
    return {"data": traces, "layout": layout}
