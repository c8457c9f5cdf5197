"""The per-step curves of the report (loss, grad norm, log-ratio std, ... against the optimizer
step), as plotly dict specs: one line per trial, thinned to MAX_POINTS_PER_CURVE points."""
from __future__ import annotations

import colorsys
from typing import Any

import numpy as np
import pandas as pd

from dpo_sweep.analysis import tables
from dpo_sweep.core.status import Status
from dpo_sweep.report.figures import esc, num, nums, trial_label
from dpo_sweep.results_dir import ResultsDir

MAX_POINTS_PER_CURVE = 200
#: Up to ten lines take plotly's own colours; more take COLOURS, whose neighbours differ in hue
#: and in lightness, so that no two of a report's lines share a colour as plotly's cycle of ten did.
PLOTLY_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                  "#bcbd22", "#17becf")


def colours(n: int) -> list[str]:
    """``n`` distinct line colours: plotly's ten for up to ten lines, else ``n`` hues round the
    colour wheel in three lightnesses (dark, middle, light, in turn)."""
    if n <= len(PLOTLY_COLOURS):
        return list(PLOTLY_COLOURS[:n])
    out = []
    for i in range(n):
        r, g, b = colorsys.hls_to_rgb(i / n, (0.32, 0.5, 0.66)[i % 3], 0.85 if i % 3 != 2 else 0.7)
        out.append(f"#{round(255 * r):02x}{round(255 * g):02x}{round(255 * b):02x}")
    return out


def _thin(frame: pd.DataFrame, max_points: int) -> pd.DataFrame:
    """At most max_points rows, evenly spaced, always keeping the last."""
    if len(frame) <= max_points:
        return frame
    idx = np.unique(np.linspace(0, len(frame) - 1, max_points).round().astype(int))
    return frame.iloc[idx]


def step_dtick(last_step: float) -> int:
    """Whole-step tick spacing, 1, 2, 5, 10, 20, 50 ...: about ten ticks, never a fractional step."""
    for scale in (1, 10, 100, 1000, 10000):
        for base in (1, 2, 5):
            if base * scale * 10 >= last_step:
                return base * scale
    return 100000


def step_curves(steps: pd.DataFrame, analysed: pd.DataFrame, column: str, title: str,
                y_title: str, threshold: tuple[float, str] | None = None) -> dict[str, Any]:
    """One line per trial of ``steps[column]`` against the optimizer step; ``threshold``: a
    horizontal line (value, label), e.g. the rollback trigger's log-ratio std."""
    by_id = {str(r["trial_id"]): r for _, r in analysed.iterrows()}
    order = {trial_id: i for i, trial_id in enumerate(by_id)}  # results.csv order, then the rest
    groups = sorted(steps.groupby("trial_id", sort=False),
                    key=lambda g: (order.get(str(g[0]), len(order)), str(g[0])))
    # Trials whose curves are the same numbers (one learning trial's curve carried by the rows that
    # share it) are one line, named after all of them: one legend entry per visible line.
    curves: dict[tuple, dict[str, Any]] = {}
    for trial_id, rows in groups:
        rows = _thin(rows.sort_values("step"), MAX_POINTS_PER_CURVE)
        row = by_id.get(str(trial_id))
        name = trial_label(row) if row is not None else esc(tables.short_id(str(trial_id)))
        status = str(row["status"]) if row is not None else f"not in {ResultsDir.RESULTS}"
        x, y = nums(rows["step"]), nums(rows[column]) if column in rows else []
        key = (tuple(x), tuple(y), status == Status.OK)
        if key in curves:
            curves[key]["names"].append(name)
            continue
        curves[key] = {"names": [name], "status": status, "trial_id": trial_id, "x": x, "y": y}
    traces = []
    palette = colours(len(curves))
    for i, curve in enumerate(curves.values()):
        names, status = curve["names"], curve["status"]
        name = names[0] if len(names) == 1 else f"{names[0]} and {len(names) - 1} more (the same curve)"
        hover = "<br>".join(names[:6]) + (f"<br>... {len(names) - 6} more" if len(names) > 6 else "")
        traces.append({
            "type": "scatter", "mode": "lines+markers", "name": name, "legendgroup": esc(curve["trial_id"]),
            "x": curve["x"], "y": curve["y"],
            "hovertemplate": f"{hover} ({esc(status)})<br>step %{{x}}: %{{y}}<extra></extra>",
            "line": {"width": 1.5, "dash": "solid" if status == Status.OK else "dot", "color": palette[i]},
            "marker": {"size": 4, "color": palette[i]},
        })
    last = max((v for t in traces for v in t["x"] if v is not None), default=1)
    layout = {"title": {"text": title},
              "xaxis": {"title": {"text": "optimizer step"}, "tickformat": "d", "tick0": 0, "dtick": step_dtick(last)},
              "yaxis": {"title": {"text": y_title}}, "height": 420, "margin": {"t": 60},
              "legend": {"font": {"size": 10}}}
    values = [v for t in traces for v in t["y"] if v is not None]
    if threshold is not None and values and threshold[0] > 3 * max(values):
        # A line far above every value would squeeze the curves flat at the bottom: named instead.
        layout["annotations"] = [{"x": 1, "y": 1, "xref": "paper", "yref": "paper", "xanchor": "right",
                                  "yanchor": "bottom", "showarrow": False, "font": {"size": 11, "color": "#d62728"},
                                  "text": f"{esc(threshold[1])}: above every value (max {num(max(values))})"}]
        threshold = None
    if threshold is not None:
        value, label = threshold
        layout["shapes"] = [{"type": "line", "xref": "paper", "yref": "y", "x0": 0, "x1": 1, "y0": num(value),
                             "y1": num(value), "line": {"color": "#d62728", "width": 1.5, "dash": "dash"}}]
        layout["annotations"] = [{"x": 0, "y": num(value), "xref": "paper", "yref": "y", "xanchor": "left",
                                  "yanchor": "bottom", "text": esc(label), "showarrow": False,
                                  "font": {"size": 11, "color": "#d62728"}}]
    return {"data": traces, "layout": layout}
