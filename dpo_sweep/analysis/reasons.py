"""Sentences of the recommendation's reason that stand on their own: numbers as people write
them (``51,640 tokens/s``), the tie and exact-comparison sentences (the rule is in
:mod:`dpo_sweep.core.noise`), the learning set-ups one measurement stands for, and what
failed when no trial completed."""
from __future__ import annotations

from typing import Any

import pandas as pd

from dpo_sweep.core import noise
from dpo_sweep.core.stability import MIN_STD_VALUES
from dpo_sweep.analysis.noise_floor import same_maths_columns, same_maths_key
from dpo_sweep.analysis.pareto import gpus_per_trial
from dpo_sweep.analysis.tables import fmt_sig, is_finite
from dpo_sweep.core.status import Status, TimeSource


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
            f"but inside the step-time noise (throughput intervals, from the p10-p90 step times widened for the steps measured, overlapping this one's, "
            f"{interval(winner)}), and ties go to less peak memory, then the stability verdict, then the "
            "most tokens/s, then the trial id.")


def _setting(row: pd.Series, columns: list[str]) -> str:
    return " ".join(f"{c} {fmt_sig(row[c], 4) if is_finite(row[c]) else row[c]}" for c in columns)


def listed(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def learning_trials(rows: pd.DataFrame) -> str:
    """``16 steps, bf16-mixed``: how the rows' learning trials ran (stability_steps/_precision);
    "" when the results file does not say (written before those columns)."""
    if "stability_steps" not in rows or "stability_precision" not in rows:
        return ""
    ran = dict.fromkeys(f"{int(s)} steps, {p}" for s, p in zip(rows["stability_steps"], rows["stability_precision"])
                        if is_finite(s) and p is not pd.NA and str(p))
    return " or ".join(ran)


def shared_measurement_sentence(winner: pd.Series, sharing: pd.DataFrame) -> str:
    """`` beta 0.05, 0.1 and 0.3 share this measurement; their learning trials (16 steps,
    bf16-mixed) were all `stable` and are not ranked by loss std (one trial each), so the first in
    the space is named: choose beta by your own evaluation.`` ``sharing``: the qualifying rows
    (winner included) with the winner's memory/time measurement; "" when they are one learning
    set-up."""
    sharing = sharing.sort_values("trial_id", kind="mergesort")  # never the rows' order
    sets = sharing[~same_maths_key(sharing).duplicated()]
    if len(sets) < 2:
        return ""
    differ = [c for c in same_maths_columns(sets) if sets[c].astype(str).nunique() > 1]
    if len(differ) == 1:
        c = differ[0]
        names = f"{c} " + listed([fmt_sig(v, 4) if is_finite(v) else str(v) for v in sets[c]])
    else:
        names = listed([_setting(r, differ) for _, r in sets.iterrows()])
    how = learning_trials(sets)
    verdicts = [str(v) if v is not pd.NA else "" for v in sets.get("stability", pd.Series("", index=sets.index))]
    if len(set(verdicts)) == 1:
        were = f"were all `{verdicts[0]}`" if verdicts[0] else "have no stability verdict"
        named = "the first in the space is named"
    else:
        were = "were " + listed([f"`{v or 'no verdict'}` ({_setting(r, differ)})" for v, (_, r) in zip(verdicts, sets.iterrows())])
        named = f"the first with the best verdict (`{winner.get('stability') or 'none'}`) in the space is named"
    return (f" {names} share this measurement; their learning trials{f' ({how})' if how else ''} {were} and "
            f"are not ranked by loss std (one trial each), so {named}: choose {' and '.join(differ)} by your "
            "own evaluation.")


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


def time_source_sentence(winner: pd.Series) -> str:
    """Where the winner's step time comes from, when it is not its own full timing."""
    source = winner.get("step_time_source")
    if source == TimeSource.MODELLED:
        comm = winner.get("comm_ms")
        of_it = f", {fmt_sig(comm)} ms of it communication" if is_finite(comm) else ""
        return (f" Its peak is one GPU's of {int(winner['workers_per_trial'])}, measured on simulated ranks; its step "
                f"time is modelled (one rank's compute plus the step's collectives at the card's GPU-to-GPU "
                f"bandwidth, no overlap{of_it}), not timed on {int(winner['workers_per_trial'])} GPUs.")
    if source == TimeSource.EXTRAPOLATED:
        return " Its step time is extrapolated from a shorter gradient accumulation, not timed at its grad_acc."
    return ""


#: How each failed status reads in a sentence; only ``oom`` gets memory advice.
_FAILED_AS = {Status.OOM: "ran out of memory", Status.ERROR: "failed with an error", Status.DIVERGED: "diverged",
              Status.PRUNED: "were pruned", Status.TIMEOUT: "ran past their time limit",
              Status.STOPPED: "were stopped early on their held-out metric (search.scheduler)"}
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
        if status == Status.OOM:
            detail = _MEMORY_ADVICE
        elif messages:
            detail = messages[0][:300] + (f" (and {len(messages) - 1} other message(s))" if len(messages) > 1 else "")
        else:
            detail = "no message recorded"
        out += f" {len(ids)} {verb} ({shown}): {detail}."
    return out


def _is_diverging(rows: pd.DataFrame) -> pd.Series:
    if "stability" not in rows:
        return pd.Series(False, index=rows.index)
    return rows["stability"].astype(str) == "diverging"


def divergence_cause(row: pd.Series) -> str:
    """``rollback at step 9``: what the row's columns say made its learning trial ``diverging``."""
    step = row.get("rollback_step")
    if is_finite(step):
        return f"rollback at step {int(step)}"
    return "its learning trial's stability verdict"


def left_out_sentence(rows: pd.DataFrame, loss_std: str, limit: float | None) -> str:
    """`` Left out as diverging: t015 (rollback at step 9). Left out for a loss std above the
    normal range (<= 0.491): t3 (0.52).``: why each of ``rows`` (fitting rows that do not qualify)
    is left out, its real cause first; ``loss_std``: the column the range is judged on."""
    diverging = _is_diverging(rows)
    out = ""
    if diverging.any():
        out += " Left out as diverging: " + ", ".join(
            f"{r['trial_id']} ({divergence_cause(r)})" for _, r in rows[diverging].iterrows()) + "."
    wide = rows[~diverging]
    if len(wide):
        bound = f" (<= {fmt_sig(limit, 3)})" if limit is not None else ""
        out += f" Left out for a loss std above the normal range{bound}: " + ", ".join(
            f"{r['trial_id']} ({fmt_sig(r[loss_std], 3)})" for _, r in wide.iterrows()) + "."
    return out


def all_diverging(rows: pd.DataFrame) -> bool:
    """True when ``rows`` is not empty and every one of them is ``diverging``."""
    return bool(len(rows)) and bool(_is_diverging(rows).all())


def no_loss_std_sentence(analysed: pd.DataFrame) -> str:
    """Why ``ok`` rows are off the frontier for want of a loss std (it is an objective: such a row
    cannot be compared), and the fix; "" when every ok row has one or none needs it."""
    ok = analysed[analysed["status"] == Status.OK]
    lacking = ok[~ok["eligible"].astype(bool) & ok["loss_std"].isna() & ~_is_diverging(ok)]
    if lacking.empty:
        return ""
    own = lacking[lacking["stability_from"].isin(["", *lacking["trial_id"]])]
    measured = sorted({int(v) for v in own.get("measured_steps", pd.Series(dtype=float)) if is_finite(v) and v > 0})
    ran = f"; they measured {' or '.join(map(str, measured))}" if measured else ""
    return (f" {len(lacking)} of {len(ok)} completed trial(s) have no loss std, so they cannot be compared "
            f"on it and are not on the frontier: a loss std is the spread of the loss around its trend "
            f"line, which needs at least {MIN_STD_VALUES} measured steps (after train.warmup_steps){ran}. "
            f"Give train.steps (and train.learning_steps, when set) at least warmup_steps + "
            f"{MIN_STD_VALUES}, or leave loss_std out of the objectives.")


def gpus_sentence(winner: pd.Series, candidates: pd.DataFrame) -> str:
    """`` On more GPUs the fastest is t9, on 8: 60,358 tokens/s (7,545 per GPU) against this one's
    24,626 (6,157 per GPU).``; "" when no candidate ran on more GPUs than the winner."""
    gpus = gpus_per_trial(candidates)
    n = int(gpus_per_trial(winner.to_frame().T).iloc[0])
    more = candidates[(gpus > n) & candidates["tokens_per_s"].astype(float).notna()]
    if more.empty:
        return ""
    fastest = more.loc[more["tokens_per_s"].astype(float).idxmax()]
    m = int(fastest["workers_per_trial"])

    def per_gpu(row: pd.Series, k: int) -> str:
        return f"{amount(row['tokens_per_s'])} tokens/s ({amount(float(row['tokens_per_s']) / k)} per GPU)"
    return (f" On more GPUs the fastest is {fastest['trial_id']}, on {m}: {per_gpu(fastest, m)} against "
            f"this one's {per_gpu(winner, n)}.")
