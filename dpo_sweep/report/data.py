"""The report's content as plain data ("compute, then render"): the template only fills it in.

Everything the HTML shows is in :class:`ReportData`: strings (escaped later by the template's
autoescape), tables as rows of strings, figures as plotly dict specs. Tests check this data
directly; ``report.html`` is a rendering of it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from dpo_sweep.analysis import tables
from dpo_sweep.analysis.pareto import Objective
from dpo_sweep.analysis.recommend import Recommendation
from dpo_sweep.records import STATUSES
from dpo_sweep.report import figures


@dataclass(frozen=True)
class Table:
    """A table as strings: header, rows, and one CSS class per row (its status)."""

    header: tuple[str, ...]
    rows: list[list[str]]
    row_classes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Figure:
    """One plot: a DOM id, a caption, and the plotly spec (data, layout, config)."""

    dom_id: str
    caption: str
    spec: dict[str, Any]


@dataclass(frozen=True)
class ReportData:
    """Everything report.html shows."""

    title: str
    summary: list[tuple[str, str]]
    recommendation_headline: str
    recommendation_reason: str
    recommendation_json: dict[str, Any]
    figures: list[Figure]
    frontier_table: Table
    trials_table: Table
    environment: list[tuple[str, str]]
    notes: list[str]


def flatten(data: Any, prefix: str = "") -> list[tuple[str, str]]:
    """Nested dicts/lists as ``("gpu.name", "H200")`` pairs, in file order."""
    if isinstance(data, dict):
        out: list[tuple[str, str]] = []
        for key, value in data.items():
            out += flatten(value, f"{prefix}.{key}" if prefix else str(key))
        return out
    if isinstance(data, list):
        if all(not isinstance(v, (dict, list)) for v in data):
            return [(prefix, ", ".join(str(v) for v in data))]
        out = []
        for i, value in enumerate(data):
            out += flatten(value, f"{prefix}[{i}]")
        return out
    return [(prefix, "" if data is None else str(data))]


def _figure(dom_id: str, caption: str, spec: dict[str, Any]) -> Figure:
    return Figure(dom_id, caption, {**spec, "config": dict(figures.PLOT_CONFIG)})


def _headline(rec: Recommendation) -> str:
    if rec.trial_id is None:
        return "No configuration fits"
    c = rec.config
    return (f"Use micro_batch {c.get('micro_batch')}, checkpoint {c.get('checkpoint_level')}, "
            f"grad_acc {c.get('grad_acc')}, beta {tables.fmt_beta(c.get('beta'))} (trial {rec.trial_id})")


def _summary(analysed: pd.DataFrame, rec: Recommendation, objectives: tuple[Objective, ...],
             steps: pd.DataFrame | None) -> list[tuple[str, str]]:
    counts = analysed["status"].value_counts()
    budget = "none given" if rec.memory_budget_gb is None else (
        f"{rec.memory_budget_gb:.2f} GB (from {rec.budget_source}); usable "
        f"{rec.usable_memory_gb:.2f} GB after a {100 * rec.safety_margin:g}% safety margin")
    models = sorted({m for m in analysed["model"] if m})
    return [
        ("model", ", ".join(models) or "-"),
        ("trials", f"{len(analysed)} (" + ", ".join(f"{n} {s}" for s, n in counts.items()) + ")"),
        ("on the frontier", str(int(analysed["on_frontier"].sum()))),
        ("objectives", ", ".join(f"{o.name} ({o.column}) {o.direction}" for o in objectives)),
        ("memory budget", budget),
        ("normal loss std range",
         "-" if rec.loss_std_limit is None else f"<= {tables.fmt_sig(rec.loss_std_limit)}"),
        ("per-step data", "steps.csv" if steps is not None else "absent (results.csv only)"),
        ("units", "GB = 1e9 bytes; step time is the median optimizer step in ms (warm-up excluded)"),
    ]


def build_report_data(analysed: pd.DataFrame, rec: Recommendation, objectives: tuple[Objective, ...],
                      steps: pd.DataFrame | None = None,
                      environment: dict[str, Any] | None = None) -> ReportData:
    """Assemble the report from the analysed frame (pareto.analyse_frontier) and a recommendation."""
    notes = ["GB = 1e9 bytes (not GiB) everywhere in this report."]
    unplotted = analysed[(analysed["status"] != "oom")
                         & (analysed["peak_mem_gb"].isna() | analysed["step_time_ms"].isna())]
    if len(unplotted):
        notes.append(f"{len(unplotted)} trial(s) without a memory and step-time measurement are not in "
                     "the scatter plot; they are listed in the tables: "
                     + ", ".join(f"{t} ({s})" for t, s in zip(unplotted["trial_id"], unplotted["status"])))
    ineligible_ok = analysed[(analysed["status"] == "ok") & ~analysed["eligible"]]
    if len(ineligible_ok):
        notes.append("Completed but missing an objective metric (NaN), so not compared for the frontier: "
                     + ", ".join(ineligible_ok["trial_id"]))
    names = [o.name for o in objectives]
    figs = [
        _figure("plot-memory-time", "Each point is a trial; the ringed points joined by the dotted line are "
               "the Pareto frontier. Colour: loss std. Shape: checkpoint level. OOM trials have no step "
               "time and are drawn on the budget line.",
               figures.memory_time_scatter(analysed, rec.memory_budget_gb, rec.usable_memory_gb, names)),
        _figure("plot-dimensions", "Memory and step time against each of the four swept dimensions.",
               figures.dimension_panels(analysed, rec.memory_budget_gb)),
    ]
    if steps is not None and len(steps):
        figs.append(_figure("plot-loss", "DPO loss per optimizer step, one line per trial (dotted: not ok).",
                           figures.step_curves(steps, analysed, "loss", "Loss per step", "loss")))
        figs.append(_figure("plot-memory-steps", "Peak memory per optimizer step, one line per trial.",
                           figures.step_curves(steps, analysed, "peak_mem_gb", "Peak memory per step",
                                               "peak memory (GB)")))
    else:
        notes.append("steps.csv is absent or empty: the per-step loss and memory curves are not shown.")
    ordered = tables.memory_order(analysed)
    row_classes = [(f"status-{s}" if s in STATUSES else "status-other") + (" frontier" if on else "")
                   for s, on in zip(ordered["status"], ordered["on_frontier"])]
    models = sorted({m for m in analysed["model"] if m})
    return ReportData(
        title="DPO sweep report" + (f": {', '.join(models)}" if models else ""),
        summary=_summary(analysed, rec, objectives, steps),
        recommendation_headline=_headline(rec),
        recommendation_reason=rec.reason,
        recommendation_json=rec.to_json_dict(),
        figures=figs,
        frontier_table=Table(tables.FRONTIER_HEADER, tables.frontier_rows(analysed),
                             row_classes),
        trials_table=Table(tables.TRIALS_HEADER, tables.trial_rows(analysed),
                           row_classes),
        environment=flatten(environment) if environment else [],
        notes=notes,
    )
