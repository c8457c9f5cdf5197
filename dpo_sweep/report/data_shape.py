"""The data's shape in the report: length histograms after tokenisation, truncated and dropped
pairs, and the padding share each trial measured. Built from ``data.json`` (written by ``run``
from preflight's one read of the data, :mod:`dpo_sweep.core.lengths`) and results.csv."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from dpo_sweep.core.status import Status
from dpo_sweep.results_dir import ResultsDir

#: Which lengths get a histogram, and their legend names.
LENGTH_FIELDS = {"prompt": "prompt", "chosen": "chosen (with EOS)", "rejected": "rejected (with EOS)"}


@dataclass(frozen=True)
class DataShapeSection:
    """One line per data set, the padding line, and one histogram figure spec per data set."""

    lines: list[str]
    figures: list[tuple[str, dict[str, Any]]]  # (caption, plotly spec)


def load_data_json(out_dir: str | Path) -> list[dict[str, Any]]:
    """``DIR/data.json``'s data sets; [] when it is absent or unreadable (an older results dir)."""
    path = ResultsDir(out_dir).data
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    sets = data.get("datasets") if isinstance(data, dict) else None
    return [d for d in sets if isinstance(d, dict)] if isinstance(sets, list) else []


def _stats_text(stats: dict[str, Any]) -> str:
    return f"median {stats['median']:g}, p90 {stats['p90']:g}, max {stats['max']}"


def dataset_line(d: dict[str, Any]) -> str:
    lengths = d.get("lengths", {})
    parts = [f"{name} {_stats_text(lengths[name])}" for name in LENGTH_FIELDS if name in lengths]
    return (f"{d.get('source', '?')} ({d.get('model', '?')} tokenizer, max_length {d.get('max_length', '?')}): "
            f"{d.get('pairs', '?')} pairs, {d.get('truncated', '?')} truncated, {d.get('dropped', '?')} dropped; "
            "tokens per " + "; ".join(parts))


def padding_line(analysed: pd.DataFrame) -> str:
    """The padding share the trials measured (results.csv ``padding_frac``), "" when none did."""
    if "padding_frac" not in analysed:
        return ""
    ok = analysed[(analysed["status"] == Status.OK) & analysed["padding_frac"].notna()]
    if ok.empty:
        return ""
    lo, hi = float(ok["padding_frac"].min()), float(ok["padding_frac"].max())
    span = f"{lo:.1%}" if math.isclose(lo, hi, abs_tol=5e-4) else f"{lo:.1%} - {hi:.1%}"
    return (f"padding: {span} of the token positions of the trials' typical micro-batches are padding "
            f"({ResultsDir.RESULTS} padding_frac; 0 with train.padding_free)")


def length_histogram(d: dict[str, Any]) -> dict[str, Any]:
    """Grouped bars of prompt / chosen / rejected lengths: x the bin's lower edge in tokens."""
    traces = []
    for name, label in LENGTH_FIELDS.items():
        hist = d.get("lengths", {}).get(name, {}).get("histogram")
        if not hist:
            continue
        edges = hist["edges"]
        traces.append({"type": "bar", "name": label, "x": edges[:-1], "y": hist["counts"],
                       "width": [b - a if b > a else 1 for a, b in zip(edges, edges[1:])], "offset": 0,
                       "opacity": 0.6, "hovertemplate": f"{label}: %{{x}}+ tokens: %{{y}} pairs<extra></extra>"})
    # Whole tokens on the axis: a narrow range (fixed-length pairs, one bar) gets a tick per token
    # around its bars instead of plotly's fractional ticks.
    xaxis: dict[str, Any] = {"title": {"text": "tokens"}, "tickformat": "d"}
    lows = [x for t in traces for x in t["x"]]
    highs = [x + w for t in traces for x, w in zip(t["x"], t["width"])]
    if lows and max(highs) - min(lows) <= 10:
        xaxis.update({"dtick": 1, "range": [min(lows) - 2, max(highs) + 2]})
    layout = {"title": {"text": f"Lengths after tokenisation: {d.get('source', '?')}"}, "barmode": "overlay",
              "xaxis": xaxis, "yaxis": {"title": {"text": "pairs"}, "tickformat": "d"},
              "height": 360, "margin": {"t": 60}}
    return {"data": traces, "layout": layout}


def data_shape_section(datasets: list[dict[str, Any]], analysed: pd.DataFrame) -> DataShapeSection:
    lines = [dataset_line(d) for d in datasets]
    pad = padding_line(analysed)
    figures = [("Prompt and response lengths in tokens after truncation, per pair (the longest "
                "micro-batch of these is what the worst-case step measures).", length_histogram(d))
               for d in datasets]
    return DataShapeSection(lines + ([pad] if pad else []), figures)
