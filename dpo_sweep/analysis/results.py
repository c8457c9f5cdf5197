"""Loading a results directory for the analyser and the report (contract: docs/contracts.md#resultscsv).

The row types, their columns and the writers live in :mod:`dpo_sweep.records`, beside the
producers that write them; this module reads and checks what they wrote.
"""
from __future__ import annotations

import csv
import io
import math
from dataclasses import fields
from pathlib import Path
from typing import Any

from dpo_sweep import migrate
from dpo_sweep.core.status import Status
from dpo_sweep.errors import UserError  # standard library only
from dpo_sweep.config import CHECKPOINT_LEVELS
from dpo_sweep.records import (RESULTS_COLUMNS, STEPS_COLUMNS, StepRecord, TrialResult)
from dpo_sweep.csv_table import damaged_text, read_csv_table
from dpo_sweep.files import read_text
from dpo_sweep.text import excerpt, shown
from dpo_sweep.results_dir import ResultsDir

#: Columns without which no frontier can be computed; every other contract column is optional
#: when loading (a missing one is filled with NaN or "" so old or hand-made files still load).
ANALYSIS_REQUIRED_COLUMNS: tuple[str, ...] = (
    "trial_id", "status", "micro_batch", "checkpoint_level", "grad_acc", "beta",
    "peak_mem_gb", "step_time_ms", "tokens_per_s", "loss_std",
)
_TEXT_COLUMNS = ("trial_id", "status", "model", "checkpoint_level", "error", "mem_source",
                 "loss_type", "precision", "reference", "attn_implementation", "device", "stability",
                 "measured_by", "step_time_source", "stability_from",
                 "stability_precision", "stability_note", "timed_by", "adapter", "optimizer", "trainer",
                 "parallelism")



def _refuse_damaged(path: Path) -> None:
    """UserError naming every record of ``path`` that is no whole row (a cut-off last line): read
    as it is, a cut ``tokens_per_s`` of 4061 reads 40, and the cells after the cut are blank."""
    damaged = read_csv_table(path).damaged
    if damaged:
        raise UserError(
            f"{damaged_text(path, damaged)}. This is what a kill or a full disk during an append "
            "leaves; nothing from such a line is shown. `dpo-sweep run SPACE.yaml --output "
            f"{path.parent} --resume` runs its trial again and repairs the file (or delete the line "
            "to analyse the other rows)")


def _read_csv(path: Path) -> "Any":
    import pandas as pd

    _refuse_damaged(path)
    try:
        return pd.read_csv(io.StringIO(read_text(path), newline=""), dtype={c: "string" for c in _TEXT_COLUMNS},
                           keep_default_na=False, na_values=["", "nan", "NaN"])
    except pd.errors.EmptyDataError:
        raise UserError(f"{path} is empty: it needs a header line with the columns "
                          f"{', '.join(ANALYSIS_REQUIRED_COLUMNS)}; re-run the sweep to rewrite it") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as err:
        raise UserError(f"{path} is not a readable CSV file ({err}); "
                          "re-run the sweep to rewrite it") from None


#: How a hand-edited cell must read, by the row dataclass's field type.
_KIND_WORDS = {"int": "a whole number", "float": "a number", "bool": "true or false"}
_BOOL_TEXT = {"true": True, "false": False, "1": True, "0": False}
_SHOWN_PROBLEMS = 5


def _column_kinds(cls: type) -> dict[str, str]:
    """``int`` / ``float`` / ``bool`` of each numeric column of a row dataclass (its annotations)."""
    return {f.name: str(f.type) for f in fields(cls) if str(f.type) in _KIND_WORDS}


def _record_lines(path: Path) -> list[int]:
    """The file line each data row starts on, in pandas' row order: a quoted cell (an error
    message) may span lines, and blank or whitespace-only lines are no rows (pandas skips them)."""
    starts, line = [], 1
    reader = csv.reader(io.StringIO(read_text(path), newline=""))
    for record in reader:
        if len(record) > 1 or (record and record[0].strip()):
            starts.append(line)
        line = reader.line_num + 1
    return starts[1:]  # the header


def _bad_cells(raw: "Any", kind: str) -> "Any":
    """Mask of the cells of one column that hold text but not a value of ``kind`` (empty is fine)."""
    import pandas as pd

    text = raw.astype("string").str.strip()
    filled = raw.notna() & (text != "")
    if kind == "bool" and pd.api.types.is_numeric_dtype(raw) and not pd.api.types.is_bool_dtype(raw):
        return filled & ~raw.isin([0, 1])  # 1/0 cells mixed with empty ones are read as 1.0/0.0
    if kind == "bool":
        return filled & text.str.lower().map(_BOOL_TEXT).isna()
    number = pd.to_numeric(text, errors="coerce")
    bad = filled & number.isna()
    if kind == "int":
        bad |= number.notna() & (number % 1 != 0)
    return bad


def _convert(raw: "Any", kind: str) -> "Any":
    """A checked column as numbers (bools stay bools; ``true``/``FALSE`` text becomes bools)."""
    import pandas as pd

    if kind == "bool" and not (pd.api.types.is_bool_dtype(raw) or pd.api.types.is_numeric_dtype(raw)):
        return raw.astype("string").str.strip().str.lower().map(_BOOL_TEXT)
    return pd.to_numeric(raw, errors="coerce")


def _refuse_problems(path: Path, df: "Any", problems: list[tuple[int, str]], what: str) -> None:
    """UserError naming the line and trial of the first problems (``(row index, text)``)."""
    if not problems:
        return
    lines = _record_lines(path)
    listed = [f"  line {lines[i]}" + (f" (trial {excerpt(str(df.at[i, 'trial_id']), 80)})" if "trial_id" in df.columns else "")
              + f", {text}" for i, text in sorted(problems, key=lambda p: p[0])[:_SHOWN_PROBLEMS]]
    more = len(problems) - len(listed)
    raise UserError(f"{path}: {len(problems)} {what}; correct them (a number may be "
                    "left empty when it is missing), or re-run the sweep to rewrite the file:\n"
                    + "\n".join(listed) + (f"\n  ... and {more} more" if more else ""))


#: Columns that count or measure something: never below zero (a row's knobs: never below one).
_AT_LEAST_ONE = ("micro_batch", "grad_acc")


def _non_negative(column: str) -> bool:
    if column == "predicted_peak_gb":
        return False  # the memory model's prediction (its CPU fit can go below zero), not a measurement
    return column.endswith(("_gb", "_ms", "_s")) or column in (
        "tokens_per_s", "mfu", "loss_std", "padding_frac", "steps", "measured_steps", "pairs_used",
        "pairs_dropped", "trainable_params")


def _refuse_nonsense(path: Path, df: "Any") -> None:
    """UserError for values no trial can have: a negative memory, time or throughput, a knob below
    one, a checkpoint level that does not exist, a beta not above zero, a trial id twice (the
    frontier and the recommendation would take such a row at its word)."""
    problems: list[tuple[int, str]] = []
    for col in df.columns:
        if col in _AT_LEAST_ONE:
            bad, rule = df[col].notna() & (df[col] < 1), "at least 1"
        elif col == "beta":
            bad, rule = df[col].notna() & (df[col] <= 0), "above 0"
        elif _non_negative(col) and col in RESULTS_COLUMNS and col not in _TEXT_COLUMNS:
            bad, rule = df[col].notna() & (df[col] < 0), "0 or more"
        else:
            continue
        problems += [(i, f"column {col}: {df.at[i, col]:g} is not allowed; it is {rule}") for i in df.index[bad]]
    levels = df["checkpoint_level"].str.strip()
    for i in df.index[(levels != "") & ~levels.isin(CHECKPOINT_LEVELS)]:
        problems.append((i, f"column checkpoint_level: {shown(levels[i], 40)} is not a level; use one of "
                            f"{', '.join(CHECKPOINT_LEVELS)}"))
    ids = df["trial_id"].str.strip()
    for i in df.index[ids.duplicated(keep="first")]:
        problems.append((i, f"trial id {shown(ids[i], 80)} is given twice (each trial has one row)"))
    _refuse_problems(path, df, problems, "value(s) that no trial can have")


def _refuse_unreadable(path: Path, df: "Any", kinds: dict[str, str],
                       allowed: dict[str, tuple[str, ...]] | None = None) -> None:
    """UserError naming the line, trial and column of every cell that cannot be read, and the fix:
    a hand-edited ``abc`` must not turn silently into a missing value. ``allowed``: text columns
    with a closed set of values (compared stripped and lower-cased)."""
    problems = []
    for col, kind in kinds.items():
        if col in df.columns:
            for i in df.index[_bad_cells(df[col], kind)]:
                problems.append((i, f"column {col}: {shown(str(df.at[i, col]).strip(), 80)} is not {_KIND_WORDS[kind]}"))
    for col, values in (allowed or {}).items():
        text = df[col].fillna("").astype(str).str.strip()
        for i in df.index[~text.str.lower().isin(values)]:
            problems.append((i, f"column {col}: {shown(text[i], 80)} is not allowed; use one of {', '.join(values)}"))
    _refuse_problems(path, df, problems, "cell(s) cannot be read")


def load_results(out_dir: str | Path) -> "Any":
    """Read ``DIR/results.csv`` into a DataFrame with every contract column present.

    Raises UserError (naming the file, the column and the fix) when the directory or file is
    missing or a column in :data:`ANALYSIS_REQUIRED_COLUMNS` is absent. Text columns are str
    (missing text is ""), numeric columns float or int (missing numbers are NaN).
    """
    import pandas as pd

    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        raise UserError(f"results directory {out_dir} does not exist; pass the --output directory "
                          "of a `dpo-sweep run` (default reports/<space name>/)")
    path = ResultsDir(out_dir).results
    if not path.is_file():
        raise UserError(f"{path} not found; run `dpo-sweep run SPACE.yaml --output {out_dir}` "
                          "or `dpo-sweep trial` first")
    df = migrate.renamed_results_columns(_read_csv(path))
    missing = [c for c in ANALYSIS_REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise UserError(f"{path} lacks the column(s) {', '.join(missing)}; the {ResultsDir.RESULTS} "
                          f"contract needs at least {', '.join(ANALYSIS_REQUIRED_COLUMNS)}")
    kinds = _column_kinds(TrialResult)
    _refuse_unreadable(path, df, kinds, allowed={"status": tuple(Status)})
    for col in RESULTS_COLUMNS:
        if col not in df.columns:
            df[col] = migrate.RESULTS_COLUMN_DEFAULTS.get(col, "" if col in _TEXT_COLUMNS else math.nan)
    for col in _TEXT_COLUMNS:
        df[col] = df[col].fillna("").astype(str)
    df["status"] = df["status"].str.strip().str.lower()
    for col in RESULTS_COLUMNS:
        if col not in _TEXT_COLUMNS:
            df[col] = _convert(df[col], kinds.get(col, "float"))
    _refuse_nonsense(path, df)
    return df.reset_index(drop=True)


def load_steps(out_dir: str | Path) -> "Any | None":
    """Read ``DIR/steps.csv`` if present (None when absent or empty); columns as STEPS_COLUMNS."""
    import pandas as pd

    path = ResultsDir(out_dir).steps
    if not path.is_file() or path.stat().st_size == 0:
        return None
    df = _read_csv(path)
    missing = [c for c in ("trial_id", "step") if c not in df.columns]
    if missing:
        raise UserError(f"{path} lacks the column(s) {', '.join(missing)}; the {ResultsDir.STEPS} contract "
                          f"has {', '.join(STEPS_COLUMNS)}")
    _refuse_unreadable(path, df, _column_kinds(StepRecord))
    df["trial_id"] = df["trial_id"].fillna("").astype(str)
    for col in df.columns:
        if col not in ("trial_id", "measured", "worst_case"):
            df[col] = pd.to_numeric(df[col], errors="coerce")
    return df


def load_environment(out_dir: str | Path) -> dict[str, Any] | None:
    """Read ``DIR/environment.json`` if present and valid JSON object (None otherwise)."""
    import json

    path = ResultsDir(out_dir).environment
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
