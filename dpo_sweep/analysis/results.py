"""Loading a results directory for the analyser and the report (contract: ../shared/DESIGN.md).

The row types, their columns and the writers live in :mod:`dpo_sweep.records`, beside the
producers that write them; this module reads and checks what they wrote.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from dpo_sweep.errors import UserError  # standard library only
from dpo_sweep.records import RESULTS_COLUMNS, STEPS_COLUMNS

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
    for col in RESULTS_COLUMNS:
        if col not in df.columns:
            df[col] = "" if col in _TEXT_COLUMNS else math.nan
    for col in _TEXT_COLUMNS:
        df[col] = df[col].fillna("").astype(str)
    df["status"] = df["status"].str.strip().str.lower()
    for col in RESULTS_COLUMNS:
        if col not in _TEXT_COLUMNS:
            df[col] = pd.to_numeric(df[col], errors="coerce")
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
    df["trial_id"] = df["trial_id"].fillna("").astype(str)
    for col in df.columns:
        if col not in ("trial_id", "measured"):
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
