"""How precisely a trial's throughput is known, and when two throughputs are a tie.

Step times scatter from step to step (other processes on the machine, clock boosts, the
allocator), so two runs of the same sweep can order two configurations differently when their
throughputs differ by less than that scatter. The frontier and the recommendation therefore
compare throughputs as intervals, built from the spread each trial measured:

* **Throughput interval** of a row: ``[tokens_per_s x step_time_ms / step_time_p90_ms,
  tokens_per_s x step_time_ms / step_time_p10_ms]``: the median throughput rescaled to the 90th
  (slowest) and 10th (fastest) percentile step time of the measured steps. A step's tokens are
  fixed by the configuration, so a slower step moves them at a proportionally lower rate.
* **Indistinguishable** (a tie): the two intervals overlap (touching counts).
* **No spread** (no ``step_time_p10_ms`` or ``step_time_p90_ms``, as in a results.csv written
  before they existed, or p10 == p90, as with one measured step): the interval is the single
  value ``[tokens_per_s, tokens_per_s]``, i.e. that row's throughput is compared exactly.

Pure functions on DataFrames and numpy arrays; nothing here reads files. Neutral ground, beside
records.py and stability.py: the planner's runoff (plan/runoff.py) asks which rows the
recommendation would find tied, the analyser (pareto.py, recommend.py) decides with the same rule.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

#: Columns the spread is read from (results.csv).
SPREAD_COLUMNS: tuple[str, ...] = ("step_time_p10_ms", "step_time_p90_ms")


def _column(df: pd.DataFrame, name: str) -> np.ndarray:
    if name not in df.columns:
        return np.full(len(df), np.nan)
    return pd.to_numeric(df[name], errors="coerce").to_numpy(dtype=float)


def has_spread(df: pd.DataFrame) -> np.ndarray:
    """True for rows with a usable step-time spread: 0 < p10 < p90 and a positive median."""
    median, p10, p90 = (_column(df, c) for c in ("step_time_ms",) + SPREAD_COLUMNS)
    with np.errstate(invalid="ignore"):
        return np.isfinite(median) & (median > 0) & np.isfinite(p10) & np.isfinite(p90) & (0 < p10) & (p10 < p90)


def throughput_interval(df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) tokens/s per row, as the module doc defines; NaN where tokens_per_s is NaN."""
    tps = _column(df, "tokens_per_s")
    median, p10, p90 = (_column(df, c) for c in ("step_time_ms",) + SPREAD_COLUMNS)
    spread = has_spread(df)
    with np.errstate(invalid="ignore", divide="ignore"):
        low = np.where(spread, tps * median / p90, tps)
        high = np.where(spread, tps * median / p10, tps)
    # A hand-made row with its median outside [p10, p90] still gets an interval that holds it.
    return np.fmin(low, tps), np.fmax(high, tps)


def overlaps(low_a: np.ndarray | float, high_a: np.ndarray | float,
             low_b: np.ndarray | float, high_b: np.ndarray | float) -> np.ndarray:
    """True where interval a and interval b overlap (indistinguishable); False with a NaN."""
    with np.errstate(invalid="ignore"):
        return np.asarray((np.asarray(low_a) <= high_b) & (np.asarray(low_b) <= high_a))
