"""The report's content as plain data ("compute, then render"): the template only fills it in.

Everything the HTML shows is in :class:`ReportData`: strings (escaped later by the template's
autoescape), tables as rows of strings, figures as plotly dict specs. Tests check this data
directly; ``report.html`` is a rendering of it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from dpo_sweep.analysis import effects, noise_floor, tables
from dpo_sweep.analysis.pareto import Objective
from dpo_sweep.analysis.recommend import Recommendation
from dpo_sweep.analysis.winner import Winner
from dpo_sweep.core.status import Status
from dpo_sweep.results_dir import ResultsDir
from dpo_sweep.core.stability import ROLLBACK_LOGRATIO_STD, ROLLBACK_STEPS
from dpo_sweep.analysis.completeness import Completeness
from dpo_sweep.report import curves, figures, headline, heatmap, parallel, scatter
from dpo_sweep.report.data_shape import data_shape_section


#: Longest error shown in full; a longer or multi-line one shows its first line, cut to this, and
#: folds the whole text behind a toggle.
ERROR_SUMMARY_CHARS = 160
#: Columns of the all-trials table kept even when every trial has the same value; any other column
#: with one value for all (one model, one beta, no MFU on a CPU ...) is stated once above the table,
#: so the columns that vary have the room at 1280 px.
#: All-trials columns shown as another cell's tooltip instead (the width goes to what varies): torch's
#: peak allocation on the peak memory, the p10-p90 step times on the step time.
_ALLOC_COLUMN = "torch peak alloc (GB)"
_RANGE_COLUMN = "step time p10-p90 (ms)"
#: Columns whose ``-`` means the row's own measurement, not a missing value.
_OWN_WHEN_EMPTY = ("measured by", "stability from")
_ALWAYS_SHOWN = ("trial", "status", "peak memory (GB)", "step time (ms)", "tokens/s", "loss std")
#: Trials named per status in the failure summary before "and N more".
MAX_IDS_PER_FAILURE = 10


@dataclass(frozen=True)
class Cell:
    """One table cell: the text shown, the full value on hover, a long value behind a toggle."""

    text: str
    title: str = ""
    """Shown on hover: the full value when ``text`` is a short form of it."""
    detail: str = ""
    """The whole value, behind a <details> toggle whose summary is ``text`` (long errors)."""


@dataclass(frozen=True)
class Table:
    """A table as cells: header, rows, and one CSS class per row (its status)."""

    header: tuple[str, ...]
    rows: list[list[Cell]]
    row_classes: list[str] = field(default_factory=list)
    row_notes: list[Cell] = field(default_factory=list)
    """Per row, a line across the whole table under it (a failed trial's error), or an empty Cell.
    Errors get a full-width line, not a column: a column wide enough to read one would push the
    table off the page."""
    shared: list[tuple[str, str]] = field(default_factory=list)
    """(column, value) for the columns left out because every row has the same value."""
    empty: list[str] = field(default_factory=list)
    """The columns left out because no row has a value (``-`` in every row)."""
    row_ids: list[str] = field(default_factory=list)
    """Each row's full trial id (the page's filters show and hide rows by it); [] when rows are no trials."""


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
    plots_note: str
    """Why there are no plots (nothing completed); empty when there are."""
    failures: list[str]
    """One line per failed status: how many, which trials, the first error."""
    frontier_table: Table
    trials_table: Table
    environment: list[tuple[str, str]]
    notes: list[str]
    data_shape: list[str] = field(default_factory=list)
    """The data's lengths, truncated/dropped pairs and padding (data.json, results.csv)."""
    use_it: list[str] = field(default_factory=list)
    """How to run the winner: the recommended.yaml commands (or why there is none)."""
    use_commands: tuple[str, ...] = ()
    """The commands that check and run recommended.yaml (empty without one)."""
    trl_code: str = ""
    """The winner as TRL DPOConfig arguments, with what TRL cannot express ("" without a winner)."""
    forecast: list[str] = field(default_factory=list)
    """The whole run's forecast and estimates on other cards (analysis/forecast.py's lines)."""
    bullets: list[str] = field(default_factory=list)
    """The headline card: room to spare, why it won, the runner-up's cost, what to watch."""
    filter_data: dict[str, Any] = field(default_factory=dict)
    """The parallel coordinates' axes and each trial's values, for the page's status and value filters."""
    effect_table: Table | None = None
    """Per dimension and value: the median change in peak GB and tokens/s with the rest held."""
    effect_note: str = ""
    """The dimensions the effect table leaves out (never varied with the rest held)."""
    banners: list[headline.Banner] = field(default_factory=list)
    """Warnings above everything: an unfinished sweep, extrapolated figures, pending stability, noise."""


def flatten(data: Any, prefix: str = "") -> list[tuple[str, str]]:
    """Nested dicts/lists as ``("gpu.driver", "580.159.04")`` pairs, in file order."""
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


def compact_trial_ids(trial_ids: Any) -> dict[str, str]:
    """Short ids for the tables: the part before the first ``_`` (``t004`` of
    ``t004_mb16_none_ga1_b0.1``, whose knobs have their own columns) when those parts tell every
    trial apart; else the full ids."""
    ids = list(dict.fromkeys(str(t) for t in trial_ids))
    heads = [t.split("_", 1)[0] for t in ids]
    if all(heads) and len(set(heads)) == len(ids):
        return dict(zip(ids, heads))
    return {t: t for t in ids}


def _first_line(text: str, max_chars: int) -> str:
    first = text.strip().split("\n", 1)[0].strip()
    return first if len(first) <= max_chars else first[:max_chars - 1] + "\u2026"


def error_cell(error: str, max_chars: int = ERROR_SUMMARY_CHARS) -> Cell:
    """A short one-line error as it is; a long or multi-line one (a CUDA OOM message with its
    traceback) as its first line, cut to max_chars, with the whole text behind a toggle."""
    text = error.strip()
    if len(text) <= max_chars and "\n" not in text:
        return Cell(text)
    return Cell(_first_line(text, max_chars), detail=text)


def _trial_table(analysed: pd.DataFrame, short_ids: dict[str, str], row_classes: list[str]) -> Table:
    """The all-trials table: compact ids (the full id on hover), each error on a line of its own."""
    full_header = tables.trials_header(analysed)
    trial_col, error_col = full_header.index("trial"), full_header.index("error")
    alloc_col, peak_col = full_header.index(_ALLOC_COLUMN), full_header.index("peak memory (GB)")
    range_col, time_col = full_header.index(_RANGE_COLUMN), full_header.index("step time (ms)")
    dropped = (error_col, alloc_col, range_col)
    rows, notes = [], []
    for row in tables.trial_rows(analysed):
        cells = [Cell(c) for c in row]
        cells[trial_col] = Cell(short_ids[row[trial_col]], title=row[trial_col])
        if row[alloc_col] != "-":  # torch's own peak: on hover over the peak, not a column of its own
            cells[peak_col] = Cell(row[peak_col], title=f"torch peak allocated {row[alloc_col]} GB")
        if row[range_col] != "-":  # the p10-p90 step times: on hover over the step time
            cells[time_col] = Cell(row[time_col], title=f"p10-p90 step time {row[range_col]} ms")
        rows.append([c for i, c in enumerate(cells) if i not in dropped])
        notes.append(error_cell(row[error_col]))
    header, rows, shared = _drop_shared_columns(
        [h for i, h in enumerate(full_header) if i not in dropped], rows)
    own = {c: "each trial's own" for c in _OWN_WHEN_EMPTY}  # "-" in these columns: the row's own measurement
    return Table(header, rows, row_classes, row_notes=notes, row_ids=list(tables.memory_order(analysed)["trial_id"].astype(str)),
                 shared=[(c, own.get(c, v) if v == "-" else v) for c, v in shared if v != "-" or c in own],
                 empty=[c for c, v in shared if v == "-" and c not in own])


def _drop_shared_columns(header: list[str], rows: list[list[Cell]]
                         ) -> tuple[tuple[str, ...], list[list[Cell]], list[tuple[str, str]]]:
    """Header and rows without the columns whose value is the same in every row (two rows or
    more; not the _ALWAYS_SHOWN ones), and those columns with their one value."""
    shared = [i for i, h in enumerate(header) if h not in _ALWAYS_SHOWN and len(rows) > 1
              and len({row[i].text for row in rows}) == 1]
    keep = [i for i in range(len(header)) if i not in shared]
    return (tuple(header[i] for i in keep), [[row[i] for i in keep] for row in rows],
            [(header[i], rows[0][i].text) for i in shared])


def failure_lines(analysed: pd.DataFrame, short_ids: dict[str, str]) -> list[str]:
    """What failed, one line per status that is not ok: ``3 oom: t000, t001, t002. First error: ...``."""
    lines = []
    for status, rows in analysed[analysed["status"] != Status.OK].groupby("status", sort=False):
        ids = [short_ids[str(t)] for t in rows["trial_id"]]
        named = ", ".join(ids[:MAX_IDS_PER_FAILURE]) + (
            f" and {len(ids) - MAX_IDS_PER_FAILURE} more" if len(ids) > MAX_IDS_PER_FAILURE else "")
        errors = [str(e) for e in rows["error"] if str(e).strip()]
        first = f". First error: {_first_line(errors[0], ERROR_SUMMARY_CHARS)}" if errors else ""
        lines.append(f"{len(ids)} {status or 'unknown'}: {named}{first}")
    return lines


def _plots_note(completed: bool, has_curves: bool) -> str:
    if completed:
        return ""
    if has_curves:
        return ("No trial completed, so the memory and step-time plots are left out; the per-step "
                "curves show how the trials went. What failed is listed above.")
    return ("No trial completed, so there is nothing to plot: what failed is listed above and each "
            "error is in the All trials table.")


#: The per-step plots: (DOM id, steps.csv column, title, y axis, caption, threshold line or None).
_STEP_PLOTS: tuple[tuple[str, str, str, str, str, tuple[float, str] | None], ...] = (
    ("plot-loss", "loss", "Loss per step", "loss", "DPO loss per optimizer step, one line per trial (dotted: not ok).", None),
    ("plot-grad-norm", "grad_norm", "Gradient norm per step", "grad norm (before clipping)",
     "The total gradient norm per optimizer step: spikes are the first sign of instability.", None),
    ("plot-logratio-std", "logratio_std", "Log-ratio std per step", "std of log(pi/pi_ref) per token",
     f"How far the policy's per-token log-ratio to the reference spreads. Above the dashed line for "
     f"{ROLLBACK_STEPS} steps in a row the stability verdict is diverging (the rollback step).",
     (ROLLBACK_LOGRATIO_STD, f"rollback threshold {ROLLBACK_LOGRATIO_STD:g} ({ROLLBACK_STEPS} steps in a row)")),
    ("plot-reward-accuracy", "reward_accuracy", "Reward accuracy per step", "reward accuracy (chosen > rejected)",
     "Share of pairs whose chosen reward beats the rejected one (TRL's rewards/accuracies).", None),
    ("plot-step-time", "step_time_ms", "Step time per step", "step time (ms)",
     "Wall time of each optimizer step (the warm-up steps included: they are the slow first ones).", None),
    ("plot-memory-steps", "peak_mem_gb", "Peak memory per step", "peak memory (GB)", "Peak memory per optimizer step, one line per trial.",
     None),
)


def _figure(dom_id: str, caption: str, spec: dict[str, Any]) -> Figure:
    return Figure(dom_id, caption, {**spec, "config": dict(figures.PLOT_CONFIG)})


def scatter_caption(analysed: pd.DataFrame) -> str:
    """What the scatter's channels encode, for this sweep's swept dimensions."""
    enc = scatter.encoding(analysed)
    shape = "checkpoint level" if enc.symbol == "checkpoint_level" else enc.symbol
    parts = ["Each point is a trial; the ringed points joined by the dotted line are the Pareto frontier"
             + (" (ringed in every panel they fall in)." if enc.facets else ".") + " Throughput, not step time: a step of a larger effective "
             "batch does more work. Bars: the throughput over the p10-p90 step times widened for the steps measured (few steps, wider bars); trials whose bars "
             "overlap are tied, and ties go to less memory.",
             "Colour: loss std (blue: none measured; a diverging trial in dark red: its loss std is no stability "
             f"figure). Shape: {shape}."]
    if enc.size:
        parts.append("Size: micro_batch.")
    if enc.facets:
        parts.append("One panel per " + " x ".join(enc.facets) + ".")
    if enc.hover_only:
        parts.append("In the hover and the panels below: " + ", ".join(enc.hover_only) + ".")
    parts.append("The green ring with a dot and the arrow: the recommended trial.")
    if analysed["status"].isin([Status.OOM, Status.PRUNED]).any():
        parts.append("OOM and pruned trials have no throughput: they sit in the strip under each panel, OOM at its "
                     "measured peak (else the budget), pruned at its predicted peak.")
    return " ".join(parts)


def _headline(rec: Recommendation) -> str:
    if rec.trial_id is None:
        return "No configuration fits"
    c = rec.config
    return (f"Use micro_batch {c.get('micro_batch')}, checkpoint {c.get('checkpoint_level')}, "
            f"grad_acc {c.get('grad_acc')}, beta {tables.fmt_beta(c.get('beta'))}"
            + "".join(f", {k} {tables.fmt_setting(c.get(k))}" for k in tables.named_settings(rec)) + f" (trial {rec.trial_id})")


def _summary(analysed: pd.DataFrame, rec: Recommendation, objectives: tuple[Objective, ...],
             steps: pd.DataFrame | None, environment: dict[str, Any] | None) -> list[tuple[str, str]]:
    counts = analysed["status"].value_counts()
    budget = "none given" if rec.memory_budget_gb is None else (
        f"{rec.memory_budget_gb:.2f} GB (from {rec.budget_source}); usable "
        f"{rec.usable_memory_gb:.2f} GB after a {100 * rec.safety_margin:g}% safety margin")
    models = sorted({m for m in analysed["model"] if m})
    return [
        ("model", ", ".join(models) or "-"),
        ("trials", f"{len(analysed)} (" + ", ".join(f"{n} {s}" for s, n in counts.items()) + ")"),
        ("on the frontier", str(int(analysed["on_frontier"].sum()))),
        ("objectives", ", ".join(f"{o.name} ({o.column}) {o.direction}" + (f", {o.note}" if o.note else "")
                                 for o in objectives)),
        ("memory budget", budget),
        ("normal loss std range",
         "-" if rec.loss_std_limit is None else f"<= {tables.fmt_sig(rec.loss_std_limit)}"),
        ("memory model", tables.prediction_error(analysed, environment) or "no prediction with a measured peak"),
        ("per-step data", ResultsDir.STEPS if steps is not None else f"absent ({ResultsDir.RESULTS} only)"),
        ("units", "step time is the median optimizer step in ms (warm-up excluded); "
                  "tokens/s the median of the measured steps' throughputs"),
    ]


def build_report_data(analysed: pd.DataFrame, rec: Recommendation, objectives: tuple[Objective, ...],
                      steps: pd.DataFrame | None = None,
                      environment: dict[str, Any] | None = None,
                      datasets: list[dict[str, Any]] | None = None,
                      winner: Winner | None = None, state: Completeness | None = None) -> ReportData:
    """Assemble the report from the analysed frame (pareto.analyse_frontier) and a recommendation."""
    notes: list[str] = []  # the page's first line states the units, once
    # With nothing completed the scatter and the panels would be empty axes (or OOM marks on
    # made-up step times): the report says what failed instead.
    completed = bool((analysed["status"] == Status.OK).any())
    unplotted = analysed[(analysed["status"] != Status.OOM)
                         & (analysed["peak_mem_gb"].isna() | analysed["tokens_per_s"].isna())]
    if len(unplotted) and completed:
        notes.append(f"{len(unplotted)} trial(s) without a memory and throughput measurement are not in "
                     "the scatter plot; they are listed in the tables: "
                     + ", ".join(f"{t} ({s})" for t, s in zip(unplotted["trial_id"], unplotted["status"])))
    diverging = analysed["stability"].astype(object) == "diverging" if "stability" in analysed else False
    ineligible_ok = analysed[(analysed["status"] == Status.OK) & ~analysed["eligible"] & ~diverging]
    if len(ineligible_ok):
        notes.append("Completed but missing an objective metric (NaN), so not compared for the frontier: "
                     + ", ".join(ineligible_ok["trial_id"]))
    if source := tables.stability_source(analysed):
        notes.append(source)
    notes += [noise_floor.noise_floor_sentence(g) for g in noise_floor.noise_floor(analysed, steps)]
    names = [o.name for o in objectives]
    figs = [
        _figure("plot-memory-time", scatter_caption(analysed),
               scatter.memory_time_scatter(analysed, rec.memory_budget_gb, rec.usable_memory_gb, names, rec.trial_id)),
        _figure("plot-dimensions", "Memory and throughput against each swept dimension that varies (the swept train fields too).",
               figures.dimension_panels(analysed, rec.memory_budget_gb)),
    ] if completed else []
    if completed and heatmap.wanted(analysed):
        figs.append(_figure("plot-grid", "Each micro_batch x checkpoint level cell, per adapter: the lightest peak "
                            "memory and the highest tokens/s among its completed trials (the other dimensions vary "
                            "inside a cell; darker is better: less memory, more tokens/s); a cell without a "
                            "completed trial says how its trials ended.", heatmap.level_grid(analysed)))
    filter_data: dict[str, Any] = {}
    if completed:
        spec, filter_data = parallel.parallel_coordinates(analysed, rec.trial_id)
        figs.append(_figure("plot-parallel", "One line per trial across every swept dimension and the three objectives, "
                            "each axis scaled on its own (categories in order, numbers from their minimum to their "
                            "maximum; a gap: no value). The filters above show only the trials that pass, here and "
                            "in the All trials table.", spec))
    if steps is not None and len(steps):
        figs += [_figure(dom_id, caption, curves.step_curves(steps, analysed, column, title, y_title, threshold))
                 for dom_id, column, title, y_title, caption, threshold in _STEP_PLOTS
                 if column in steps and steps[column].notna().any()]  # no empty axes for an unmeasured column
    else:
        notes.append(f"{ResultsDir.STEPS} is absent or empty: the per-step curves (loss, grad norm, log-ratio std, "
                     "reward accuracy, step time, memory) are not shown.")
    has_curves = bool(figs)  # before the length histograms, which are no curves of the trials
    shape = data_shape_section(datasets or [], analysed)
    figs += [_figure(f"plot-lengths-{i}", caption, spec) for i, (caption, spec) in enumerate(shape.figures)]
    ordered = tables.memory_order(analysed)
    verdicts = ordered["stability"] if "stability" in ordered else pd.Series("", index=ordered.index)
    # A diverging row may sit on the frontier of its objectives, but it is never drawn as a best row.
    row_classes = [(f"status-{s}" if Status.of(s) else "status-other")
                   + (" verdict-diverging" if v == "diverging" else " frontier" if on else "")
                   for s, on, v in zip(ordered["status"], ordered["on_frontier"], verdicts)]
    models = sorted({m for m in analysed["model"] if m})
    short_ids = compact_trial_ids(analysed["trial_id"])
    return ReportData(
        title="DPO sweep report" + (f": {', '.join(models)}" if models else ""),
        summary=_summary(analysed, rec, objectives, steps, environment),
        recommendation_headline=_headline(rec),
        recommendation_reason=rec.reason,
        recommendation_json=rec.to_json_dict(),
        figures=figs,
        plots_note=_plots_note(completed, has_curves),
        failures=failure_lines(analysed, short_ids),
        frontier_table=Table(tables.frontier_header(analysed),
                             [[Cell(c) for c in row] for row in tables.frontier_rows(analysed)],
                             row_classes),
        trials_table=_trial_table(analysed, short_ids, row_classes),
        environment=flatten(environment) if environment else [],
        notes=notes,
        data_shape=shape.lines,
        use_it=_use_it(winner),
        use_commands=((f"dpo-sweep validate {ResultsDir.RECOMMENDED}", f"dpo-sweep trial {ResultsDir.RECOMMENDED}")
                      if winner and winner.trial else ()),
        trl_code=winner.trl_code() if winner else "",
        filter_data=filter_data,
        effect_table=_effect_table(analysed) if completed else None,
        effect_note=_effect_note(analysed) if completed else "",
        bullets=headline.headline_bullets(analysed, rec, objectives),
        banners=headline.banners(analysed, rec, state or Completeness(None)),
    )


def _use_it(winner: Winner | None) -> list[str]:
    if winner is None or (winner.trial is None and not winner.note):
        return []
    if winner.trial is None:
        return [f"No {ResultsDir.RECOMMENDED}: {winner.note}."]
    return [f"{ResultsDir.RECOMMENDED}, next to this report, is the winner with every setting pinned; in this "
            "folder the first command checks it, the second runs it once:",
            "The same configuration as TRL DPOConfig arguments (lines starting # name what TRL cannot express):"]


def _effect_table(analysed: pd.DataFrame) -> Table | None:
    rows = effects.effect_rows(effects.effects(analysed))
    return Table(effects.EFFECT_HEADER, [[Cell(c) for c in row] for row in rows]) if rows else None


def _effect_note(analysed: pd.DataFrame) -> str:
    left = effects.unpaired(effects.effects(analysed))
    return ("Not in the table (no two trials differ in it alone): " + ", ".join(left) + ".") if left else ""
