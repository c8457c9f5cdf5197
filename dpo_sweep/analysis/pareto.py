"""The Pareto frontier over a sweep's objectives (memory min, throughput max, loss std min by default).

Pure functions on numpy arrays and DataFrames; nothing here reads files.

Definitions used throughout:

* Every objective is turned into "smaller is better" (``max`` objectives are negated).
* Throughput is the time objective, not time per optimizer step: a step of a larger effective
  batch does more work, and with equal effective batches both order the trials the same way.
* Each objective value is an interval: throughput's is its p10-p90 interval in tokens/s
  (:mod:`dpo_sweep.core.noise`), every other objective's the single measured value.
  ``a`` is *better* than ``b`` on an objective when ``a``'s whole interval is better than
  ``b``'s, and *no worse* when ``b`` is not better than ``a``.
* ``a`` dominates ``b`` when ``a`` is no worse on every objective and better on one. So a trial
  whose throughput is inside another's noise and that needs more memory (or has a higher loss
  std) is dominated: which of two indistinguishable throughputs measured higher never decides
  whether a trial is on the frontier. Rows without a spread compare exactly, and two trials
  with exactly the same values do not dominate each other: exact ties are both on the frontier
  (neither is worse, so dropping either would hide a valid choice). The relation has no cycles
  (only one objective has intervals), so an eligible sweep always has a frontier.
* Only a frontier row removes others. Within the noise, dominance does not chain: in a ladder
  of rows each 10% faster and 2 GB bigger than the last with +-6% intervals, every rung ties
  the one below, yet the top rung's interval lies wholly above the bottom's. The bottom rung
  removes the second, the second (itself off the frontier) removes nothing, so the third is on
  the frontier and removes the fourth, and so on. The frontier is the one set of rows that no
  frontier row dominates and that dominates every other row (the kernel of the dominance graph;
  without intervals, exactly the rows nothing dominates).
* Only *eligible* trials compete: status ``ok``, a stability verdict other than ``diverging`` and
  a finite value in every objective. An ``ok`` trial with a NaN metric cannot be compared, so it
  is kept, shown and marked off the frontier. A ``diverging`` trial (its loss collapsed or its
  log-ratio ran away: stability.py) is never a choice, and its loss std, often the sweep's
  lowest, would make it dominate the rows that learn: it is kept and shown, never on the
  frontier, so the tables, the plots and the recommendation read one frontier.
  ``oom``, ``diverged``, ``error`` and ``pruned`` rows are kept too; they are never on it.
* The distance of a dominated trial from the frontier: each objective is scaled by its range over
  the eligible trials, and the distance is the smallest, over frontier points ``f``, of the length
  of ``max(p - f, 0)``: how much ``p`` would have to improve to stop being dominated by ``f``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import pandas as pd

from dpo_sweep import migrate
from dpo_sweep.core import noise
from dpo_sweep.analysis import noise_floor
from dpo_sweep.config import ObjectivesSpec
from dpo_sweep.core.status import Status
from dpo_sweep.errors import UserError

#: Space-file objective name -> results.csv column.
OBJECTIVE_COLUMNS: dict[str, str] = {
    "memory": "peak_mem_gb",
    "throughput": "tokens_per_s",
    # Pooled over same-maths trials (analysis/noise_floor.py): their loss std difference is rounding.
    "loss_std": noise_floor.POOLED_COLUMN,
}
DEFAULT_OBJECTIVES: dict[str, str | None] = ObjectivesSpec().model_dump()
#: The objective whose values carry a measured noise interval (noise.throughput_interval).
NOISY_COLUMN = "tokens_per_s"


@dataclass(frozen=True)
class Objective:
    """One axis of the frontier."""

    name: str
    """Space-file name: memory, throughput or loss_std."""
    column: str
    """results.csv column it reads."""
    direction: str
    """``min`` or ``max``."""
    note: str = ""
    """How it was read when not as written (an old ``step_time`` objective), for the output."""


def objectives_from_spec(spec: Mapping[str, Any] | None) -> tuple[Objective, ...]:
    """Turn a space file's ``objectives:`` mapping into Objectives (None -> the defaults).

    Values are ``min``, ``max`` or None (not used). An old ``step_time: min`` (a results dir's
    space.yaml from before throughput) is read as ``throughput: max``, with a note saying so.
    Raises UserError on an unknown name or direction, or when nothing is left to optimise.
    """
    spec = DEFAULT_OBJECTIVES if spec is None else spec
    if hasattr(spec, "model_dump"):  # a config.ObjectivesSpec passed as is
        spec = spec.model_dump()
    out = []
    for name, direction in spec.items():
        name, direction, note = migrate.objective_as_today(name, direction, spec)
        if name not in OBJECTIVE_COLUMNS:
            raise UserError(f"objectives.{name} is unknown; allowed: {', '.join(OBJECTIVE_COLUMNS)}")
        if direction is None:
            continue
        if direction not in ("min", "max"):
            raise UserError(f"objectives.{name} is {direction!r}; allowed: min, max or null")
        out.append(Objective(name, OBJECTIVE_COLUMNS[name], direction, note))
    if not out:
        raise UserError("objectives: every objective is null; set at least one of "
                        + ", ".join(f"{n}: min" for n in OBJECTIVE_COLUMNS))
    return tuple(out)


def diverging_mask(df: pd.DataFrame) -> np.ndarray:
    """True for rows whose stability verdict is ``diverging``."""
    if "stability" not in df:
        return np.zeros(len(df), dtype=bool)
    return (df["stability"].astype(object) == "diverging").to_numpy(dtype=bool)


def eligible_mask(df: pd.DataFrame, objectives: tuple[Objective, ...]) -> np.ndarray:
    """True for rows that can be on the frontier: status ok, not judged diverging, and every
    objective finite."""
    values = df[[o.column for o in objectives]].to_numpy(dtype=float)
    return (df["status"].to_numpy() == Status.OK) & ~diverging_mask(df) & np.isfinite(values).all(axis=1)


def as_minimisation(df: pd.DataFrame, objectives: tuple[Objective, ...]) -> np.ndarray:
    """The objective columns as a float matrix (rows x objectives) where smaller is better."""
    values = df[[o.column for o in objectives]].to_numpy(dtype=float)
    signs = np.array([1.0 if o.direction == "min" else -1.0 for o in objectives])
    return values * signs


def intervals_as_minimisation(df: pd.DataFrame, objectives: tuple[Objective, ...]
                              ) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) matrices like :func:`as_minimisation`: throughput's noise interval, every
    other objective its value (low == high)."""
    low, high = as_minimisation(df, objectives), as_minimisation(df, objectives)
    tps_low, tps_high = noise.throughput_interval(df)
    for k, o in enumerate(objectives):
        if o.column == NOISY_COLUMN:
            low[:, k], high[:, k] = (tps_low, tps_high) if o.direction == "min" else (-tps_high, -tps_low)
    return low, high


def dominates(a: np.ndarray, b: np.ndarray) -> bool:
    """True when point ``a`` dominates ``b`` (both "smaller is better" vectors)."""
    return bool(np.all(a <= b) and np.any(a < b))


def frontier_mask(low: np.ndarray, high: np.ndarray | None = None) -> np.ndarray:
    """Frontier rows of finite (n x k) "smaller is better" intervals [low, high] (high None:
    exact points); exact ties all kept. Dominance, and why only frontier rows remove others, as
    the module doc defines them.

    Rows are settled in the order the (acyclic) relation allows: a row that no open or frontier
    row dominates joins the frontier, and every open row a frontier row dominates leaves it.
    O(n^3 k) at worst, which is nothing for sweeps of a few hundred trials.
    """
    high = low if high is None else high
    n = len(low)
    no_worse = np.all(low[:, None, :] <= high[None, :, :], axis=2)  # [i, j]: j nowhere better than i
    better = np.any(high[:, None, :] < low[None, :, :], axis=2)  # [i, j]: i better than j somewhere
    dominates_ = no_worse & better  # [i, j]: i dominates j
    on, off = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
    for _ in range(n):  # each round settles at least one row: the relation has no cycles
        open_ = ~(on | off)
        if not open_.any():
            break
        joining = open_ & ~np.any(dominates_[open_ | on], axis=0)
        on |= joining
        off |= open_ & ~joining & np.any(dominates_[on], axis=0)
    return on


def frontier_distances(points: np.ndarray, on_frontier: np.ndarray) -> np.ndarray:
    """Range-scaled distance of every point to the frontier (0 on it); see the module doc."""
    if len(points) == 0:
        return np.zeros(0)
    span = points.max(axis=0) - points.min(axis=0)
    scaled = (points - points.min(axis=0)) / np.where(span > 0, span, 1.0)
    front = scaled[on_frontier]
    gaps = np.clip(scaled[:, None, :] - front[None, :, :], 0.0, None)  # [point, frontier, k]
    return np.sqrt((gaps**2).sum(axis=2)).min(axis=1)


def analyse_frontier(df: pd.DataFrame, objectives: tuple[Objective, ...]) -> pd.DataFrame:
    """A copy of ``df`` with the frontier columns added; no row is dropped.

    * ``eligible``: could be compared (ok and finite objectives).
    * ``throughput_low`` / ``throughput_high``: the tokens/s noise interval (noise.py), for every row.
    * ``on_frontier``: bool, True only for eligible non-dominated rows.
    * ``frontier_distance``: float, 0 on the frontier, NaN for ineligible rows.
    * ``frontier_rank``: 1 for every frontier row, then 2, 3, ... by distance (ties share a
      rank); <NA> for ineligible rows.
    * ``loss_std_pooled``: the loss-std objective's column (noise_floor.with_pooled_loss_std).
    """
    df = noise_floor.with_pooled_loss_std(df)
    out = df.copy()
    eligible = eligible_mask(df, objectives)
    points = as_minimisation(df, objectives)[eligible]
    low, high = intervals_as_minimisation(df, objectives)
    on = frontier_mask(low[eligible], high[eligible])
    dist = frontier_distances(points, on)

    out["eligible"] = eligible
    out["throughput_low"], out["throughput_high"] = noise.throughput_interval(df)
    out["on_frontier"] = False
    out.loc[eligible, "on_frontier"] = on
    out["on_frontier"] = out["on_frontier"].astype(bool)
    out["frontier_distance"] = np.nan
    out.loc[eligible, "frontier_distance"] = np.where(on, 0.0, dist)
    ranks = pd.Series(out["frontier_distance"]).rank(method="dense")
    out["frontier_rank"] = ranks.astype("Int64")
    return out
