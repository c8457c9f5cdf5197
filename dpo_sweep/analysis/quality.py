"""Held-out quality in the recommendation.

When the space's objectives name a held-out score (``data.eval_pairs``: ``eval_reward_accuracy``,
``eval_reward_margin``, ``eval_loss``), that score is what the sweep was asked to choose by: it
ranks the candidates first, best measured value first, and the throughput rules of
:mod:`dpo_sweep.analysis.ranking` order only candidates whose held-out scores are equal (the
learning set-ups that share one memory/time measurement - betas, lrs - have the same throughput
and peak, so without this the trial id would decide between them).

A held-out accuracy is a count over the split: on 64 pairs, 1.000 and 0.969 differ by two pairs.
The measured value still ranks (it is the best estimate there is), and the reason says how many
pairs the runner-up's difference is and whether it lies inside the winner's 95% Wilson interval,
so that a reader knows when a larger split would be needed to trust the order.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from dpo_sweep.analysis import pareto
from dpo_sweep.analysis.reasons import listed
from dpo_sweep.analysis.tables import fmt_setting, is_finite

#: The objectives scored on the held-out split (pareto.OBJECTIVE_COLUMNS names their columns).
HELD_OUT_OBJECTIVES = ("eval_reward_accuracy", "eval_reward_margin", "eval_loss")
#: How each reads in a sentence.
LABELS = {"eval_reward_accuracy": "held-out reward accuracy", "eval_reward_margin": "held-out reward margin",
          "eval_loss": "held-out DPO loss"}
_Z95 = 1.959964


def quality_objectives(objectives: tuple[pareto.Objective, ...] | None) -> tuple[pareto.Objective, ...]:
    """The held-out ones of ``objectives``, in their order."""
    return tuple(o for o in objectives or () if o.name in HELD_OUT_OBJECTIVES)


def quality_key(rows: pd.DataFrame, quality: tuple[pareto.Objective, ...]) -> list[tuple[float, ...]]:
    """Per row, its held-out scores as minimisation values (NaN: last), in ``quality``'s order."""
    if not quality:
        return [() for _ in range(len(rows))]
    values = pareto.as_minimisation(rows, quality)
    return [tuple(v if math.isfinite(v) else math.inf for v in row) for row in values]


def quality_groups(rows: pd.DataFrame, quality: tuple[pareto.Objective, ...]) -> list[pd.DataFrame]:
    """``rows`` split by equal held-out scores, the best first (one group when ``quality`` is empty)."""
    if not quality or rows.empty:
        return [rows]
    keys = pd.Series(quality_key(rows, quality), index=rows.index)
    return [rows[keys == k] for k in sorted(set(keys))]


def wilson(p: float, n: int) -> tuple[float, float]:
    """The 95% Wilson score interval of a proportion ``p`` measured on ``n`` pairs."""
    if n <= 0 or not math.isfinite(p):
        return math.nan, math.nan
    centre = (p + _Z95 ** 2 / (2 * n)) / (1 + _Z95 ** 2 / n)
    half = _Z95 * math.sqrt(p * (1 - p) / n + _Z95 ** 2 / (4 * n * n)) / (1 + _Z95 ** 2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _pairs(row: pd.Series) -> int:
    n = row.get("eval_pairs")
    return int(n) if is_finite(n) and int(n) > 0 else 0


def score(row: pd.Series, objective: pareto.Objective) -> str:
    """``1.000 on 64 held-out pairs`` (an accuracy), ``3.67`` (a margin or loss); ``n/a``."""
    value = row.get(objective.column)
    if not is_finite(value):
        return "n/a"
    if objective.name == "eval_reward_accuracy":
        n = _pairs(row)
        return f"{float(value):.3f}" + (f" on {n} held-out pairs" if n else "")
    return f"{float(value):.3g}"


def best_sentence(winner: pd.Series, quality: tuple[pareto.Objective, ...]) -> str:
    """``the best held-out reward accuracy (1.000 on 64 held-out pairs)``, for the first sentence."""
    first = quality[0]
    best = "the lowest" if first.direction == "min" else "the best"
    return f"{best} {LABELS[first.name]} ({score(winner, first)})"


def _difference(winner: pd.Series, other: pd.Series, objective: pareto.Objective) -> str:
    """What ``other`` scored on ``objective``, with the sampling noise of an accuracy: ``0.969
    held-out reward accuracy, 2 of 64 pairs fewer, inside this one's 95% interval 0.94-1.00 (...)``."""
    label = LABELS[objective.name]
    if objective.name != "eval_reward_accuracy" or not (n := _pairs(winner)) or not is_finite(other.get(objective.column)):
        return f"{score(other, objective)} {label}"
    w, o = float(winner[objective.column]), float(other[objective.column])
    low, high = wilson(w, n)
    where = ("inside this one's 95% interval {:.2f}-{:.2f}: a larger data.eval_pairs would tell them apart"
             if low <= o <= high else "outside this one's 95% interval {:.2f}-{:.2f}").format(low, high)
    return f"{o:.3f} {label}, {round(abs(w - o) * n)} of {n} pairs {'fewer' if o < w else 'more'}, {where}"


def _setting(row: pd.Series, varying: tuple[str, ...]) -> str:
    shown = [c for c in varying if c in row.index] + ["beta"]
    return f"{row['trial_id']} ({', '.join(f'{c} {fmt_setting(row[c])}' for c in dict.fromkeys(shown))})"


def ranked_sentence(winner: pd.Series, ranked: pd.DataFrame, quality: tuple[pareto.Objective, ...],
                    varying: tuple[str, ...] = (), limit: int = 4) -> str:
    """`` The objectives rank held-out quality first: t5 (lr 1e-06, beta 0.05) scored 0.969, 2 of
    64 pairs fewer, ...``: each candidate behind the winner on a held-out score, best first; ""
    when none is (or no objective is held out)."""
    if not quality:
        return ""
    mine = quality_key(winner.to_frame().T, quality)[0]
    behind = [(r, k) for (_, r), k in zip(ranked.iterrows(), quality_key(ranked, quality))
              if k != mine and r["trial_id"] != winner["trial_id"]]
    if not behind:
        return ""
    shown = []
    for r, k in behind[:limit]:
        first = next(o for o, a, b in zip(quality, k, mine) if a != b)  # the score that separates them
        shown.append(f"{_setting(r, varying)} scored {_difference(winner, r, first)}")
    more = f"; and {len(behind) - limit} more" if len(behind) > limit else ""
    names = listed([LABELS[o.name] for o in quality])
    return f" The space's objectives rank {names} before throughput; behind it on that: {'; '.join(shown)}{more}."


def same_quality(rows: pd.DataFrame, winner: pd.Series, quality: tuple[pareto.Objective, ...]) -> pd.Series:
    """Rows of ``rows`` whose held-out scores equal the winner's (all rows when none is held out)."""
    if not quality:
        return pd.Series(True, index=rows.index, dtype=bool)
    mine = quality_key(winner.to_frame().T, quality)[0]
    return pd.Series([k == mine for k in quality_key(rows, quality)], index=rows.index, dtype=bool)


def cost_part(winner: pd.Series, other: pd.Series, quality: tuple[pareto.Objective, ...]) -> str:
    """``score 0.969 held-out reward accuracy instead of 1.000``; "" when equal or none is held out."""
    parts = []
    for o in quality:
        w, v = winner.get(o.column), other.get(o.column)
        if is_finite(w) and is_finite(v) and not np.isclose(float(w), float(v), rtol=0, atol=1e-12):
            fmt = (lambda x: f"{float(x):.3f}") if o.name == "eval_reward_accuracy" else (lambda x: f"{float(x):.3g}")
            parts.append(f"score {fmt(v)} {LABELS[o.name]} instead of {fmt(w)}")
    return listed(parts) if parts else ""
