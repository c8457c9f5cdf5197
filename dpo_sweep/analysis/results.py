"""The results directory's row types and columns (contract: ../shared/DESIGN.md).

``results.csv`` holds one :class:`TrialResult` per trial, ``steps.csv`` one :class:`StepRecord`
per trial per optimizer step. Results are data: an OOM or an error is a ``status`` and an
``error`` string, never an exception that escapes. Units: GB = 1e9 bytes, ms, tokens/s.
"""
from __future__ import annotations

import csv
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable

from dpo_sweep.errors import UserError  # standard library only

STATUSES = ("ok", "oom", "diverged", "error", "pruned")


@dataclass(frozen=True)
class StepRecord:
    """One optimizer step of one trial."""

    trial_id: str
    step: int
    loss: float
    grad_norm: float
    step_time_ms: float
    peak_mem_gb: float
    reward_accuracy: float
    reward_margin: float
    logps_chosen: float
    logps_rejected: float
    kl: float
    rewards_chosen: float = math.nan
    rewards_rejected: float = math.nan
    tokens_per_s: float = math.nan
    lr: float = math.nan
    measured: bool = True
    max_seq_len: int = 0  # the longest sequence in this step's micro-batches
    padding_frac: float = math.nan  # share of this step's token positions that are padding
    worst_case: bool = False  # the step on the longest pairs (train.worst_case_step)


@dataclass(frozen=True)
class TrialResult:
    """One trial's summary row."""

    trial_id: str
    status: str
    model: str
    seq_len: int
    micro_batch: int
    checkpoint_level: str
    grad_acc: int
    beta: float
    num_workers: int
    effective_batch: int
    peak_mem_gb: float = math.nan  # the worst case: the highest measured peak, worst-case step included
    peak_mem_typical_gb: float = math.nan  # the highest peak of the typical measured steps
    padding_frac: float = math.nan  # mean share of padding in the typical measured steps
    torch_peak_alloc_gb: float = math.nan
    torch_peak_reserved_gb: float = math.nan
    step_time_ms: float = math.nan
    step_time_p10_ms: float = math.nan
    step_time_p90_ms: float = math.nan
    tokens_per_s: float = math.nan
    mfu: float = math.nan
    loss_mean: float = math.nan
    loss_std: float = math.nan
    grad_norm_mean: float = math.nan
    reward_accuracy: float = math.nan
    reward_margin: float = math.nan
    error: str = ""
    # Beyond the contract's minimum: how the numbers were obtained.
    mem_source: str = ""
    loss_type: str = ""
    precision: str = ""
    reference: str = ""
    attn_implementation: str = ""
    liger_kernel: bool = False
    lean_ops: bool = False
    device: str = ""
    steps: int = 0
    measured_steps: int = 0
    pairs_used: int = 0
    pairs_dropped: int = 0
    startup_s: float = math.nan
    measure_s: float = math.nan
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


def _columns(cls: type) -> list[str]:
    return [f.name for f in fields(cls) if f.name != "extra"]


RESULTS_COLUMNS: list[str] = _columns(TrialResult)
STEPS_COLUMNS: list[str] = _columns(StepRecord)


def _row(obj: Any, columns: list[str]) -> dict[str, Any]:
    d = asdict(obj)
    d.update(d.pop("extra", None) or {})
    return {c: d.get(c, "") for c in columns}


def write_csv(path: str | Path, rows: Iterable[Any], columns: list[str], append: bool = False) -> None:
    """Write dataclass rows as CSV (header written when the file is new or not appending)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not (append and path.exists() and path.stat().st_size > 0)
    with path.open("a" if append else "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=columns)
        if new:
            w.writeheader()
        for r in rows:
            w.writerow(_row(r, columns))


def read_csv_rows(path: str | Path) -> list[dict[str, str]]:
    """Rows of a CSV file as dicts of strings; [] when the file is missing or empty."""
    path = Path(path)
    if not path.is_file() or path.stat().st_size == 0:
        return []
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def write_results(out_dir: str | Path, results: Iterable[TrialResult], append: bool = False) -> Path:
    """The contract columns, then each row's ``extra`` ones (the swept train fields, the same for
    every trial of a sweep: ``TrialConfig.swept_columns``)."""
    path = Path(out_dir) / "results.csv"
    results = list(results)
    extra = [c for c in dict.fromkeys(k for r in results for k in r.extra) if c not in RESULTS_COLUMNS]
    write_csv(path, results, RESULTS_COLUMNS + extra, append=append)
    return path


def write_steps(out_dir: str | Path, steps: Iterable[StepRecord], append: bool = False) -> Path:
    path = Path(out_dir) / "steps.csv"
    write_csv(path, steps, STEPS_COLUMNS, append=append)
    return path


# --- Loading a results directory (for the analyser and the report) ---------------------------

#: Columns without which no frontier can be computed; every other contract column is optional
#: when loading (a missing one is filled with NaN or "" so old or hand-made files still load).
ANALYSIS_REQUIRED_COLUMNS: tuple[str, ...] = (
    "trial_id", "status", "micro_batch", "checkpoint_level", "grad_acc", "beta",
    "peak_mem_gb", "step_time_ms", "tokens_per_s", "loss_std",
)
_TEXT_COLUMNS = ("trial_id", "status", "model", "checkpoint_level", "error", "mem_source",
                 "loss_type", "precision", "reference", "attn_implementation", "device")


def _read_csv(path: Path) -> "Any":
    import pandas as pd

    try:
        return pd.read_csv(path, dtype={c: "string" for c in _TEXT_COLUMNS}, keep_default_na=False,
                           na_values=["", "nan", "NaN"])
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
    with path.open(newline="") as fh:
        reader = csv.reader(fh)
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


def _refuse_unreadable(path: Path, df: "Any", kinds: dict[str, str],
                       allowed: dict[str, tuple[str, ...]] | None = None) -> None:
    """UserError naming the line, trial and column of every cell that cannot be read, and the fix:
    a hand-edited ``abc`` must not turn silently into a missing value. ``allowed``: text columns
    with a closed set of values (compared stripped and lower-cased)."""
    problems = []
    for col, kind in kinds.items():
        if col in df.columns:
            for i in df.index[_bad_cells(df[col], kind)]:
                problems.append((i, f"column {col}: {str(df.at[i, col]).strip()!r} is not {_KIND_WORDS[kind]}"))
    for col, values in (allowed or {}).items():
        text = df[col].fillna("").astype(str).str.strip()
        for i in df.index[~text.str.lower().isin(values)]:
            problems.append((i, f"column {col}: {text[i]!r} is not allowed; use one of {', '.join(values)}"))
    if not problems:
        return
    lines = _record_lines(path)
    shown = [f"  line {lines[i]}" + (f" (trial {df.at[i, 'trial_id']})" if "trial_id" in df.columns else "")
             + f", {what}" for i, what in sorted(problems, key=lambda p: p[0])[:_SHOWN_PROBLEMS]]
    more = len(problems) - len(shown)
    raise UserError(f"{path}: {len(problems)} cell(s) cannot be read; correct them (a number may be "
                    "left empty when it is missing), or re-run the sweep to rewrite the file:\n"
                    + "\n".join(shown) + (f"\n  ... and {more} more" if more else ""))


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
    path = out_dir / "results.csv"
    if not path.is_file():
        raise UserError(f"{path} not found; run `dpo-sweep run SPACE.yaml --output {out_dir}` "
                          "or `dpo-sweep trial` first")
    df = _read_csv(path)
    missing = [c for c in ANALYSIS_REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise UserError(f"{path} lacks the column(s) {', '.join(missing)}; the results.csv "
                          f"contract needs at least {', '.join(ANALYSIS_REQUIRED_COLUMNS)}")
    kinds = _column_kinds(TrialResult)
    _refuse_unreadable(path, df, kinds, allowed={"status": STATUSES})
    for col in RESULTS_COLUMNS:
        if col not in df.columns:
            df[col] = "" if col in _TEXT_COLUMNS else math.nan
    for col in _TEXT_COLUMNS:
        df[col] = df[col].fillna("").astype(str)
    df["status"] = df["status"].str.strip().str.lower()
    for col in RESULTS_COLUMNS:
        if col not in _TEXT_COLUMNS:
            df[col] = _convert(df[col], kinds.get(col, "float"))
    return df.reset_index(drop=True)


def load_steps(out_dir: str | Path) -> "Any | None":
    """Read ``DIR/steps.csv`` if present (None when absent or empty); columns as STEPS_COLUMNS."""
    import pandas as pd

    path = Path(out_dir) / "steps.csv"
    if not path.is_file() or path.stat().st_size == 0:
        return None
    df = _read_csv(path)
    missing = [c for c in ("trial_id", "step") if c not in df.columns]
    if missing:
        raise UserError(f"{path} lacks the column(s) {', '.join(missing)}; the steps.csv contract "
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

    path = Path(out_dir) / "environment.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
