"""How the recommendation orders its candidates, and why each near winner lost, in figures.

The order (the rule is the module doc of :mod:`dpo_sweep.analysis.recommend`):

1. A candidate that another qualifying trial *beats on every median* (strictly better on every
   objective: pareto.beats_on_every_median) is never chosen; the one that beats it is.
2. The candidates whose throughput interval overlaps that of the highest median tokens/s are
   tied on throughput (:func:`dpo_sweep.core.noise.overlaps`).
3. Among them, those whose peak is within the memory floor of the leanest one
   (:func:`dpo_sweep.core.noise.memory_interval`) are tied on memory too, and that tie goes to
   the fewest costly levers (:func:`lever_cost`: no checkpointing before checkpointing, no
   accumulation before accumulation), then the stability verdict, the most tokens/s, the trial
   id; the rest of the throughput tie follows by least memory.
4. The others follow by most tokens/s, least memory, verdict, trial id.

When the objectives name a held-out score (data.eval_pairs), it comes before all of these: the
candidates are ranked by it, best measured value first, and the rules above order each group of
equal scores (:mod:`dpo_sweep.analysis.quality`). Where the rows ran on different GPU counts
(the ``gpus`` objective, pareto.with_gpus), the fewest GPUs come next: a configuration that fits
on 4 GPUs is named before a faster one on 8, which the reason and the runner-up then price.

Never by loss std within a tie (recommend.py says why). NaN metrics sort last.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from dpo_sweep.analysis import pareto
from dpo_sweep.analysis.quality import quality_groups, quality_objectives, same_quality
from dpo_sweep.analysis.reasons import amount, interval, listed
from dpo_sweep.core import noise
from dpo_sweep.core.levels import Level

#: How tied rows rank by their stability verdict (stability.py); no verdict ("") ranks last.
VERDICT_RANK = {"stable": 0, "noisy": 1}


def verdict_rank(rows: pd.DataFrame) -> pd.Series:
    """:data:`VERDICT_RANK` of each row's ``stability`` (no column or no verdict: last)."""
    if "stability" not in rows:
        return pd.Series(len(VERDICT_RANK), index=rows.index)
    return rows["stability"].astype(object).map(VERDICT_RANK).fillna(len(VERDICT_RANK))


def _level_cost(level: object) -> int:
    known = Level.of(level)
    return known.memory_rank if known is not None else len(Level)


def lever_cost(row: pd.Series) -> tuple[int, int, int]:
    """(levers on, checkpoint level's rank, grad_acc): smaller is fewer costly levers. A lever is
    checkpointing (a level other than ``none``) or accumulation (grad_acc above 1)."""
    level = _level_cost(row.get("checkpoint_level"))
    ga = int(row["grad_acc"]) if pd.notna(row.get("grad_acc")) else 1
    return int(level > 0) + int(ga > 1), level, ga


def levers_words(row: pd.Series) -> str:
    """``checkpoint L2 and grad_acc 2``, ``no checkpointing or accumulation``."""
    on = []
    if _level_cost(row.get("checkpoint_level")) > 0:
        on.append(f"checkpoint {row['checkpoint_level']}")
    if pd.notna(row.get("grad_acc")) and int(row["grad_acc"]) > 1:
        on.append(f"grad_acc {int(row['grad_acc'])}")
    return listed(on) if on else "no checkpointing or accumulation"


def unbeaten(rows: pd.DataFrame, by: pd.DataFrame, objectives: tuple[pareto.Objective, ...]) -> pd.Series:
    """True for each row of ``rows`` that no row of ``by`` beats on every median."""
    if rows.empty or by.empty:
        return pd.Series(True, index=rows.index, dtype=bool)
    mine, theirs = pareto.as_minimisation(rows, objectives), pareto.as_minimisation(by, objectives)
    with np.errstate(invalid="ignore"):
        beaten = np.all(theirs[:, None, :] < mine[None, :, :], axis=2).any(axis=0)
    return pd.Series(~beaten, index=rows.index, dtype=bool)


#: The knobs that set a measurement (what the planner measures once for other learning set-ups).
MEASUREMENT_KNOBS = ("micro_batch", "checkpoint_level", "grad_acc", "num_workers", "adapter", "optimizer")


def indistinguishable(rows: pd.DataFrame, of: pd.DataFrame) -> pd.Series:
    """Rows of ``rows`` with the knobs of a row of ``of`` whose peak memory and throughput both
    lie inside its noise: measured apart, they measured the same, and differ only in a learning
    set-up, which their single loss std cannot rank (recommend.py)."""
    knobs = [c for c in MEASUREMENT_KNOBS if c in rows.columns and c in of.columns]
    out = pd.Series(False, index=rows.index, dtype=bool)
    if rows.empty or of.empty:
        return out
    m_low, m_high = noise.memory_interval(rows)
    for _, ref in of.iterrows():
        same = np.all([(rows[c].astype(str) == str(ref[c])).to_numpy() for c in knobs], axis=0)
        r_low, r_high = noise.memory_interval(ref.to_frame().T)
        out |= (same & noise.overlaps(m_low, m_high, r_low[0], r_high[0])
                & noise.overlaps(rows["throughput_low"], rows["throughput_high"],
                                 ref["throughput_low"], ref["throughput_high"]))
    return out


def sharing_measurement(rows: pd.DataFrame, of: pd.DataFrame) -> pd.Series:
    """Rows of ``rows`` whose memory/time measurement (``measured_by`` at their grad_acc: the same
    peak and step time) is that of a row of ``of``."""
    if "measured_by" not in rows or "measured_by" not in of:
        return pd.Series(False, index=rows.index)
    keys = {(str(m), int(g)) for m, g in zip(of["measured_by"].astype(object), of["grad_acc"])
            if m is not pd.NA and str(m)}
    return pd.Series([(str(m), int(g)) in keys for m, g in zip(rows["measured_by"].astype(object), rows["grad_acc"])],
                     index=rows.index, dtype=bool)


def memory_tied(rows: pd.DataFrame, lean: pd.Series) -> pd.Series:
    """Rows whose peak-memory interval overlaps that of ``lean`` (the leanest)."""
    low, high = noise.memory_interval(rows)
    lean_low, lean_high = noise.memory_interval(lean.to_frame().T)
    return pd.Series(noise.overlaps(low, high, lean_low[0], lean_high[0]), index=rows.index, dtype=bool)


def rank_candidates(rows: pd.DataFrame, by: pd.DataFrame | None = None,
                    objectives: tuple[pareto.Objective, ...] | None = None) -> pd.DataFrame:
    """``rows`` (of ``pareto.analyse_frontier``) best first, as the module doc orders them;
    ``by``: the qualifying rows whose beating on every median removes a candidate (None: no
    such check)."""
    if rows.empty:
        return rows
    if by is not None and objectives:
        keep = unbeaten(rows, by, objectives)
        rows = rows[keep] if keep.any() else rows
    gpus = pareto.GPUS in (objectives or ())
    return pd.concat([_by_throughput(g) for group in quality_groups(rows, quality_objectives(objectives))
                      for g in (gpu_groups(group) if gpus else [group])])


def _same_gpus(rows: pd.DataFrame, winner: pd.Series, objectives: tuple[pareto.Objective, ...]) -> pd.Series:
    if pareto.GPUS not in (objectives or ()):
        return pd.Series(True, index=rows.index, dtype=bool)
    return pareto.gpus_per_trial(rows) == float(pareto.gpus_per_trial(winner.to_frame().T).iloc[0])


def gpu_groups(rows: pd.DataFrame) -> list[pd.DataFrame]:
    """``rows`` split by GPUs per trial, the fewest first."""
    counts = pareto.gpus_per_trial(rows)
    return [rows[counts == n] for n in sorted(counts.unique())]


def _by_throughput(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` best first by rules 2-4 of the module doc."""
    key = rows.assign(
        _tps=-rows["tokens_per_s"].astype(float).fillna(-np.inf),
        _mem=rows["peak_mem_gb"].astype(float).fillna(np.inf),
        _verdict=verdict_rank(rows),
        _levers=[lever_cost(r) for _, r in rows.iterrows()],
    )
    best = key.sort_values(["_tps", "_mem", "_verdict", "trial_id"], kind="mergesort").iloc[0]
    tied = pd.Series(noise.overlaps(key["throughput_low"], key["throughput_high"],
                                    best["throughput_low"], best["throughput_high"]), index=key.index)
    tied_rows = key[tied]
    lean = tied_rows.sort_values(["_mem", "trial_id"], kind="mergesort").iloc[0]
    same_mem = memory_tied(tied_rows, lean)
    ranked = pd.concat([
        tied_rows[same_mem].sort_values(["_levers", "_verdict", "_tps", "_mem", "trial_id"], kind="mergesort"),
        tied_rows[~same_mem].sort_values(["_mem", "_verdict", "_tps", "trial_id"], kind="mergesort"),
        key[~tied].sort_values(["_tps", "_mem", "_verdict", "trial_id"], kind="mergesort"),
    ])
    return ranked.drop(columns=["_tps", "_mem", "_verdict", "_levers"])


def _gb(value: float) -> str:
    """A memory difference: ``2.1 MB`` below 0.01 GB, else ``0.028 GB``."""
    return f"{value * 1000:.1f} MB" if abs(value) < 0.01 else f"{value:.3f} GB"


def _off_frontier(other: pd.Series, frontier: pd.DataFrame, objectives: tuple[pareto.Objective, ...]) -> str:
    """``t9 is off the frontier: t8 is no worse within the noise and has loss std 0.0117 vs 0.0148``."""
    both = pd.concat([other.to_frame().T, frontier])
    low, high = pareto.intervals_as_minimisation(both, objectives)
    for j in range(1, len(both)):
        better = high[j] < low[0]
        if np.all(low[j] <= high[0]) and better.any():
            k = int(np.argmax(better))
            o, f = objectives[k], both.iloc[j]
            fmt = (lambda v: f"{float(v):.3g}") if o.name == "loss_std" else (lambda v: f"{float(v):,.3f}" if o.name == "memory" else amount(v))
            return (f"{other['trial_id']} is off the frontier: {f['trial_id']} is no worse within the noise on every "
                    f"objective and better on {o.name} ({fmt(f[o.column])} vs {fmt(other[o.column])})")
    return f"{other['trial_id']} is off the frontier"


def why_it_lost(winner: pd.Series, other: pd.Series, lean: pd.Series | None = None) -> str:
    """Why ``other``, tied with ``winner`` on throughput, lost: the comparison that decided
    (``lean``: the leanest row of the tie, whose floor the memory tie is judged by; None: the winner)."""
    w_mem, o_mem = float(winner["peak_mem_gb"]), float(other["peak_mem_gb"])
    floor = float(max(noise.memory_floor_gb(pd.DataFrame([winner, other]))))
    faster = float(other["tokens_per_s"]) > float(winner["tokens_per_s"])
    speed = (f"measured more tokens/s ({amount(other['tokens_per_s'])} vs {amount(winner['tokens_per_s'])}) "
             f"inside the noise ({interval(other)} overlaps {interval(winner)})" if faster else
             f"measured {amount(other['tokens_per_s'])} tokens/s, inside the noise of this one's")
    lean = winner if lean is None else lean
    tied_mem = bool(memory_tied(pd.DataFrame([other]), lean).iloc[0])
    if not tied_mem and lean["trial_id"] != winner["trial_id"]:
        return (f"{other['trial_id']} {speed} but peaks beyond the memory floor of the leanest tied row "
                f"({other['peak_mem_gb']:.3f} vs {lean['trial_id']}'s {lean['peak_mem_gb']:.3f} GB)")
    if not tied_mem and o_mem > w_mem:
        return f"{other['trial_id']} {speed} but peaks {_gb(o_mem - w_mem)} higher ({o_mem:.3f} vs {w_mem:.3f} GB)"
    floor_words = f"inside the {_gb(floor)} memory floor" if floor > 0 else "the same peak"
    where = (f"peaks {_gb(w_mem - o_mem)} lower ({o_mem:.3f} vs {w_mem:.3f} GB), {floor_words}" if o_mem < w_mem
             else f"peaks {_gb(o_mem - w_mem)} higher ({o_mem:.3f} vs {w_mem:.3f} GB), {floor_words}")
    if lever_cost(other) > lever_cost(winner):
        return f"{other['trial_id']} {speed} and {where}, with {levers_words(other)} where this one has {levers_words(winner)}"
    if verdict_rank(pd.DataFrame([other])).iloc[0] > verdict_rank(pd.DataFrame([winner])).iloc[0]:
        return f"{other['trial_id']} {speed} and {where}, but its stability verdict is `{other.get('stability') or 'none'}`"
    return f"{other['trial_id']} {speed} and {where}, with as few levers, and measured fewer tokens/s"


def near_winners_sentence(winner: pd.Series, ranked: pd.DataFrame, qualifying: pd.DataFrame,
                          objectives: tuple[pareto.Objective, ...], limit: int = 4) -> str:
    """`` Tied with it on throughput ...: t1 measured more tokens/s (...) but peaks 0.05 GB higher
    (...); ...``: each candidate (``ranked``, best first) and each other qualifying row tied with
    the winner on throughput (and on its held-out scores, when an objective is one), and why it lost; "" when none is. A qualifying row off the frontier
    can be off it only because a leaner row's noise covers its higher median."""
    others = qualifying[~qualifying["trial_id"].isin(ranked["trial_id"])]
    others = others.sort_values(["tokens_per_s", "trial_id"], ascending=[False, True], kind="mergesort")
    pool = pd.concat([ranked, others])
    tied = pool[noise.overlaps(pool["throughput_low"], pool["throughput_high"],
                                 winner["throughput_low"], winner["throughput_high"])
                  & (pool["trial_id"] != winner["trial_id"])
                  & same_quality(pool, winner, quality_objectives(objectives))  # the others lost on it
                  & _same_gpus(pool, winner, objectives)]  # as those on more GPUs did
    if tied.empty:
        return ""
    both = pd.concat([tied, winner.to_frame().T])
    lean = both.loc[both["peak_mem_gb"].astype(float).idxmin()]
    frontier = qualifying[qualifying["on_frontier"].astype(bool)]
    shown = [why_it_lost(winner, r, lean) if r["trial_id"] in set(ranked["trial_id"]) or not len(frontier)
             else _off_frontier(r, frontier, objectives) for _, r in tied.head(limit).iterrows()]
    more = f"; and {len(tied) - limit} more" if len(tied) > limit else ""
    return (" Tied with it on throughput (step-time p10-p90 intervals, widened for few steps, overlapping), "
            "each lost on the next rule (less peak memory beyond the memory floor, then fewer costly levers: "
            f"no checkpointing before checkpointing, no accumulation before accumulation): {'; '.join(shown)}{more}.")
