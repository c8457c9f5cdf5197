"""The per-step curves of the report (loss, grad norm, log-ratio std, ... against the optimizer
step), as plotly dict specs: one line per trial, thinned to MAX_POINTS_PER_CURVE points."""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from dpo_sweep.analysis import tables
from dpo_sweep.report.figures import esc, num, nums, trial_label
from dpo_sweep.results_dir import ResultsDir

MAX_POINTS_PER_CURVE = 200


def _thin(frame: pd.DataFrame, max_points: int) -> pd.DataFrame:
    """At most max_points rows, evenly spaced, always keeping the last."""
    if len(frame) <= max_points:
        return frame
    idx = np.unique(np.linspace(0, len(frame) - 1, max_points).round().astype(int))
    return frame.iloc[idx]


def step_curves(steps: pd.DataFrame, analysed: pd.DataFrame, column: str, title: str,
                y_title: str, threshold: tuple[float, str] | None = None) -> dict[str, Any]:
    """One line per trial of ``steps[column]`` against the optimizer step; ``threshold``: a
    horizontal line (value, label), e.g. the rollback trigger's log-ratio std."""
    by_id = {str(r["trial_id"]): r for _, r in analysed.iterrows()}
    order = {trial_id: i for i, trial_id in enumerate(by_id)}  # results.csv order, then the rest
    groups = sorted(steps.groupby("trial_id", sort=False),
                    key=lambda g: (order.get(str(g[0]), len(order)), str(g[0])))
    traces = []
    for trial_id, rows in groups:
        rows = _thin(rows.sort_values("step"), MAX_POINTS_PER_CURVE)
        row = by_id.get(str(trial_id))
        name = trial_label(row) if row is not None else esc(tables.short_id(str(trial_id)))
        status = str(row["status"]) if row is not None else f"not in {ResultsDir.RESULTS}"
        traces.append({
            "type": "scatter", "mode": "lines+markers", "name": name, "legendgroup": esc(trial_id),
            "x": nums(rows["step"]), "y": nums(rows[column]) if column in rows else [],
            "hovertemplate": f"{name} ({esc(status)})<br>step %{{x}}: %{{y}}<extra></extra>",
            "line": {"width": 1.5, "dash": "solid" if status == "ok" else "dot"}, "marker": {"size": 4},
        })
    layout = {"title": {"text": title}, "xaxis": {"title": {"text": "optimizer step"}},
              "yaxis": {"title": {"text": y_title}}, "height": 420, "margin": {"t": 60},
              "legend": {"font": {"size": 10}}}
    if threshold is not None:
        value, label = threshold
        layout["shapes"] = [{"type": "line", "xref": "paper", "yref": "y", "x0": 0, "x1": 1, "y0": num(value),
                             "y1": num(value), "line": {"color": "#d62728", "width": 1.5, "dash": "dash"}}]
        layout["annotations"] = [{"x": 0, "y": num(value), "xref": "paper", "yref": "y", "xanchor": "left",
                                  "yanchor": "bottom", "text": esc(label), "showarrow": False,
                                  "font": {"size": 11, "color": "#d62728"}}]
    return {"data": traces, "layout": layout}
