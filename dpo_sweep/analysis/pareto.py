"""The Pareto frontier over a sweep's objectives (memory min, throughput max, loss std min by default).

Pure functions on numpy arrays and DataFrames; nothing here reads files.

Definitions used throughout:

* Every objective is turned into "smaller is better" (``max`` objectives are negated).
* Throughput is the time objective, not time per optimizer step: a step of a larger effective
  batch does more work, and with equal effective batches both order the trials the same way.
* Each objective value is an interval, what its measurement resolves (:mod:`dpo_sweep.core.noise`):
  throughput's is its widened p10-p90 interval in tokens/s, peak memory's ``peak_mem_gb +-
  floor / 2`` (the reader's noise floor: process RSS on a CPU, the allocator's segments on a GPU),
  the loss std's its pooled value (same-maths trials share it: noise_floor.py).
  ``a`` is *better* than ``b`` on an objective when ``a``'s whole interval is better than
  ``b``'s, and *no worse* when ``b`` is not better than ``a``.
* ``a`` dominates ``b`` when ``a`` is no worse on every objective and better on one. So a trial
  whose throughput is inside another's noise and that needs more memory beyond the floor (or has
  a higher loss std) is dominated: which of two indistinguishable throughputs measured higher
  never decides whether a trial is on the frontier. Rows without a spread or a floor compare
  exactly, and two trials with exactly the same values do not dominate each other: exact ties
  are both on the frontier (neither is worse, so dropping either would hide a valid choice).
* Only a frontier row removes others. Within the noise, dominance does not chain: in a ladder
  of rows each 10% faster and 2 GB bigger than the last with +-6% intervals, every rung ties
  the one below, yet the top rung's interval lies wholly above the bottom's. The bottom rung
  removes the second, the second (itself off the frontier) removes nothing, so the third is on
  the frontier and removes the fourth, and so on. The frontier is first the one set of rows
  that no frontier row dominates and that dominates every other row (the kernel of the
  dominance graph; without intervals, exactly the rows nothing dominates). Rows are settled in
  the order the relation allows; should noisy objectives ever close a loop of dominance, the rows
  of the loop that no frontier row dominates all join, so the relation never empties the frontier.
* The medians have the last word: a row that *beats* a frontier row on every objective's median
  (strictly better on each) is on the frontier too, whatever dominates it within the noise, so no
  excluded trial is ever measured better in every respect than one the frontier keeps; and a
  frontier row that another frontier row beats on every median leaves it, so the frontier never
  shows a trial beside one better in every respect. A row that no frontier row then dominates or
  beats comes back, and the three are repeated to a fixed point: every excluded row is dominated
  within the noise or beaten on every median by a frontier row.
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
from dpo_sweep.core.held_out import HELD_OUT_COLUMNS

#: Space-file objective name -> results.csv column.
OBJECTIVE_COLUMNS: dict[str, str] = {
    "memory": "peak_mem_gb",
    "throughput": "tokens_per_s",
    # Pooled over same-maths trials (analysis/noise_floor.py): their loss std difference is rounding.
    "loss_std": noise_floor.POOLED_COLUMN,
    # Held-out quality (data.eval_pairs): the learning trial's last eval point (records.HELD_OUT_COLUMNS).
    "eval_reward_accuracy": HELD_OUT_COLUMNS["eval_reward_accuracy"],
    "eval_reward_margin": HELD_OUT_COLUMNS["eval_reward_margin"],
    "eval_loss": "eval_loss",
}
DEFAULT_OBJECTIVES: dict[str, str | None] = ObjectivesSpec().model_dump()
#: The objective whose values carry a measured noise interval (noise.throughput_interval).
NOISY_COLUMN = "tokens_per_s"
#: The objective whose values carry the memory reader's floor (noise.memory_interval).
MEMORY_COLUMN = "peak_mem_gb"


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


#: GPUs per trial: an objective of its own wherever a sweep's ok rows differ in it (:func:`with_gpus`),
#: so that a configuration on fewer GPUs is not dominated by one spread over more, whose smaller
#: per-GPU peak and higher tokens/s are bought with more cards. Never written in a space file.
GPUS = Objective("gpus", "workers_per_trial", "min", note="GPUs per trial differ between the rows: fewer is better")


def gpus_per_trial(rows: pd.DataFrame) -> pd.Series:
    """Each row's GPUs per trial (``workers_per_trial``; 1 where the column or its value is missing)."""
    if GPUS.column not in rows:
        return pd.Series(1.0, index=rows.index)
    return pd.to_numeric(rows[GPUS.column], errors="coerce").fillna(1.0)


def with_gpus(df: pd.DataFrame, objectives: tuple[Objective, ...]) -> tuple[Objective, ...]:
    """``objectives`` plus :data:`GPUS` when the ok rows of ``df`` ran on different GPU counts."""
    if GPUS in objectives:
        return objectives
    return (*objectives, GPUS) if gpus_per_trial(df[df["status"] == Status.OK]).nunique() > 1 else objectives


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
    """(low, high) matrices like :func:`as_minimisation`: throughput's noise interval, peak
    memory's floor, the loss std its value (low == high)."""
    low, high = as_minimisation(df, objectives), as_minimisation(df, objectives)
    intervals = {NOISY_COLUMN: noise.throughput_interval(df), MEMORY_COLUMN: noise.memory_interval(df)}
    for k, o in enumerate(objectives):
        if o.column in intervals:
            lo, hi = intervals[o.column]
            low[:, k], high[:, k] = (lo, hi) if o.direction == "min" else (-hi, -lo)
    return low, high


def dominates(a: np.ndarray, b: np.ndarray) -> bool:
    """True when point ``a`` dominates ``b`` (both "smaller is better" vectors)."""
    return bool(np.all(a <= b) and np.any(a < b))


def beats_on_every_median(medians: np.ndarray) -> np.ndarray:
    """[i, j]: row i is strictly better than row j on every objective ("smaller is better" medians)."""
    return np.all(medians[:, None, :] < medians[None, :, :], axis=2)


def frontier_mask(low: np.ndarray, high: np.ndarray | None = None, medians: np.ndarray | None = None
                  ) -> np.ndarray:
    """Frontier rows of finite (n x k) "smaller is better" intervals [low, high] around ``medians``
    (high None: exact points, their own medians; medians None: the intervals' midpoints); exact
    ties all kept. Dominance, the kernel, and why a row that beats a frontier row on every median
    joins it, as the module doc defines them.

    Rows are settled in the order the relation allows: a row that no open or frontier row
    dominates joins the frontier, and every open row a frontier row dominates leaves it.
    O(n^3 k) at worst, which is nothing for sweeps of a few hundred trials.
    """
    exact = high is None
    high = low if high is None else high
    medians = (low if exact else (low + high) / 2) if medians is None else medians
    n = len(low)
    no_worse = np.all(low[:, None, :] <= high[None, :, :], axis=2)  # [i, j]: j nowhere better than i
    better = np.any(high[:, None, :] < low[None, :, :], axis=2)  # [i, j]: i better than j somewhere
    dominates_ = no_worse & better  # [i, j]: i dominates j
    on, off = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
    for _ in range(n):
        open_ = ~(on | off)
        if not open_.any():
            break
        joining = open_ & ~np.any(dominates_[open_ | on], axis=0)
        if not joining.any():  # a loop among the open rows: those no frontier row dominates join
            joining = open_ & ~np.any(dominates_[on], axis=0)
        on |= joining
        off |= open_ & ~joining & np.any(dominates_[on], axis=0)
    return _settle_medians(on, dominates_, beats_on_every_median(medians))


def _settle_medians(on: np.ndarray, dominates_: np.ndarray, beats: np.ndarray) -> np.ndarray:
    """The medians' last word on the kernel ``on``, to a fixed point: a row that beats a frontier
    row on every median joins, a frontier row another frontier row beats on every median leaves,
    and a row that no frontier row then dominates or beats comes back."""
    on = on | beats[:, on].any(axis=1)
    for _ in range(len(on) + 1):
        on = on & ~beats[on].any(axis=0)
        uncovered = ~on & ~(dominates_ | beats)[on].any(axis=0)
        if not uncovered.any():
            return on
        on = on | uncovered
        on = on | beats[:, on].any(axis=1)
    raise AssertionError("the frontier's median pass found no fixed point")


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
    on = frontier_mask(low[eligible], high[eligible], points)
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
