"""How precisely a trial's throughput is known, and when two throughputs are a tie.

Step times scatter from step to step (other processes on the machine, clock boosts, the
allocator), so two runs of the same sweep can order two configurations differently when their
throughputs differ by less than that scatter. The frontier and the recommendation therefore
compare throughputs as intervals, built from the spread each trial measured:

* **Throughput interval** of a row: ``[tokens_per_s x step_time_ms / step_time_p90_ms,
  tokens_per_s x step_time_ms / step_time_p10_ms]``: the median throughput rescaled to the 90th
  (slowest) and 10th (fastest) percentile step time of the measured steps. A step's tokens are
  fixed by the configuration, so a slower step moves them at a proportionally lower rate.
* **Few steps, a wider interval**: a row's p10 and p90 are those of its ``measured_steps`` step
  times (numpy's interpolated percentiles), and a handful of steps understates the spread of the
  steps a run goes on to take: with step times lognormal, the next step falls inside a 4-step
  sample's p10-p90 about half the time, not 80% (tests/test_noise_intervals.py). So each side is
  widened in log step time, ``p90' = median x (p90 / median)^k``, ``p10' = median x (p10 /
  median)^k``, with ``k`` = :func:`small_sample_factor` of the sample size ``n``: the half-width
  of an 80% prediction interval for one more step from ``n`` (Student's t with ``n - 1`` degrees
  of freedom, times ``sqrt(1 + 1/n)``, in standard deviations) over the half-width a sample of
  ``n`` shows on average (the expected interpolated p90 - p10 of ``n`` normal draws, over 2, from
  the normal order statistics). ``k`` is 3.22 at 3 steps, 2.26 at 4, 1.47 at 8, 1.11 at 30 and
  tends to 1; the widened interval then holds the next step 80% of the time at every ``n``. A row
  without ``measured_steps`` (written before it, or hand-made) is not widened.
* **Indistinguishable** (a tie): the two intervals overlap (touching counts).
* **Memory floor**: a peak memory is known only to what its reader resolves, so each row's peak
  is the interval ``peak_mem_gb +- floor / 2``, the floor by the row's ``mem_source``
  (:data:`MEMORY_FLOOR_GB`): ``rss`` (a CPU trial: the process's resident set, which moves with
  what the allocator keeps and the pages the worker touches, not only with the configuration)
  and ``nvml`` (a GPU: the device-used memory moves in the caching allocator's 20 MiB segments).
  Two peaks closer than the floor are a tie, as two overlapping throughput intervals are. A row
  without ``mem_source`` (written before it, or hand-made) is compared exactly.
* **No spread** (no ``step_time_p10_ms`` or ``step_time_p90_ms``, as in a results.csv written
  before they existed, or p10 == p90, as with one measured step): the interval is the single
  value ``[tokens_per_s, tokens_per_s]``, i.e. that row's throughput is compared exactly.

Pure functions on DataFrames and numpy arrays; nothing here reads files. Neutral ground, beside
records.py and stability.py: the planner's runoff (plan/runoff.py) asks which rows the
recommendation would find tied, the analyser (pareto.py, recommend.py) decides with the same rule.
"""
from __future__ import annotations

import functools
import math

import numpy as np
import pandas as pd

#: Columns the spread is read from (results.csv).
SPREAD_COLUMNS: tuple[str, ...] = ("step_time_p10_ms", "step_time_p90_ms")
#: What a peak-memory reader resolves, by results.csv's ``mem_source`` (module doc). ``rss``:
#: twice the widest spread of identical quickstart trials, rounded up (benchmarks/README.md,
#: "Memory floor"); ``nvml``: the PyTorch caching allocator's large segment, 20 MiB.
MEMORY_FLOOR_GB: dict[str, float] = {"rss": 0.02, "nvml": 20 * 2**20 / 1e9}

#: Student's t 90th percentile for 1..30 degrees of freedom (any statistics table).
_T_90 = (3.078, 1.886, 1.638, 1.533, 1.476, 1.440, 1.415, 1.397, 1.383, 1.372, 1.363, 1.356, 1.350, 1.345,
         1.341, 1.337, 1.333, 1.330, 1.328, 1.325, 1.323, 1.321, 1.319, 1.318, 1.316, 1.315, 1.314, 1.313,
         1.311, 1.310)
#: The standard normal's 90th percentile.
Z_90 = 1.2815516


def t_90(df: int) -> float:
    """Student's t 90th percentile with ``df`` >= 1 degrees of freedom (beyond the table, the
    Cornish-Fisher term ``z + (z^3 + z) / (4 df)``, within 0.001 of it at 30)."""
    if df <= len(_T_90):
        return _T_90[df - 1]
    return Z_90 + (Z_90**3 + Z_90) / (4 * df)


@functools.lru_cache(maxsize=64)  # a cache of a pure function of n: one integration per sample size
def sample_half_spread(n: int) -> float:
    """E[(p90 - p10) / 2] of ``n`` >= 2 standard normal draws, p10 and p90 interpolated as numpy's
    percentile does, from the expected order statistics (numerical integration)."""
    x = np.linspace(-9.0, 9.0, 6001)
    pdf = np.exp(-x * x / 2) / math.sqrt(2 * math.pi)
    cdf = 0.5 * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))

    def order_stat(i: int) -> float:  # E[X_(i)], 1-based, of n draws
        weight = n * math.comb(n - 1, i - 1) * cdf ** (i - 1) * (1 - cdf) ** (n - i) * pdf
        return float(np.trapezoid(x * weight, x))

    def percentile(q: float) -> float:
        pos = (n - 1) * q
        lo = math.floor(pos)
        hi = min(lo + 1, n - 1)
        return order_stat(lo + 1) * (1 - (pos - lo)) + order_stat(hi + 1) * (pos - lo)

    return (percentile(0.9) - percentile(0.1)) / 2


def small_sample_factor(n: float) -> float:
    """How much wider, in log step time, the p10-p90 of ``n`` steps is made (module doc); 1 for
    ``n`` < 2 or unknown (one step has no spread to widen); towards 1 as ``n`` grows."""
    if not (n >= 2 and math.isfinite(n)):
        return 1.0
    n = int(n)
    return t_90(n - 1) * math.sqrt(1 + 1 / n) / sample_half_spread(n)


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
    """(low, high) tokens/s per row, as the module doc defines (widened for few ``measured_steps``);
    NaN where tokens_per_s is NaN."""
    tps = _column(df, "tokens_per_s")
    median, p10, p90 = (_column(df, c) for c in ("step_time_ms",) + SPREAD_COLUMNS)
    spread = has_spread(df)
    k = np.array([small_sample_factor(n) for n in _column(df, "measured_steps")])
    with np.errstate(invalid="ignore", divide="ignore"):
        # median / p90' = (median / p90)^k: the slow side; median / p10' = (median / p10)^k
        low = np.where(spread, tps * (median / p90) ** k, tps)
        high = np.where(spread, tps * (median / p10) ** k, tps)
    # A hand-made row with its median outside [p10, p90] still gets an interval that holds it.
    return np.fmin(low, tps), np.fmax(high, tps)


def overlaps(low_a: np.ndarray | float, high_a: np.ndarray | float,
             low_b: np.ndarray | float, high_b: np.ndarray | float) -> np.ndarray:
    """True where interval a and interval b overlap (indistinguishable); False with a NaN."""
    with np.errstate(invalid="ignore"):
        return np.asarray((np.asarray(low_a) <= high_b) & (np.asarray(low_b) <= high_a))


def memory_floor_gb(df: pd.DataFrame) -> np.ndarray:
    """Each row's memory floor in GB (:data:`MEMORY_FLOOR_GB` by ``mem_source``; 0: unknown)."""
    if "mem_source" not in df.columns:
        return np.zeros(len(df))
    return np.array([MEMORY_FLOOR_GB.get(str(s), 0.0) for s in df["mem_source"]], dtype=float)


def memory_interval(df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) peak GB per row: ``peak_mem_gb +- floor / 2`` (module doc); NaN where it is NaN."""
    peak, half = _column(df, "peak_mem_gb"), memory_floor_gb(df) / 2
    return peak - half, peak + half
