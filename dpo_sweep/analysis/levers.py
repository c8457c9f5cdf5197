"""The recommendation's sentence across memory-lever families (``adapter`` x ``optimizer``):
what each family other than the winner's needs or gives here, e.g. `` Across the levers: full
fine-tuning + adamw needs at least 84.1 GB here (t001, predicted, pruned); lora + adamw peaks at
31.2 GB at 5,120 tokens/s (t014).``"""
from __future__ import annotations

import pandas as pd

from dpo_sweep.analysis.reasons import amount
from dpo_sweep.analysis.tables import is_finite
from dpo_sweep.core.status import Status

#: How an adapter is named in a sentence.
ADAPTER_WORDS = {"full": "full fine-tuning", "lora": "LoRA", "qlora": "QLoRA"}


def _family(row: pd.Series) -> tuple[str, str]:
    return (str(row.get("adapter", "") or "full"), str(row.get("optimizer", "") or "adamw"))


def family_words(adapter: str, optimizer: str) -> str:
    return f"{ADAPTER_WORDS.get(adapter, adapter)} + {optimizer}"


def _lower_bound_gb(row: pd.Series) -> float:
    """What a row that did not complete says about its peak: an OOM's peak up to the failure, a
    pruned row's prediction."""
    value = row["peak_mem_gb"] if row["status"] == Status.OOM else row.get("predicted_peak_gb")
    return float(value) if is_finite(value) else float("nan")


def _family_clause(rows: pd.DataFrame) -> str | None:
    ok = rows[(rows["status"] == Status.OK) & rows["peak_mem_gb"].map(is_finite)]
    if not ok.empty:
        best = ok.sort_values(["tokens_per_s", "peak_mem_gb"], ascending=[False, True], kind="mergesort").iloc[0]
        return (f"peaks at {float(best['peak_mem_gb']):.1f} GB at {amount(best['tokens_per_s'])} tokens/s "
                f"at best ({best['trial_id']})")
    failed = rows[rows["status"].isin([Status.OOM, Status.PRUNED])].copy()
    failed["bound"] = failed.apply(_lower_bound_gb, axis=1)
    failed = failed[failed["bound"].map(is_finite)]
    if failed.empty:
        return None
    least = failed.sort_values("bound", kind="mergesort").iloc[0]
    how = "ran out of memory" if least["status"] == Status.OOM else "predicted, pruned"
    return f"needs at least {least['bound']:.1f} GB here ({least['trial_id']}, {how})"


def lever_sentence(df: pd.DataFrame, winner: pd.Series | None) -> str:
    """One sentence on every adapter x optimizer family of ``df`` but the winner's; "" when the
    results hold one family (or none of these columns)."""
    if "adapter" not in df.columns or df.empty:
        return ""
    families = df.apply(_family, axis=1)
    own = _family(winner) if winner is not None else None
    clauses = []
    for family in dict.fromkeys(families):
        if family == own:
            continue
        clause = _family_clause(df[families.map(lambda f, family=family: f == family)])
        if clause:
            clauses.append(f"{family_words(*family)} {clause}")
    if not clauses or (own is None and len(clauses) < 2):
        return ""
    return " Across the levers: " + "; ".join(clauses) + "."
