"""The frontier table (frontier.md's contract shape) and the all-trials table, as rows of strings.

Both the markdown file and the HTML report render these same rows, so they cannot disagree.
Cell rules for the frontier table:

* ``ok`` rows: numbers (``-`` for a NaN metric), last column ``yes``/``no``.
* ``oom`` and ``error`` rows: ``OOM``/``error`` in the memory column, dashes elsewhere, ``-`` last
  (nothing they measured is a result).
* ``pruned`` rows: ``pruned`` in the memory column (they never ran), dashes elsewhere, ``-`` last.
* ``diverged`` rows: whatever they measured, the status in the loss std column (their loss std is
  not a stability figure), ``-`` last.
* A step time extrapolated from a shorter accumulation (``step_time_source``) starts with ``≈``.

Both tables carry every swept train field (lr, seed, ...) as a column after beta, and the
stability verdict after loss std when the results have one.
Rows are sorted by peak memory, rows without a trusted peak (OOM, error, pruned) last.
"""
from __future__ import annotations

import math
import statistics
from typing import Any

import pandas as pd

from dpo_sweep.config import TrainSpec
from dpo_sweep.core.dimensions import BY_KEY, KNOBS, LEVER_COLUMNS, RESOURCE_COLUMNS, TRAIN_COLUMNS
from dpo_sweep.core.held_out import HELD_OUT_COLUMNS
from dpo_sweep.core.status import Status, TimeSource
from dpo_sweep.records import RESULTS_COLUMNS

#: frontier.md's contract columns: the table's knobs by their labels, then the measurements.
FRONTIER_HEADER: tuple[str, ...] = (
    *(d.label for d in KNOBS), "peak memory (GB)", "step time (ms)", "tokens/s", "loss std", "on frontier",
)
#: The loss-std objective's column: pooled over same-maths trials (analysis/noise_floor.py).
POOLED_COLUMN = "loss_std_pooled"
#: Columns the analysis adds (pareto.analyse_frontier): no part of a trial's set-up.
DERIVED_COLUMNS = (POOLED_COLUMN, "eligible", "throughput_low", "throughput_high", "on_frontier",
                   "frontier_distance", "frontier_rank")
TRIALS_HEADER: tuple[str, ...] = (
    "trial", "status", BY_KEY["model"].label, "seq_len", *(d.label for d in KNOBS),
    BY_KEY["effective_batch"].label, *LEVER_COLUMNS, "peak memory (GB)", "predicted peak (GB)", "torch peak alloc (GB)",
    "step time (ms)", "step time p10-p90 (ms)", "tokens/s", "MFU", "loss mean", "loss std", "grad norm",
    "reward accuracy", "frontier rank (distance)", "measured by", "time from", "stability from",
    "error",
)
#: The held-out scores (data.eval_pairs) the tables show where a sweep has them: header, column,
#: and 0 for fixed decimals (an accuracy) or 1 for significant digits (a margin, a loss: 2e-05).
HELD_OUT_SHOWN: tuple[tuple[str, str, int], ...] = (
    ("eval accuracy", HELD_OUT_COLUMNS["eval_reward_accuracy"], 0),
    ("eval margin", HELD_OUT_COLUMNS["eval_reward_margin"], 1),
    ("eval loss", "eval_loss", 1),
)
_NO_MEASUREMENT = {Status.OOM: "OOM", Status.ERROR: "error", Status.PRUNED: "pruned"}
#: Contract columns that hold a train setting: a column of the tables when the trials differ in it.
_SETTING_COLUMNS = ("loss_type", "precision", "reference")
#: Marks the step time of a row whose time was extrapolated from a shorter accumulation.
EXTRAPOLATED_MARK = "\u2248"


def is_finite(value: Any) -> bool:
    """A real, finite number (None, pd.NA, NaN, inf and non-numbers are not)."""
    try:
        return value is not None and value is not pd.NA and math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def fmt_int(value: Any) -> str:
    return str(int(value)) if is_finite(value) else "-"


def fmt_float(value: Any, decimals: int) -> str:
    """Fixed decimals, thousands separated (``50,515.0``), as the reasons write numbers."""
    return f"{float(value):,.{decimals}f}" if is_finite(value) else "-"


def fmt_sig(value: Any, digits: int = 3) -> str:
    """Significant digits, plain notation for ordinary magnitudes (0.0213, 1,840, 26,197)."""
    if not is_finite(value):
        return "-"
    v = float(value)
    if v != 0 and (abs(v) >= 1e9 or abs(v) < 1e-4):
        return f"{v:.{digits}g}"
    if abs(v) >= 10 ** (digits - 1):
        return f"{v:,.0f}"
    return f"{v:.{digits}g}"


def fmt_beta(value: Any) -> str:
    return f"{float(value):g}" if is_finite(value) else "-"


def swept_train_columns(df: pd.DataFrame) -> list[str]:
    """results.csv's columns of swept train fields (lr, seed, ...): :func:`swept_train_fields`."""
    return swept_train_fields(df.columns)


def varying_columns(df: pd.DataFrame) -> list[str]:
    """The set-up columns besides micro_batch, checkpoint_level, grad_acc and beta whose values
    differ between the rows of ``df``: ``model``, the memory levers and the swept train columns.
    Wherever rows are told apart (frontier.md, the recommendation) these are named too: two
    models, or two learning rates, at one micro_batch / checkpoint / grad_acc / beta look
    identical otherwise."""
    candidates = ([c for c in ("model", *RESOURCE_COLUMNS, *LEVER_COLUMNS) if c in df.columns]
                  + train_setting_columns(df) + swept_train_columns(df))
    return [c for c in candidates if df[c].astype(str).nunique() > 1]


def train_setting_columns(df: pd.DataFrame) -> list[str]:
    """results.csv's fixed columns that hold a train field under its own name (``trainer``,
    ``attn_implementation``, ...), besides the levers and :data:`_SETTING_COLUMNS`: a sweep over
    such a field shows it wherever the swept fields show, with no list to keep up to date."""
    fields = set(TrainSpec.model_fields)
    return [c for c in df.columns if c in RESULTS_COLUMNS and c not in (*LEVER_COLUMNS, *_SETTING_COLUMNS)
            and (TRAIN_COLUMNS.get(c) == c or (c in fields and c not in TRAIN_COLUMNS))]


def named_settings(rec: Any) -> list[str]:
    """The settings a recommendation names beside micro_batch, checkpoint, grad_acc and beta: the
    model and levers that vary in the sweep, then every swept train field of its config in the
    results' column order (frontier.md's)."""
    swept = swept_train_fields(rec.config)
    return [k for k in rec.varying if k not in swept] + swept


def swept_columns(df: pd.DataFrame, levers: bool = False) -> list[str]:
    """The results columns of swept train fields (``lr``, ``seed``, ``adaptive_clip``, ...: the
    columns named after a train field that the fixed schema lacks), after the setting columns
    (loss_type, precision, reference) in which the trials differ; with ``levers``, the adapter and
    optimizer too when they differ (the frontier's table; the all-trials table has them always)."""
    settings = ("model", *RESOURCE_COLUMNS, *(LEVER_COLUMNS if levers else ()), *_SETTING_COLUMNS,
                *train_setting_columns(df))
    varying = [c for c in settings if c in df and df[c].dropna().astype(str).nunique() > 1]
    return varying + swept_train_fields(df.columns)


def swept_train_fields(columns: Any) -> list[str]:
    """The columns among ``columns`` that a swept train field adds to results.csv (``lr``, ``seed``)."""
    names = set(TrainSpec.model_fields) | set(TRAIN_COLUMNS.values())
    return [c for c in columns if c not in RESULTS_COLUMNS and c in names]


def fmt_setting(value: Any) -> str:
    """A swept value: numbers in ``g`` form (1e-05, 0.99, 3), text as it is, empty as ``-``."""
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, bool) or str(value) in ("True", "False"):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return f"{float(value):g}"
    return str(value) or "-"


def has_verdicts(df: pd.DataFrame) -> bool:
    """Whether any row has a stability verdict (stable, noisy, diverging)."""
    return "stability" in df and bool(df["stability"].map(lambda v: isinstance(v, str) and bool(v)).any())


def _verdict(r: Any) -> str:
    v = r.get("stability")
    return v if isinstance(v, str) and v else "-"


def fmt_ms(value: Any) -> str:
    """A time in ms: one decimal under a second (57.3), whole milliseconds above (50,515)."""
    return fmt_float(value, 1 if is_finite(value) and abs(float(value)) < 1000 else 0)


def _step_time(r: Any) -> str:
    text = fmt_ms(r["step_time_ms"])
    return EXTRAPOLATED_MARK + text if r.get("step_time_source") == TimeSource.EXTRAPOLATED and text != "-" else text


def held_out_shown(df: pd.DataFrame) -> list[tuple[str, str, int]]:
    """The :data:`HELD_OUT_SHOWN` scores some row of ``df`` has, in a sweep scored on a held-out
    split (some row has a held-out accuracy): without one, ``eval_loss`` is a held batch of the
    training pairs (train.evaluate), no held-out score."""
    def scored(column: str) -> bool:
        return column in df and bool(pd.to_numeric(df[column], errors="coerce").notna().any())
    if not scored(HELD_OUT_COLUMNS["eval_reward_accuracy"]):
        return []
    return [h for h in HELD_OUT_SHOWN if scored(h[1])]


def _held_out(r: Any, shown: list[tuple[str, str, int]]) -> list[str]:
    return [fmt_sig(r.get(column), 3) if significant else fmt_float(r.get(column), 3) for _, column, significant in shown]


def frontier_header(df: pd.DataFrame) -> tuple[str, ...]:
    """FRONTIER_HEADER with the swept train fields after beta, ``stability`` after loss std and
    the held-out scores after it (where the sweep has them)."""
    base = list(FRONTIER_HEADER)
    return tuple(base[:4] + swept_columns(df, levers=True) + base[4:8] + (["stability"] if has_verdicts(df) else [])
                 + [h[0] for h in held_out_shown(df)] + base[8:])


def trials_header(df: pd.DataFrame) -> tuple[str, ...]:
    """TRIALS_HEADER with the swept train fields after beta and ``stability`` after loss std."""
    base = list(TRIALS_HEADER)
    beta, std = base.index("beta") + 1, base.index("loss std") + 1
    return tuple(base[:beta] + swept_columns(df) + base[beta:std] + (["stability"] if has_verdicts(df) else [])
                 + base[std:])


def memory_order(df: pd.DataFrame) -> pd.DataFrame:
    """Rows sorted by peak memory; rows without a trusted peak (OOM, error, NaN) last."""
    untrusted = df["status"].isin(list(_NO_MEASUREMENT)) | df["peak_mem_gb"].astype(float).isna()
    key = df.assign(_untrusted=untrusted, _mem=df["peak_mem_gb"].astype(float).fillna(math.inf))
    key = key.sort_values(["_untrusted", "_mem", "micro_batch", "trial_id"], kind="mergesort")
    return key.drop(columns=["_untrusted", "_mem"])


def frontier_rows(analysed: pd.DataFrame) -> list[list[str]]:
    """One row of strings per trial, in :func:`frontier_header`'s columns, sorted by memory."""
    rows, swept, verdicts = [], swept_columns(analysed, levers=True), has_verdicts(analysed)
    shown = held_out_shown(analysed)
    for _, r in memory_order(analysed).iterrows():
        config = [fmt_int(r["micro_batch"]), str(r["checkpoint_level"]), fmt_int(r["grad_acc"]),
                  fmt_beta(r["beta"])] + [fmt_setting(r[c]) for c in swept]
        verdict = [_verdict(r)] if verdicts else []
        status = r["status"]
        if status in _NO_MEASUREMENT:
            rows.append(config + [_NO_MEASUREMENT[status], "-", "-", "-"] + ["-"] * (len(verdict) + len(shown)) + ["-"])
            continue
        metrics = [fmt_float(r["peak_mem_gb"], 2), _step_time(r), fmt_sig(r["tokens_per_s"], 4),
                   fmt_sig(r["loss_std"], 3)]
        if status == Status.OK:
            rows.append(config + metrics + verdict + _held_out(r, shown) + ["yes" if r["on_frontier"] else "no"])
        else:  # a stopped learning trial keeps the scores of the rung it stopped at
            rows.append(config + metrics[:3] + [status or "unknown"] + verdict + _held_out(r, shown) + ["-"])
    return rows


def trial_rows(analysed: pd.DataFrame) -> list[list[str]]:
    """Every trial with its measurements, in :func:`trials_header`'s columns, sorted by memory."""
    rows, swept, verdicts = [], swept_columns(analysed), has_verdicts(analysed)
    for _, r in memory_order(analysed).iterrows():
        rank = r.get("frontier_rank")
        rows.append([
            str(r["trial_id"]), str(r["status"]), str(r["model"]), fmt_int(r["seq_len"]),
            fmt_int(r["micro_batch"]), str(r["checkpoint_level"]), fmt_int(r["grad_acc"]),
            fmt_beta(r["beta"]), *[fmt_setting(r[c]) for c in swept], fmt_int(r["effective_batch"]),
            str(r.get("adapter") or "full"), str(r.get("optimizer") or "adamw"),
            fmt_float(r["peak_mem_gb"], 2), _predicted(r.get("predicted_peak_gb")),
            fmt_float(r["torch_peak_alloc_gb"], 2), _step_time(r),
            _time_range(r), fmt_sig(r["tokens_per_s"], 4), fmt_sig(r["mfu"], 3),
            fmt_sig(r["loss_mean"], 4), fmt_sig(r["loss_std"], 3), *([_verdict(r)] if verdicts else []),
            fmt_sig(r["grad_norm_mean"], 3), fmt_sig(r["reward_accuracy"], 3), _rank(rank, r.get("frontier_distance")),
            _measured_by(r), _time_from(r), _stability_from(r),
            str(r["error"]),
        ])
    return rows


def _predicted(value: Any) -> str:
    """A predicted peak; none below zero (the model's fixed terms minus a CPU calibration can go
    negative, which is no peak): ``-``."""
    return fmt_float(value, 2) if is_finite(value) and float(value) >= 0 else "-"


def signed_pct(value: float) -> str:
    """``+1.2%``, ``-0.4%``, and ``0.0%`` (never ``-0.0%``)."""
    text = f"{value:+.1f}"
    return ("0.0" if text in ("+0.0", "-0.0") else text) + "%"


def _rank(rank: Any, distance: Any) -> str:
    """``1`` on the frontier, ``3 (0.042)`` off it: the rank and the scaled distance to the frontier."""
    if not is_finite(rank):
        return "-"
    return fmt_int(rank) if not is_finite(distance) or float(distance) == 0 else f"{fmt_int(rank)} ({fmt_sig(distance, 2)})"


def _time_range(r: Any) -> str:
    """``573.0-581.2``; one value when there is no spread (one measured step)."""
    low, high = fmt_ms(r["step_time_p10_ms"]), fmt_ms(r["step_time_p90_ms"])
    return low if low == high else f"{low}-{high}"


def short_id(trial_id: str) -> str:
    """``t045 learning`` of ``t045_mb8_none_ga8_b0.05-learning``: the index and the kind."""
    head = trial_id.split("_", 1)[0]
    if trial_id.endswith("-learning"):
        return head.removesuffix("-learning") + " learning"  # a space: the cell may wrap there
    return head


def _other(r: Any, column: str) -> str | None:
    """``column``'s trial id when it names another trial than the row's own."""
    by = r.get(column)
    return str(by) if isinstance(by, str) and by and by != r["trial_id"] else None


def _measured_by(r: Any) -> str:
    """Whose memory measurement a row carries: ``-`` for its own (or none: an older results dir);
    ``predicted`` for a pruned row, which never ran."""
    if r["status"] == Status.PRUNED:
        return "predicted"
    other = _other(r, "measured_by")
    return short_id(other) if other else "-"


def _time_from(r: Any) -> str:
    """``measured``, ``extrapolated`` (from a shorter accumulation) or ``runoff t012`` (a full run)."""
    source = r.get("step_time_source")
    if not isinstance(source, str) or not source:
        return "-"
    timed_by = r.get("timed_by")
    return f"{source} {short_id(timed_by)}" if isinstance(timed_by, str) and timed_by else source


def _stability_from(r: Any) -> str:
    other = _other(r, "stability_from")
    return short_id(other) if other else "-"


def measured_on_cpu(row: Any, environment: dict[str, Any] | None = None) -> bool:
    """Whether a row's peak is a CPU process's RSS: its ``device`` is the CPU, or - a row without
    one (an older results.csv) - environment.json's machine had no GPU."""
    device = row.get("device")
    if isinstance(device, str) and device:
        return device.split(":")[0] == "cpu"
    return bool(environment) and environment.get("gpu_count") == 0


def prediction_error(analysed: pd.DataFrame, environment: dict[str, Any] | None = None) -> str | None:
    """The memory model's error over the rows that measured their own peak on a GPU, in a
    sentence; None when no row has both a prediction and a measurement. The model predicts GPU
    memory (tensors, allocator, CUDA context); a CPU trial measures the process's RSS (the Python
    interpreter, the libraries, every buffer), so a CPU row is named, never compared: a "-52%"
    there would be an error of the comparison, not of the model."""
    if "predicted_peak_gb" not in analysed:
        return None
    own = analysed[(analysed["status"] == Status.OK) & (analysed.get("measured_by", analysed["trial_id"]) == analysed["trial_id"])]
    pairs = [(float(r["predicted_peak_gb"]), float(r["peak_mem_gb"]), measured_on_cpu(r, environment))
             for _, r in own.iterrows()
             if is_finite(r["predicted_peak_gb"]) and is_finite(r["peak_mem_gb"]) and float(r["peak_mem_gb"]) > 0]
    on_cpu = sum(cpu for _, _, cpu in pairs)
    cpu_note = (f"{on_cpu} CPU trial(s) not compared: the model predicts GPU memory, a CPU trial "
                "measures the process's RSS (Python, libraries, every buffer)")
    errors = [100 * (p - m) / m for p, m, cpu in pairs if not cpu]
    if not errors:
        return cpu_note if on_cpu else None
    worst, median = max(errors, key=abs), statistics.median(errors)
    return (f"predicted vs measured peak over {len(errors)} measured trial(s): median error {signed_pct(median)}, "
            f"largest {signed_pct(worst)} (the prediction each was scheduled with; positive: over-predicted)"
            + (f"; {cpu_note}" if on_cpu else ""))


def _md_cell(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def to_markdown(header: tuple[str, ...] | list[str], rows: list[list[str]]) -> str:
    """A GitHub-flavoured markdown table (pipes in cells escaped)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def frontier_markdown(analysed: pd.DataFrame) -> str:
    """frontier.md's table text."""
    return to_markdown(frontier_header(analysed), frontier_rows(analysed))


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _counted(groups: dict[tuple[int, str], set[str]]) -> str:
    """``3 learning trials of 16 steps in bf16-mixed and 1 of 16 steps in bf16``."""
    parts = [f"{len(ids)} of {steps} steps in {precision}" for (steps, precision), ids in groups.items()]
    plural = "s" if len(next(iter(groups.values()))) > 1 else ""
    parts[0] = parts[0].replace(" of ", f" learning trial{plural} of ", 1)
    return " and ".join(parts)


def stability_source(analysed: pd.DataFrame) -> str | None:
    """Which trials the stability columns (loss std, the verdict and its signals) come from - how
    many, of how many steps, in which precision - and why they differ from the space's own steps
    and precision; None for a results file without ``stability_steps`` (an older version)."""
    if "stability_steps" not in analysed or "stability_precision" not in analysed:
        return None
    rows = analysed[(analysed["status"] == Status.OK) & analysed["stability_steps"].map(is_finite)]
    if rows.empty:
        return None
    groups: dict[tuple[int, str], set[str]] = {}
    for _, r in rows.iterrows():
        groups.setdefault((int(r["stability_steps"]), _text(r["stability_precision"])), set()).add(str(r["stability_from"]))
    if (rows["stability_from"] == rows["trial_id"]).all():
        runs = " or ".join(f"{s} steps in {p}" for s, p in groups)
        return f"Stability columns (loss std, stability and its signals) from each trial's own run of {runs}."
    why = []
    spaces = {_text(p) for p in rows["precision"]} - {""} if "precision" in rows else set()
    learned = {p for _, p in groups}
    if spaces and learned - spaces:
        lrs = sorted({float(v) for v in rows["lr"] if is_finite(v)}) if "lr" in rows else []
        updates = "lr " + " and ".join(f"{v:g}" for v in lrs) if lrs else "small learning rates"
        why.append(f"the space trains in pure bf16, where updates of {updates} round away (docs/trainer.md \"Precision\")"
                   if spaces == {"bf16"} else f"the space trains in {' and '.join(sorted(spaces))} "
                   "(train.learning_precision)")
    # Not "the space's N steps": results.csv's ``steps`` counts the worst-case step too.
    why.append("their length is train.learning_steps (a stability verdict needs 5 steps and the rollback "
               "trigger 5 in a row; on the H200 it fired at steps 9-13)")
    notes = sorted({_text(n) for n in rows.get("stability_note", pd.Series(dtype=object))} - {""})
    if notes:
        why.append(f"{len(notes)} learning trial(s) ran in the space's precision instead: {notes[0]}")
    return (f"Stability columns (loss std, stability and its signals) from {_counted(groups)}"
            + (": " + "; ".join(why) if why else "") + ".")


def row_of(analysed: pd.DataFrame, trial_id: str | None) -> pd.Series | None:
    """The row of ``trial_id`` in an analysed table (None: no such trial, or no id)."""
    rows = analysed[analysed["trial_id"].astype(str) == str(trial_id)] if trial_id is not None else analysed[:0]
    return rows.iloc[0] if len(rows) else None
