"""Sentences of the recommendation's reason that stand on their own: numbers as people write
them (``51,640 tokens/s``), the tie and exact-comparison sentences (the rule is in
:mod:`dpo_sweep.analysis.noise`), and what failed when no trial completed."""
from __future__ import annotations

from typing import Any

import pandas as pd

from dpo_sweep.analysis import noise
from dpo_sweep.analysis.tables import is_finite


def amount(value: Any) -> str:
    """A rate or a duration for a sentence: ``51,640``, ``12,345``, ``87.5``; ``n/a`` if not finite."""
    if not is_finite(value):
        return "n/a"
    v = float(value)
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def tied_faster(winner: pd.Series, pool: pd.DataFrame) -> pd.DataFrame:
    """Rows of ``pool`` that measured more tokens/s than ``winner`` inside its noise (overlapping
    throughput intervals), most tokens/s first: the ones a tie decided against."""
    faster = pool[(pool["tokens_per_s"].astype(float) > float(winner["tokens_per_s"]))
                  & noise.overlaps(pool["throughput_low"], pool["throughput_high"],
                                   winner["throughput_low"], winner["throughput_high"])]
    return faster.sort_values(["tokens_per_s", "trial_id"], ascending=[False, True], kind="mergesort")


def interval(row: pd.Series) -> str:
    return f"{amount(row['throughput_low'])}-{amount(row['throughput_high'])} tokens/s"


def tie_sentence(winner: pd.Series, faster: pd.DataFrame) -> str:
    """`` A tie decided: t8 measured more tokens/s (1,010 vs 1,000) but inside ...``; "" if none."""
    if faster.empty:
        return ""
    ids = ", ".join(str(t) for t in faster["trial_id"])
    rates = " and ".join(amount(v) for v in faster["tokens_per_s"])
    return (f" A tie decided: {ids} measured more tokens/s ({rates} vs {amount(winner['tokens_per_s'])}) "
            f"but inside the step-time noise (p10-p90 throughput intervals overlapping this one's, "
            f"{interval(winner)}), and ties go to less peak memory, then lower loss std.")


def exactness_sentence(candidates: pd.DataFrame) -> str:
    """Which candidates' throughputs were compared exactly, for want of a measured spread."""
    if len(candidates) < 2:
        return ""
    exact = candidates[~noise.has_spread(candidates)]
    if len(exact) == len(candidates):
        return (" Throughputs were compared exactly: no step-time spread (step_time_p10_ms, "
                "step_time_p90_ms) was measured.")
    if len(exact):
        return (" Throughputs of " + ", ".join(str(t) for t in exact["trial_id"])
                + " were compared exactly: no step-time spread was measured for them.")
    return ""


#: How each failed status reads in a sentence; only ``oom`` gets memory advice.
_FAILED_AS = {"oom": "ran out of memory", "error": "failed with an error", "diverged": "diverged",
              "pruned": "were pruned"}
_MEMORY_ADVICE = "try a smaller micro_batch, a stronger checkpoint level (L2, L3, full) or a GPU with more memory"


def failure_summary(df: pd.DataFrame, max_ids: int = 5) -> str:
    """`` 2 failed with an error (a, b): <first message>. 1 ran out of memory (c): try ...``:
    what failed, per status, with advice only where the failure says what would help."""
    out = ""
    for status, verb in _FAILED_AS.items():
        rows = df[df["status"] == status]
        if rows.empty:
            continue
        ids = [str(t) for t in rows["trial_id"]]
        shown = ", ".join(ids[:max_ids]) + (f" and {len(ids) - max_ids} more" if len(ids) > max_ids else "")
        messages = list(dict.fromkeys(str(e).strip() for e in rows["error"] if str(e).strip()))
        if status == "oom":
            detail = _MEMORY_ADVICE
        elif messages:
            detail = messages[0][:300] + (f" (and {len(messages) - 1} other message(s))" if len(messages) > 1 else "")
        else:
            detail = "no message recorded"
        out += f" {len(ids)} {verb} ({shown}): {detail}."
    return out
