"""The noise floor: configurations that are the same maths, their measured drift, and a loss std
that never ranks them against each other.

At one effective batch and learning set-up, micro_batch x grad_acc splits, checkpoint levels and
worker counts give the same update (tested in fp32: tests/train/test_loop.py,
test_checkpointing.py, test_distributed.py). Whatever their losses differ by is rounding (bf16:
benchmarks/README.md#stability-thresholds), not stability. So:

* :func:`same_maths_key` groups the rows: equal in every column of :data:`SAME_MATHS_COLUMNS`
  and in every swept train column (results.csv's columns beyond the contract's: lr, seed, ...);
* ``loss_std_pooled`` (:func:`with_pooled_loss_std`) is the largest loss_std of a row's ok
  group (its own for a row alone): the frontier's loss-std objective and the recommendation's
  stability filter and tie-break read it, so members of a group tie on that axis;
* :func:`noise_floor` measures each group's drift from steps.csv: the largest, over the steps
  every member ran, of max - min of their losses at that step (``max |delta loss|``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from dpo_sweep.analysis.tables import POOLED_COLUMN, fmt_sig, swept_train_columns, to_markdown
from dpo_sweep.core.status import Status
from dpo_sweep.results_dir import ResultsDir

#: Columns that set the maths of a trial's updates (besides the swept train columns).
SAME_MATHS_COLUMNS = ("model", "seq_len", "effective_batch", "beta", "loss_type", "precision", "reference")
#: The memory levers' columns, which set the maths too (what is trained, how it is stepped); a
#: frame without them (made by hand) is read as one family, as a results.csv without them loads.
LEVER_COLUMNS = ("adapter", "optimizer")
NOISE_FLOOR_HEADER = ("effective batch", "beta", "trials (micro_batch x checkpoint x grad_acc)",
                      "steps compared", "max |delta loss|", "loss std range")


def same_maths_columns(df: pd.DataFrame) -> list[str]:
    """The columns of ``df`` that set a row's maths: :data:`SAME_MATHS_COLUMNS` and the swept ones."""
    return list(dict.fromkeys([c for c in (*SAME_MATHS_COLUMNS, *LEVER_COLUMNS) if c in df.columns]
                              + swept_train_columns(df)))


def same_maths_key(df: pd.DataFrame) -> pd.Series:
    """One string per row, equal for rows that are the same maths. A row is its own group (its
    trial id) when the frame lacks a column of :data:`SAME_MATHS_COLUMNS` or the row has no
    effective batch: what cannot be shown to be the same maths is not pooled."""
    if any(c not in df.columns for c in SAME_MATHS_COLUMNS):
        return df["trial_id"].astype(str)
    keys = ["|".join(map(str, row)) for row in df[same_maths_columns(df)].itertuples(index=False)]
    known = pd.to_numeric(df["effective_batch"], errors="coerce").notna().to_numpy()
    return pd.Series([k if ok else f"trial:{t}" for k, ok, t in zip(keys, known, df["trial_id"])],
                     index=df.index, dtype=object)


def with_pooled_loss_std(df: pd.DataFrame) -> pd.DataFrame:
    """A copy with ``loss_std_pooled``: the max loss_std over the row's ok same-maths group."""
    out = df.copy()
    key = same_maths_key(df)
    ok = df["status"] == Status.OK
    std = df["loss_std"].astype(float)
    # max() skips NaN: a group member without a loss std does not erase the others'.
    group_max = std[ok].groupby(key[ok]).transform("max")
    out[POOLED_COLUMN] = std
    out.loc[ok, POOLED_COLUMN] = group_max
    return out


@dataclass(frozen=True)
class SameMathsGroup:
    """Ok trials that are the same maths, and how far apart their losses measured."""

    trial_ids: tuple[str, ...]
    splits: tuple[str, ...]
    effective_batch: float
    beta: float
    steps_compared: int
    max_abs_delta_loss: float
    loss_std_low: float
    loss_std_high: float


def _drift(steps: pd.DataFrame | None, ids: list[str]) -> tuple[int, float]:
    if steps is None or not len(steps):
        return 0, math.nan
    mine = steps[steps["trial_id"].isin(ids)]
    losses = mine.pivot_table(index="step", columns="trial_id", values="loss", aggfunc="first")
    losses = losses.reindex(columns=ids).dropna()  # steps every member ran
    if losses.empty:
        return 0, math.nan
    return len(losses), float((losses.max(axis=1) - losses.min(axis=1)).max())


def noise_floor(df: pd.DataFrame, steps: pd.DataFrame | None) -> list[SameMathsGroup]:
    """Every group of two or more ok trials that are the same maths, in order of first row."""
    ok = df[df["status"] == Status.OK]
    groups = []
    for _, rows in ok.groupby(same_maths_key(ok), sort=False):
        if len(rows) < 2:
            continue
        ids = [str(t) for t in rows["trial_id"]]
        n, drift = _drift(steps, ids)
        std = rows["loss_std"].astype(float)
        groups.append(SameMathsGroup(
            trial_ids=tuple(ids),
            splits=tuple(f"{r.micro_batch} x {r.checkpoint_level} x {r.grad_acc}" for r in rows.itertuples()),
            effective_batch=float(rows["effective_batch"].iloc[0]), beta=float(rows["beta"].iloc[0]),
            steps_compared=n, max_abs_delta_loss=drift,
            loss_std_low=float(std.min()), loss_std_high=float(std.max())))
    return groups


def noise_floor_rows(groups: list[SameMathsGroup]) -> list[list[str]]:
    return [[fmt_sig(g.effective_batch), fmt_sig(g.beta),
             ", ".join(f"{t} ({s})" for t, s in zip(g.trial_ids, g.splits)),
             str(g.steps_compared) if g.steps_compared else "-", fmt_sig(g.max_abs_delta_loss),
             f"{fmt_sig(g.loss_std_low)} - {fmt_sig(g.loss_std_high)}"] for g in groups]


def noise_floor_markdown(groups: list[SameMathsGroup]) -> str:
    """frontier.md's noise-floor section ("" when no two trials are the same maths)."""
    if not groups:
        return ""
    return ("## Noise floor\n\nThese trials are the same maths (one effective batch and learning set-up, "
            "split differently): their losses differ only by rounding, so they are never ranked against "
            "each other by loss std (the frontier and the recommendation use each group's largest loss std, "
            "`loss_std_pooled`). `max |delta loss|`: the largest gap between their losses at one step "
            f"({ResultsDir.STEPS}).\n\n" + to_markdown(NOISE_FLOOR_HEADER, noise_floor_rows(groups)))


def noise_floor_sentence(group: SameMathsGroup) -> str:
    """One group in words (the HTML report's note)."""
    drift = (f"max |delta loss| {fmt_sig(group.max_abs_delta_loss)} over {group.steps_compared} steps"
             if group.steps_compared else f"no {ResultsDir.STEPS} rows to compare")
    return (f"Noise floor: {', '.join(group.trial_ids)} are the same maths (effective batch "
            f"{fmt_sig(group.effective_batch)}, beta {fmt_sig(group.beta)}, split differently): {drift}, loss std "
            f"{fmt_sig(group.loss_std_low)} - {fmt_sig(group.loss_std_high)}; not ranked against each other by it.")
