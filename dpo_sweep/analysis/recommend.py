"""Pick one configuration for a memory budget, and say why in a plain sentence.

The rule: among the frontier configurations whose peak memory stays under the budget minus a
safety margin and whose loss std lies within the sweep's normal range, take the one with the most
tokens/s, with throughput compared within its measured noise (:mod:`dpo_sweep.core.noise`):
every candidate whose p10-p90 throughput interval overlaps that of the candidate with the highest
median tokens/s is tied with it, and the tie goes to the least peak memory beyond the memory
reader's floor (:func:`dpo_sweep.core.noise.memory_interval`), then, among peaks within the floor
of the leanest, to the fewest costly levers (no checkpointing before checkpointing, no
accumulation before accumulation), then the stability verdict (``stable`` before ``noisy``
before none; ``diverging`` never qualifies), then the most tokens/s, then the trial id (so the
answer never depends on row order); a candidate that another qualifying trial beats on every
median is never chosen (analysis/ranking.py has the order). When the objectives name a held-out
score (data.eval_pairs), the best measured score comes first and the rules above decide among
equal scores (analysis/quality.py); where the rows ran on different GPU counts, the fewest GPUs
come next (analysis/ranking.py). Not to
the loss std: between learning set-ups (other betas, lrs) each measured by one learning trial, a
loss std difference is not evidence (three betas' single 5-step trials can swap their order
between two runs); the loss std only filters, through the sweep's normal range. For the same
reason the candidates are the frontier's plus every qualifying row that shares a candidate's
memory/time measurement (``measured_by``, at its grad_acc) or measured the same (its knobs, its
peak and throughput within their noise): such rows differ from it only in loss std, by which the
frontier alone would drop them. The reason names each candidate tied with the
winner and the comparison it lost, in figures, says when
throughputs were compared exactly for want of a spread, and when the winner's measurement stands
for other learning set-ups too.
If none fits, say so and name the cheapest configuration measured (or, when nothing completed,
the cheapest one tried, with advice that fits how the trials failed: memory advice for ``oom``).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from dpo_sweep.core import budget, noise
from dpo_sweep.core.levels import Level
from dpo_sweep.analysis.noise_floor import POOLED_COLUMN
from dpo_sweep.analysis.levers import lever_sentence
from dpo_sweep.analysis import pareto
from dpo_sweep.analysis.pareto import Objective, objectives_from_spec
from dpo_sweep.analysis import quality as held_out
from dpo_sweep.analysis.ranking import indistinguishable, near_winners_sentence, rank_candidates, sharing_measurement
from dpo_sweep.analysis.reasons import (all_diverging, amount, exactness_sentence, failure_summary, gpus_sentence, interval,
                                        left_out_sentence, listed, no_loss_std_sentence, shared_measurement_sentence,
                                        tied_faster, time_source_sentence)
from dpo_sweep.analysis.tables import fmt_setting, is_finite, swept_train_fields, varying_columns
from dpo_sweep.core.dimensions import KNOB_COLUMNS, LEVER_COLUMNS
from dpo_sweep.core.status import Status
from dpo_sweep.errors import UserError
from dpo_sweep.results_dir import ResultsDir

DEFAULT_SAFETY_MARGIN = budget.DEFAULT_SAFETY_MARGIN
#: recommendation.json's config keys, in its order: the knobs, the effective batch and GPUs per trial,
#: seq_len, the model and the levers (parallelism and the swept train fields where they vary).
CONFIG_KEYS = (*KNOB_COLUMNS, "effective_batch", "workers_per_trial", "seq_len", "model", *LEVER_COLUMNS)
_INT_KEYS = ("micro_batch", "grad_acc", "effective_batch", "workers_per_trial", "seq_len")
METRIC_KEYS = ("peak_mem_gb", "step_time_ms", "tokens_per_s", "loss_std")


@dataclass(frozen=True)
class Recommendation:
    """What recommendation.json holds (contract keys first)."""

    trial_id: str | None
    """The recommended trial; None when nothing fits."""
    config: dict[str, Any]
    """Its micro_batch, checkpoint_level, grad_acc, beta, ... ({} when nothing fits)."""
    memory_budget_gb: float | None
    """The budget asked for (GB = 1e9 bytes); None when none was given or found."""
    reason: str
    """Plain sentences: why it won, what the runner-up costs, or why nothing fits."""
    runner_up: dict[str, Any] | None
    """Next best fitting frontier configuration: trial_id, config, metrics, cost."""
    budget_source: str = ""
    """Where the budget came from: --memory-budget-gb, environment.json, or none."""
    safety_margin: float = DEFAULT_SAFETY_MARGIN
    """Fraction of the budget kept free."""
    usable_memory_gb: float | None = None
    """budget x (1 - safety_margin): the peak a recommendation must stay under."""
    loss_std_limit: float | None = None
    """Upper end of the sweep's normal loss-std range (None: no loss std to judge by)."""
    metrics: dict[str, float | None] = field(default_factory=dict)
    """The winner's peak_mem_gb, step_time_ms, tokens_per_s, loss_std."""
    cheapest: dict[str, Any] | None = None
    """When nothing fits: the cheapest configuration measured (or tried)."""
    varying: tuple[str, ...] = ()
    """Set-up columns besides micro_batch, checkpoint, grad_acc and beta whose values differ
    between the sweep's rows (``model``, swept train fields): ``config`` holds them too, and every
    line that names a configuration names them."""

    sweep_complete: bool | None = None
    """False when the sweep did not finish (configurations without a row, rows whose stability
    is pending: ``still_to_run``); None when the folder cannot tell (analysis/completeness.py)."""
    still_to_run: list[dict[str, Any]] = field(default_factory=list)
    """``{"trial_id", "missing": "measurement" | "stability"}`` per configuration still to run."""

    def to_json_dict(self) -> dict[str, Any]:
        return _json_safe(asdict(self))


def _json_safe(value: Any) -> Any:
    """Plain JSON types; NaN/inf become None, numpy scalars become Python numbers."""
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    if value is pd.NA:
        return None
    return value


def stability_limit(loss_std: np.ndarray) -> float | None:
    """Upper end of the sweep's normal loss-std range over finite values (None if there are none).

    Tukey's outlier fence, Q3 + 1.5 IQR, but never below twice the median: with a handful of
    nearly equal values the IQR is ~0 and the fence alone would reject trivial differences.
    """
    finite = np.asarray(loss_std, dtype=float)
    finite = finite[np.isfinite(finite)]
    if finite.size == 0:
        return None
    q1, median, q3 = np.percentile(finite, [25, 50, 75])
    return float(max(q3 + 1.5 * (q3 - q1), 2.0 * median))


def config_of(row: pd.Series, varying: tuple[str, ...] = ()) -> dict[str, Any]:
    """The configuration part of a results row, as plain Python values; ``varying``: the
    :func:`~dpo_sweep.analysis.tables.varying_columns` to add."""
    swept = swept_train_fields(row.index)  # last, in the results' column order (frontier.md's)
    out: dict[str, Any] = {c: _plain(row.get(c)) for c in varying if c not in CONFIG_KEYS and c not in swept}
    for key in CONFIG_KEYS:
        value = row.get(key)
        if key in _INT_KEYS:
            out[key] = int(value) if is_finite(value) else None
        elif key == "beta":
            out[key] = float(value) if is_finite(value) else None
        else:
            out[key] = "" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)
    for key in swept:  # lr, seed, adaptive_clip ...: the winner's too
        value = row[key]
        value = value.item() if isinstance(value, np.generic) else value
        out[key] = None if value is pd.NA or (isinstance(value, float) and math.isnan(value)) else value
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if is_finite(value):
        return float(value)
    return None if value is None or value is pd.NA or isinstance(value, float) else str(value)


def describe(row: pd.Series, varying: tuple[str, ...] = ()) -> str:
    """``t3 (micro_batch 4, checkpoint L1, grad_acc 2, beta 0.1)``, then each of ``varying``
    (``, model llama-3.2-1b, lr 2e-05``)."""
    c = config_of(row)
    extra = "".join(f", {k} {fmt_setting(row.get(k))}" for k in varying)
    levers = "".join(f", {k} {c[k]}" for k, plain in (("adapter", "full"), ("optimizer", "adamw"))
                     if k not in varying and c.get(k) not in ("", None, plain))  # only where a lever is on
    return (f"{row['trial_id']} (micro_batch {c['micro_batch']}, checkpoint {c['checkpoint_level']}, "
            f"grad_acc {c['grad_acc']}, beta {_g(c['beta'])}{extra}{levers})")


def _g(value: Any, digits: int = 4) -> str:
    return f"{float(value):.{digits}g}" if is_finite(value) else "n/a"


def _gb(value: Any) -> str:
    return f"{float(value):.2f} GB" if is_finite(value) else "n/a GB"


def _metrics(row: pd.Series) -> dict[str, float | None]:
    return {k: (float(row[k]) if is_finite(row.get(k)) else None) for k in METRIC_KEYS}


def runner_up_cost(winner: pd.Series, other: pd.Series, quality: tuple[Objective, ...] = ()) -> str:
    """What choosing ``other`` instead of ``winner`` costs, as a verb phrase:
    ``cost 16.7% of the throughput (2133 vs 2560 tokens/s) and save 1.50 GB of peak memory``;
    ``quality``: the held-out objectives, whose scores lead when they differ."""
    parts = [p for p in [held_out.cost_part(winner, other, quality)] if p]
    w_gpus, o_gpus = winner.get("workers_per_trial"), other.get("workers_per_trial")
    if is_finite(w_gpus) and is_finite(o_gpus) and int(w_gpus) != int(o_gpus):
        parts.append(f"run on {int(o_gpus)} GPUs per trial instead of {int(w_gpus)}")
    w_tps, o_tps = winner["tokens_per_s"], other["tokens_per_s"]
    if is_finite(w_tps) and is_finite(o_tps) and w_tps > 0:
        drop_pct = 100.0 * (w_tps - o_tps) / w_tps
        tied = bool(noise.overlaps(winner.get("throughput_low"), winner.get("throughput_high"),
                                   other.get("throughput_low"), other.get("throughput_high")))
        within = ", inside the step-time noise" if tied and abs(drop_pct) >= 0.05 else ""
        if abs(drop_pct) < 0.05:
            parts.append(f"match its throughput ({amount(o_tps)} tokens/s)")
        else:
            change = f"cost {drop_pct:.1f}% of the throughput" if drop_pct > 0 else f"add {-drop_pct:.1f}% throughput"
            parts.append(f"{change} ({amount(o_tps)} vs {amount(w_tps)} tokens/s{within})")
    w_mem, o_mem = winner["peak_mem_gb"], other["peak_mem_gb"]
    if is_finite(w_mem) and is_finite(o_mem):
        diff_gb = float(o_mem - w_mem)
        if diff_gb < -0.005:
            parts.append(f"save {-diff_gb:.2f} GB of peak memory (peaks at {_gb(o_mem)})")
        elif diff_gb > 0.005:
            parts.append(f"use {diff_gb:.2f} GB more peak memory (peaks at {_gb(o_mem)})")
        else:
            parts.append(f"use the same peak memory ({_gb(o_mem)})")
    w_time, o_time = winner["step_time_ms"], other["step_time_ms"]
    if is_finite(w_time) and is_finite(o_time) and abs(o_time - w_time) > 0.05:
        parts.append(f"take {amount(o_time)} ms per step instead of {amount(w_time)}")
    w_std, o_std = winner[POOLED_COLUMN], other[POOLED_COLUMN]  # same maths: equal, not compared
    if is_finite(w_std) and is_finite(o_std) and abs(o_std - w_std) > 1e-12:
        parts.append(f"have loss std {_g(o_std, 3)} instead of {_g(w_std, 3)}")
    if not parts:
        return "have no comparable measurements"
    return listed(parts)


def cheapest_row(df: pd.DataFrame) -> tuple[pd.Series | None, bool]:
    """The ok row with the least peak memory, else the smallest configuration tried.

    Returns (row, measured): measured is False when no ok row has a peak memory, and the row is
    then the one with the smallest micro_batch, strongest checkpointing, smallest grad_acc.
    """
    ok = df[(df["status"] == Status.OK) & df["peak_mem_gb"].astype(float).notna()]
    if len(ok):
        return ok.sort_values(["peak_mem_gb", "trial_id"], kind="mergesort").iloc[0], True
    if not len(df):
        return None, False
    # Strongest checkpointing first: the order in which a smaller-memory configuration is "cheaper".
    strength = [getattr(Level.of(lv), "strength", len(Level)) for lv in df["checkpoint_level"]]
    tried = df.assign(_strength=strength)
    tried = tried.sort_values(["micro_batch", "_strength", "grad_acc", "trial_id"], kind="mergesort")
    return tried.iloc[0].drop("_strength"), False


def _status_counts(df: pd.DataFrame) -> str:
    counts = df["status"].value_counts()
    return ", ".join(f"{n} {s}" for s, n in counts.items())


def recommend(
    analysed: pd.DataFrame,
    memory_budget_gb: float | None,
    safety_margin: float = DEFAULT_SAFETY_MARGIN,
    budget_source: str = "--memory-budget-gb",
    objectives: tuple[Objective, ...] | None = None,
) -> Recommendation:
    """Choose a configuration from a frame produced by ``pareto.analyse_frontier`` with
    ``objectives`` (None: the default ones)."""
    objectives = objectives_from_spec(None) if objectives is None else objectives
    if memory_budget_gb is not None and not (is_finite(memory_budget_gb) and memory_budget_gb > 0):
        raise UserError(f"--memory-budget-gb is {memory_budget_gb}; give a positive number of GB (1e9 bytes)")
    if not 0.0 <= safety_margin < 1.0:
        raise UserError(f"safety margin is {safety_margin}; give a fraction in [0, 1), e.g. 0.05 for 5%")
    if memory_budget_gb is None:
        budget_source = "none"
    usable = None if memory_budget_gb is None else budget.usable_gb(memory_budget_gb, safety_margin)
    ok = analysed[analysed["status"] == Status.OK]
    limit = stability_limit(ok[POOLED_COLUMN].to_numpy(dtype=float))
    varying = tuple(varying_columns(analysed))
    common = dict(memory_budget_gb=memory_budget_gb, budget_source=budget_source,
                  safety_margin=safety_margin, usable_memory_gb=usable, loss_std_limit=limit, varying=varying)

    frontier = analysed[analysed["on_frontier"]]
    fits = _fits(frontier, usable)
    stable = _stable(fits, limit)
    # Diverging rows are never on the frontier (pareto.py); each one that fits is named with its cause.
    diverging = _fits(ok[ok["stability"].astype(object) == "diverging"], usable) if "stability" in ok else ok[:0]
    left_out = pd.concat([fits[~fits["trial_id"].isin(stable["trial_id"])], diverging]).drop_duplicates("trial_id")
    pool_name, off_frontier = "frontier configuration", False
    qualifying = _stable(_fits(ok[ok["eligible"]], usable), limit)
    siblings = qualifying[~qualifying["trial_id"].isin(stable["trial_id"])
                          & (sharing_measurement(qualifying, stable) | indistinguishable(qualifying, stable))]
    if not stable.empty and not siblings.empty:  # off the frontier only by a loss std: not evidence
        stable, pool_name = pd.concat([stable, siblings]), "configuration on the frontier or sharing a frontier measurement"
    if stable.empty:
        # An ok off-frontier trial can still qualify when memory is not a min-objective, or when
        # every fitting frontier point is unstable; better that than "nothing fits".
        off = _stable(_fits(ok[~ok["on_frontier"]], usable), limit)
        if not off.empty:
            stable, pool_name = off, "measured configuration"
            off_frontier = True
    if stable.empty:
        return _nothing_fits(analysed, usable, limit, _fits(ok, usable), common)

    ranked = rank_candidates(stable, qualifying, objectives)
    winner = ranked.iloc[0]
    second = ranked.iloc[1] if len(ranked) > 1 else None
    # Ties are looked for among every fitting, stable trial: one off the frontier may be off it
    # only because its higher median throughput is inside the noise of a leaner trial's.
    faster = tied_faster(winner, qualifying)
    quality = held_out.quality_objectives(objectives)
    gpus = pareto.GPUS in objectives
    reason = _why_it_won(winner, len(ranked), pool_name, memory_budget_gb, usable, safety_margin, limit,
                         tie=not faster.empty, varying=varying, quality=quality, gpus=gpus)
    reason += time_source_sentence(winner) + gpus_sentence(winner, ranked)
    reason += held_out.ranked_sentence(winner, ranked, quality, varying)
    reason += near_winners_sentence(winner, ranked, qualifying, objectives) + exactness_sentence(ranked)
    sharing = ranked[sharing_measurement(ranked, winner.to_frame().T) & held_out.same_quality(ranked, winner, quality)]
    reason += shared_measurement_sentence(winner, sharing)
    if off_frontier:
        reason += " No frontier configuration qualifies, so the choice falls on a measured one off it."
    reason += no_loss_std_sentence(analysed)
    runner_up = None
    if second is not None:
        cost = runner_up_cost(winner, second, quality)
        reason += f" The runner-up, {describe(second, varying)}, would {cost}."
        runner_up = {"trial_id": str(second["trial_id"]), "config": config_of(second, varying),
                     "metrics": _metrics(second), "cost": cost}
    else:
        reason += f" No other {pool_name} qualifies, so there is no runner-up."
    reason += left_out_sentence(left_out, POOLED_COLUMN, limit)
    reason += lever_sentence(analysed, winner)
    return Recommendation(trial_id=str(winner["trial_id"]), config=config_of(winner, varying), reason=reason,
                          runner_up=runner_up, metrics=_metrics(winner), **common)


def _why_it_won(winner: pd.Series, n_qualified: int, pool_name: str, budget_gb: float | None,
                usable_gb: float | None, safety_margin: float, limit: float | None, tie: bool,
                varying: tuple[str, ...], quality: tuple[Objective, ...] = (), gpus: bool = False) -> str:
    """``t3 (...) has the highest throughput (...) of the 4 frontier configurations that ...``;
    with a held-out objective (``quality``), ``has the best held-out reward accuracy (...)``."""
    peak, have = ("peaks", "has") if n_qualified == 1 else ("peak", "have")
    conditions = []
    if usable_gb is not None:
        conditions.append(f"{peak} under {usable_gb:.2f} GB ({budget_gb:.2f} GB budget minus a "
                          f"{100 * safety_margin:g}% safety margin)")
    if limit is not None:
        conditions.append(f"{have} a loss std within the sweep's normal range (<= {_g(limit, 3)})")
    that = (" that " + " and ".join(conditions)) if conditions else ""
    spread = (f" ({interval(winner)} over its p10-p90 step times widened for the steps measured)"
              if noise.has_spread(winner.to_frame().T)[0] else "")
    speed = f"{amount(winner['tokens_per_s'])} tokens/s{spread} at {amount(winner['step_time_ms'])} ms per step"
    highest = "the highest throughput within the measurement noise" if tie else "the highest throughput"
    pool = pool_name.replace('configuration', 'configurations', 1)
    if n_qualified == 1:
        text = f"{describe(winner, varying)} is the only {pool_name}{that}: {speed}."
    elif gpus and not quality:
        n = int(winner["workers_per_trial"])
        how = f", {winner['parallelism']}" if isinstance(winner.get("parallelism"), str) and winner["parallelism"] else ""
        text = (f"{describe(winner, varying)} runs on the fewest GPUs per trial ({n}{how}) of the {n_qualified} "
                f"{pool}{that}, and has {highest} of those on {n}: {speed}.")
    elif quality:
        text = (f"{describe(winner, varying)} has {held_out.best_sentence(winner, quality)} of the {n_qualified} "
                f"{pool}{that}: {speed}.")
    else:
        text = f"{describe(winner, varying)} has {highest}, {speed}, of the {n_qualified} {pool}{that}."
    if is_finite(winner["loss_std"]):
        text += f" It peaks at {_gb(winner['peak_mem_gb'])} with loss std {_g(winner['loss_std'], 3)}."
    else:
        text += (f" It peaks at {_gb(winner['peak_mem_gb'])}; no loss std was measured for it, so the "
                 "normal range could not judge it.")
    if usable_gb is None:
        text += (f" No memory budget was given (pass --memory-budget-gb, or keep {ResultsDir.ENVIRONMENT} with "
                 "the GPU's memory in the results dir), so memory did not limit the choice.")
    return text


def _fits(rows: pd.DataFrame, usable_gb: float | None) -> pd.DataFrame:
    if usable_gb is None:
        return rows
    fitting = [budget.fits(float(p), usable_gb) for p in rows["peak_mem_gb"]]
    return rows[pd.Series(fitting, index=rows.index, dtype=bool)]


def _stable(rows: pd.DataFrame, limit: float | None) -> pd.DataFrame:
    """Rows not judged ``diverging`` (stability.py's verdict) whose pooled loss std is within
    ``limit``; a row without a loss std has nothing to judge it by and is kept."""
    rows = rows[rows["stability"].astype(str) != "diverging"] if "stability" in rows else rows
    if limit is None:
        return rows
    loss_std = rows[POOLED_COLUMN].astype(float)
    return rows[loss_std.isna() | (loss_std <= limit)]


def _nothing_fits(df: pd.DataFrame, usable: float | None, limit: float | None,
                  fitting: pd.DataFrame, common: dict[str, Any]) -> Recommendation:
    """``fitting``: the ok rows within ``usable``; none of them qualifies."""
    row, measured = cheapest_row(df)
    normal = " with a normal loss std" if limit is not None else ""  # None: no loss std was measured
    under = "" if usable is None else (f"under {usable:.2f} GB ({common['memory_budget_gb']:.2f} GB budget minus "
                                        f"a {100 * common['safety_margin']:g}% safety margin)")
    if len(fitting):  # something fits and is left out: no budget would help
        fate = "diverged" if all_diverging(fitting) else "is left out"
        why = f"Nothing to recommend: every completed configuration{' that peaks ' + under if under else ''} {fate}"
    elif usable is None:
        why = f"Nothing to recommend: no completed trial{normal} is on the frontier"
    else:
        why = f"Nothing fits: no configuration{normal} peaks {under}"
    why += f" ({len(df)} trial(s): {_status_counts(df)})." if len(df) else f" ({ResultsDir.RESULTS} has no trials)."
    why += left_out_sentence(fitting, POOLED_COLUMN, limit)
    if len(fitting):
        why += " A larger memory budget would not change this."
    cheapest = None
    if row is not None:
        cheapest = {"trial_id": str(row["trial_id"]), "config": config_of(row, common["varying"]), "metrics": _metrics(row),
                    "measured": bool(measured)}
    if row is not None and measured and not len(fitting):
        need_gb = budget.needed_gb(float(row["peak_mem_gb"]), common["safety_margin"])
        why += (f" The cheapest configuration measured is {describe(row, common['varying'])} at {_gb(row['peak_mem_gb'])} peak; "
                f"it needs a budget of at least {need_gb:.2f} GB.")
    elif row is not None and not measured:
        why += (f" No trial completed; the cheapest configuration tried is {describe(row, common['varying'])} "
                f"(status {row['status']}).") + failure_summary(df)
    why += lever_sentence(df, None)
    return Recommendation(trial_id=None, config={}, reason=why, runner_up=None, cheapest=cheapest, **common)
