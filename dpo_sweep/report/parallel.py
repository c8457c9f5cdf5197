"""Parallel coordinates over the swept dimensions and the three objectives, with the data the
page's status and value filters work on.

Drawn with SVG scatter lines (the report never needs WebGL, which plotly's own ``parcoords``
does): one line per trial across one vertical axis per dimension, each axis scaled to [0, 1] on
its own (categories evenly spaced in their order, numbers from their minimum to their maximum),
the axis labels as annotations. A trial without a value on an axis (an OOM row's throughput)
has a gap there. Colour: the trial's status group, as in the per-dimension panels.
"""
from __future__ import annotations

import math
from typing import Any

import pandas as pd

from dpo_sweep.analysis import effects, tables
from dpo_sweep.core.status import Status
from dpo_sweep.report.figures import _hover, _status_group, esc, num

#: The objectives' axes after the dimensions: (column, title).
OBJECTIVE_AXES = (("peak_mem_gb", "peak GB"), ("tokens_per_s", "tokens/s"), ("loss_std", "loss std"))
GROUP_STYLE = {  # status group -> (legend name, colour)
    "frontier": ("ok, on frontier", "#d62728"), "ok": ("ok", "#1f77b4"),
    "diverging": ("ok, stability diverging", "#8a1c1c"), "oom": ("OOM", "#000000"),
    "other": ("diverged / pruned / error", "#9467bd"), "recommended": ("recommended", "#2ca02c"),
}


def _category_order(values: list[str], column: str) -> list[str]:
    return effects._order(sorted(set(values)), column)


def axes(analysed: pd.DataFrame) -> list[dict[str, Any]]:
    """One dict per axis: name, column, kind (``category`` | ``number``) and its values' order or range."""
    out = []
    for column in effects.dimensions(analysed):
        labels = [tables.fmt_setting(v) for v in analysed[column]]
        out.append({"name": "checkpoint" if column == "checkpoint_level" else column, "column": column,
                    "kind": "category", "options": _category_order(labels, column)})
    for column, title in OBJECTIVE_AXES:
        values = analysed[column].astype(float)
        values = values[values.map(math.isfinite)]
        if len(values):
            out.append({"name": title, "column": column, "kind": "number",
                        "min": num(values.min()), "max": num(values.max())})
    return out


def _position(axis: dict[str, Any], value: Any) -> float | None:
    if axis["kind"] == "category":
        options = axis["options"]
        label = tables.fmt_setting(value)
        return 0.5 if len(options) == 1 else options.index(label) / (len(options) - 1)
    if not tables.is_finite(value):
        return None
    low, high = axis["min"], axis["max"]
    return 0.5 if high == low else (float(value) - low) / (high - low)


#: Drawing order: the failed lines first, the frontier's and the recommended one's on top.
_DRAW_ORDER = {"other": 0, "oom": 1, "diverging": 2, "ok": 3, "frontier": 4, "recommended": 5}


def parallel_coordinates(analysed: pd.DataFrame, recommended: str | None = None
                         ) -> tuple[dict[str, Any], dict[str, Any]]:
    """(plotly spec, filter data): one trace per trial, the filter data's trials in the same order;
    the recommended trial's line green and thick."""
    ax = axes(analysed)
    swept = tables.swept_columns(analysed, levers=True)
    groups = ["recommended" if str(r["trial_id"]) == str(recommended)
              else (_status_group(r) if r["status"] != Status.PRUNED else "other") for _, r in analysed.iterrows()]
    order = sorted(range(len(analysed)), key=lambda i: _DRAW_ORDER[groups[i]])
    traces, trials, legend = [], [], set()
    for i in order:
        row, group = analysed.iloc[i], groups[i]
        name, colour = GROUP_STYLE[group]
        traces.append({
            "type": "scatter", "mode": "lines+markers", "name": name, "legendgroup": group,
            "showlegend": group not in legend, "x": list(range(len(ax))),
            "y": [num(_position(a, row[a["column"]])) for a in ax],
            "text": _hover(row, swept), "hoverinfo": "text",
            "line": {"color": colour, "width": {"frontier": 2, "recommended": 4}.get(group, 1.2)},
            "marker": {"size": 5, "color": colour}, "opacity": 0.75,
        })
        legend.add(group)
        trials.append({"id": str(row["trial_id"]), "group": group,
                       "values": [tables.fmt_setting(row[a["column"]]) if a["kind"] == "category"
                                  else num(row[a["column"]]) for a in ax]})
    annotations, shapes = [], []
    for i, a in enumerate(ax):
        shapes.append({"type": "line", "xref": "x", "yref": "y", "x0": i, "x1": i, "y0": 0, "y1": 1,
                       "line": {"color": "#888", "width": 1}})
        annotations.append({"x": i, "y": 1.04, "xref": "x", "yref": "y", "yanchor": "bottom", "showarrow": False,
                            "text": f"<b>{esc(a['name'])}</b>", "font": {"size": 11}})
        if a["kind"] == "category":
            ticks = [(_position(a, v), v) for v in a["options"]]
        else:
            ticks = [(0.0, a["min"]), (1.0, a["max"])] if a["min"] != a["max"] else [(0.5, a["min"])]
            ticks = [(y, tables.fmt_sig(v, 4)) for y, v in ticks]
        annotations += [{"x": i, "y": y, "xref": "x", "yref": "y", "xanchor": "right", "showarrow": False,
                         "text": esc(label), "font": {"size": 10}, "xshift": -4, "bgcolor": "rgba(255,255,255,0.7)"}
                        for y, label in ticks]
    layout = {"title": {"text": "Parallel coordinates: swept dimensions and objectives"}, "height": 480,
              "xaxis": {"visible": False, "range": [-0.6, len(ax) - 0.6], "fixedrange": True},
              "yaxis": {"visible": False, "range": [-0.06, 1.12], "fixedrange": True},
              "shapes": shapes, "annotations": annotations, "legend": {"orientation": "h", "y": -0.05},
              "margin": {"t": 60, "l": 30, "r": 30}, "hovermode": "closest"}
    filters = {"axes": [{k: v for k, v in a.items() if k != "column"} for a in ax], "trials": trials,
               "groups": {g: GROUP_STYLE[g][0] for g in GROUP_STYLE if g in legend}}
    return {"data": traces, "layout": layout}, filters
