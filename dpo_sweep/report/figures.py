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
from dpo_sweep.core.dimensions import KNOBS, label_of
from dpo_sweep.core.status import Status

_STATUS_STYLE = {  # status group -> (legend name, colour, symbol)
    "frontier": ("ok, on frontier", "#d62728", "circle"),
    "ok": ("ok", "#1f77b4", "circle"),
    "oom": ("OOM (at its measured peak, else the budget)", "#000000", "x-thin-open"),
    "diverging": ("ok, stability diverging", "#8a1c1c", "x-thin-open"),
    "other": ("diverged / pruned / error", "#7f7f7f", "circle-open"),
}
#: (column, label) of the table's knobs: the panels every report has.
SWEPT_DIMENSIONS: tuple[tuple[str, str], ...] = tuple((d.column, d.label) for d in KNOBS)
#: Every plot's plotly config. Nothing leaves the page: no "Edit in Chart Studio" / "Share chart"
#: button (showSendToCloud, showEditInChartStudio, sendData: a click would post the chart's data,
#: trial ids and error texts included, to a public service), no link to plotly's site (displaylogo,
#: showLink).
PLOT_CONFIG: dict[str, Any] = {"displaylogo": False, "showLink": False, "sendData": False,
                               "showSendToCloud": False, "showEditInChartStudio": False,
                               "responsive": True, "typesetMath": False}


#: Pixels from the plot area's bottom edge to a legend drawn below it: clear of the x-axis's tick
#: labels and title (about 55 px together at plotly's default sizes).
LEGEND_GAP_PX = 70


def legend_below(height_px: float, margin_t: float, margin_b: float) -> dict[str, Any]:
    """A horizontal legend LEGEND_GAP_PX below the plot area of a figure ``height_px`` tall with
    those margins (the legend's y is a fraction of the plot area's height)."""
    area = max(height_px - margin_t - margin_b, 1.0)
    return {"orientation": "h", "y": -LEGEND_GAP_PX / area, "yanchor": "top"}


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
    elif num(row.get("predicted_peak_gb")) is not None and num(row.get("predicted_peak_gb")) >= 0:
        parts.append(f"predicted peak: {num(row['predicted_peak_gb'])} GB (the memory model; not measured)")
    if num(row["step_time_ms"]) is not None:
        parts.append(f"step time: {num(row['step_time_ms'])} ms" + (f" ({esc(time_from)})" if time_from else ""))
    if num(row["tokens_per_s"]) is not None:
        low, high = num(row.get("throughput_low")), num(row.get("throughput_high"))
        spread = f" (interval {low}-{high}: p10-p90 step times widened for the steps measured)" if low is not None and high is not None and low != high else ""
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


def _noise_bars(rows: pd.DataFrame) -> dict[str, Any]:
    """Error bars from each point's tokens/s down and up to its p10-p90 throughput interval
    (dpo_sweep/core/noise.py): points whose bars overlap are ties. Zero-length without a spread."""
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


def axis_suffix(k: int) -> str:
    """Plotly names the first axis ``x``/``xaxis`` (not ``x1``), then ``x2``, ``x3``, ..."""
    return "" if k == 1 else str(k)


def _status_group(row: pd.Series) -> str:
    if row["status"] == Status.OK:
        if row.get("stability") == "diverging":
            return "diverging"
        return "frontier" if row["on_frontier"] else "ok"
    return "oom" if row["status"] == Status.OOM else "other"


def panel_dimensions(analysed: pd.DataFrame) -> list[tuple[str, str]]:
    """(column, label) of the dimensions that vary: the four core ones, the model, the levers
    (adapter, optimizer) and every swept train field; all four core ones when nothing varies."""
    dims = list(SWEPT_DIMENSIONS) + [(c, label_of(c)) for c in tables.swept_columns(analysed, levers=True)]
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
                              "height": 560, "legend": legend_below(560, 60, 80),
                              "margin": {"t": 60, "b": 80}, "annotations": []}
    for col, (dim, label) in enumerate(dimensions):
        cats, order = _category(groups[dim], dim)
        groups_cat = groups.assign(_cat=cats)
        for row_i, (metric, title) in enumerate((("peak_mem_gb", "peak memory (GB)"),
                                                 ("tokens_per_s", "tokens/s"))):
            k = row_i * n + col + 1
            sfx = axis_suffix(k)
            layout[f"xaxis{sfx}"] = {
                "domain": [col * (width + gap), col * (width + gap) + width], "anchor": f"y{sfx}",
                "type": "category", "categoryorder": "array", "categoryarray": order,
                "title": {"text": label if row_i == 1 else ""}}
            # One metric a row: the row's panels share the first one's y axis and its tick labels
            # (labels on every panel collide with the next panel's points on a narrow screen).
            shared = {} if col == 0 else {"matches": f"y{axis_suffix(row_i * n + 1)}", "showticklabels": False}
            layout[f"yaxis{sfx}"] = {
                "domain": [0.55, 1.0] if row_i == 0 else [0.0, 0.45], "anchor": f"x{sfx}",
                "title": {"text": title if col == 0 else ""}, "zeroline": False,
                "tickformat": _tick_format(analysed[metric]), **_flat_range(analysed[metric]), **shared}
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
            {"type": "line", "xref": f"x{axis_suffix(k)} domain", "yref": f"y{axis_suffix(k)}",
             "x0": 0, "x1": 1, "y0": num(budget_gb), "y1": num(budget_gb),
             "line": {"color": "#555", "width": 1, "dash": "dash"}}
            for k in range(1, n + 1)]
    return {"data": traces, "layout": layout}
