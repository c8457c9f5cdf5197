"""The report's top: a headline card of 3-4 short bullets, and banners for what could mislead.

The card says what a reader needs before the details: how much memory the winner leaves, why it
won (fastest, or fastest inside the noise), what the runner-up would cost, and what to watch. The
recommendation's full reason stays one click away. Banners say, above everything, when the sweep
did not finish, when the headline's figures are extrapolated or modelled (simulated ranks), when
stability verdicts are still pending, and when the machine's step times are too noisy to separate the
top rows.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from dpo_sweep.core import noise
from dpo_sweep.analysis.completeness import Completeness
from dpo_sweep.analysis.pareto import GPUS, Objective, gpus_per_trial
from dpo_sweep.analysis.quality import best_sentence, quality_objectives, same_quality
from dpo_sweep.analysis.reasons import amount, no_loss_std_sentence, tied_faster
from dpo_sweep.analysis.recommend import Recommendation
from dpo_sweep.analysis.tables import fmt_setting, is_finite, row_of, short_id
from dpo_sweep.core.status import TimeSource
from dpo_sweep.records import PENDING
from dpo_sweep.results_dir import ResultsDir
from dpo_sweep.core.stability import ROLLBACK_LOGRATIO_STD

#: Tied rows (overlapping throughput intervals, the winner's included) from which the top rows
#: count as not separated by the machine.
NOISY_TOP_ROWS = 3


@dataclass(frozen=True)
class Banner:
    """One warning above the report: ``kind`` names it (a CSS class and a test's handle)."""

    kind: str
    text: str


def short_config(row: pd.Series | dict[str, Any], varying: tuple[str, ...] = ()) -> str:
    """``t003 (mb 4, L1, ga 64, lora, adamw_8bit)``: a trial in a few words."""
    get = row.get
    parts = [f"mb {fmt_setting(get('micro_batch'))}", str(get("checkpoint_level")), f"ga {fmt_setting(get('grad_acc'))}"]
    parts += [f"{k} {fmt_setting(get(k))}" for k in varying if k in row]
    return f"{short_id(str(get('trial_id')))} ({', '.join(parts)})"


def _qualifying(analysed: pd.DataFrame, rec: Recommendation) -> pd.DataFrame:
    """The rows the recommendation chose among: eligible, fitting, not diverging."""
    rows = analysed[analysed["eligible"].astype(bool)]
    if rec.usable_memory_gb is not None:
        rows = rows[rows["peak_mem_gb"].astype(float) <= rec.usable_memory_gb]
    return rows


def headline_bullets(analysed: pd.DataFrame, rec: Recommendation, objectives: tuple[Objective, ...] = ()) -> list[str]:
    """3-4 bullets: room to spare, why it won, the runner-up's cost, what to watch ([] without a
    winner); ``objectives``: the analysis's, whose held-out score or GPU count ranked first where
    they name one (analysis/ranking.py)."""
    win = row_of(analysed, rec.trial_id)
    if win is None:
        return []
    peak = float(win["peak_mem_gb"]) if is_finite(win["peak_mem_gb"]) else None
    bullets = []
    if peak is not None and rec.usable_memory_gb is not None:
        bullets.append(f"Fits: peaks at {peak:.2f} GB, {rec.usable_memory_gb - peak:.2f} GB to spare under the "
                       f"{rec.usable_memory_gb:.2f} GB usable ({rec.memory_budget_gb:.2f} GB budget minus "
                       f"{100 * rec.safety_margin:g}%).")
    elif peak is not None:
        bullets.append(f"Peaks at {peak:.2f} GB; no memory budget was given, so memory did not limit the choice.")
    pool = _qualifying(analysed, rec)
    tps = f"{amount(win['tokens_per_s'])} tokens/s"
    if first := _ranked_first(win, pool, objectives, tps):
        bullets.append(first)
    elif len(faster := tied_faster(win, pool)):
        bullets.append(f"Fastest inside the noise: {tps}; {len(faster)} configuration(s) measured more, but within "
                       "its throughput interval (p10-p90 step times widened for the steps measured), and ties go to less memory.")
    elif len(pool) > 1:
        bullets.append(f"Fastest of the {len(pool)} configurations that qualify: {tps}.")
    else:
        bullets.append(f"The only configuration that qualifies: {tps}.")
    if rec.runner_up:
        up = rec.runner_up
        bullets.append(f"Runner-up {short_config({**up['config'], 'trial_id': up['trial_id']}, rec.varying)} "
                       f"would {up['cost']}.")
    bullets.append(_watch(win))
    return bullets


def _ranked_first(win: pd.Series, pool: pd.DataFrame, objectives: tuple[Objective, ...], tps: str) -> str:
    """The why-it-won bullet when a held-out score or the GPU count ranked before throughput and
    the qualifying rows differ in it; "" otherwise."""
    quality = quality_objectives(objectives)
    if quality and (same := pool[same_quality(pool, win, quality)]).shape[0] < len(pool):
        best = best_sentence(win, quality).removeprefix("the ")
        tail = f"; the fastest of the {len(same)} that score as well: {tps}." if len(same) > 1 else f"; {tps}."
        return f"Ranked by held-out quality first: {best}{tail}"
    gpus = gpus_per_trial(pool)
    if GPUS in objectives and gpus.nunique() > 1:
        n = int(win["workers_per_trial"])
        how = f" ({win['parallelism']})" if isinstance(win.get("parallelism"), str) and win["parallelism"] else ""
        on = int((gpus == n).sum())
        tail = f"; the fastest of the {on} configurations on {n}: {tps}." if on > 1 else f": {tps}."
        return f"Fewest GPUs that fit: {n} per trial{how}{tail}"
    return ""


def _watch(win: pd.Series) -> str:
    """The one thing to watch about the winner."""
    verdict = win.get("stability") if isinstance(win.get("stability"), str) else ""
    if verdict == PENDING:
        return ("Watch: its stability is not judged yet (its learning trial did not run); resume the sweep "
                "before trusting it for a long run.")
    if win.get("step_time_source") == TimeSource.MODELLED:
        return (f"Watch: its step time is modelled, not timed on {fmt_setting(win.get('workers_per_trial'))} GPUs "
                "(simulated ranks: one rank's compute plus the step's collectives at the card's GPU-to-GPU "
                "bandwidth, no overlap); its peak is one GPU's, measured.")
    if win.get("step_time_source") == TimeSource.EXTRAPOLATED:
        return (f"Watch: its step time is extrapolated from a shorter accumulation; `dpo-sweep trial "
                f"{ResultsDir.RECOMMENDED}` times it at grad_acc {fmt_setting(win.get('grad_acc'))}.")
    if verdict == "noisy":
        return "Watch: its learning trial was judged noisy; check the loss and grad-norm curves below."
    if not is_finite(win.get("loss_std")):
        return "Watch: no loss std was measured for it, so nothing judged how it learns."
    return (f"Watch: the log-ratio std in the real run; above {ROLLBACK_LOGRATIO_STD:g} for several steps in a "
            "row is the sign of divergence (the curve below).")


def banners(analysed: pd.DataFrame, rec: Recommendation, state: Completeness) -> list[Banner]:
    """The warnings that hold for this report, most serious first."""
    out = []
    missing, waiting = state.counts()
    if missing:
        out.append(Banner("incomplete", f"This sweep did not finish: {missing} configuration(s) of {ResultsDir.SPACE} "
                          f"have no row ({ResultsDir.RECOMMENDATION}'s still_to_run lists them). The recommendation is "
                          "among what was measured; `dpo-sweep run SPACE --output DIR --resume` continues it."))
    if waiting:
        lead = f"Stability pending for {waiting} row(s)" if missing else (
            f"This sweep did not finish: stability pending for {waiting} row(s)")
        out.append(Banner("pending", f"{lead}: their learning trials did not run, so their loss std and stability "
                          "verdict are missing; `dpo-sweep run SPACE --output DIR --resume` runs them."))
    if state.skipped:
        out.append(Banner("skipped", f"{len(state.skipped)} point(s) of the space cannot run and were skipped: "
                          + "; ".join(p.line().strip().removeprefix("skipped ") for p in state.skipped)))
    lacking_std = no_loss_std_sentence(analysed).strip()
    if lacking_std:
        out.append(Banner("no-loss-std", lacking_std))
    win = row_of(analysed, rec.trial_id)
    if win is not None and win.get("step_time_source") == TimeSource.EXTRAPOLATED:
        out.append(Banner("extrapolated", f"The recommended trial's step time and tokens/s are extrapolated from a "
                          f"shorter gradient accumulation, not measured at grad_acc {fmt_setting(win.get('grad_acc'))}."))
    modelled = analysed[analysed["step_time_source"] == TimeSource.MODELLED] if "step_time_source" in analysed else ()
    if len(modelled):
        out.append(Banner("modelled", _modelled_text(modelled, win)))
    if win is not None:
        pool = _qualifying(analysed, rec)
        tied = pool[noise.overlaps(pool["throughput_low"], pool["throughput_high"],
                                   win["throughput_low"], win["throughput_high"])]
        # One measurement shared by several learning set-ups (betas, lrs) is one row here.
        tied = tied.drop_duplicates(["peak_mem_gb", "tokens_per_s"])
        if len(tied) >= NOISY_TOP_ROWS:
            low, high = float(win["throughput_low"]), float(win["throughput_high"])
            out.append(Banner("noisy", f"This machine's step times are too noisy to separate the top {len(tied)} "
                              f"configurations: their throughput intervals (p10-p90 step times widened for the steps measured) overlap (the winner's spans "
                              f"{amount(low)}-{amount(high)} tokens/s). The tie-break chose among them (less memory, then the "
                              "stability verdict, then the most tokens/s, then the trial id); time them again on a quieter machine (or "
                              "with more steps) to rank them."))
    return out


def _modelled_text(modelled: pd.DataFrame, win: pd.Series | None) -> str:
    """What a simulated-ranks row's figures are: peaks measured on one GPU, times modelled."""
    lead = (f"The recommended trial and {len(modelled) - 1} other row(s)"
            if win is not None and win.get("step_time_source") == TimeSource.MODELLED
            else f"{len(modelled)} row(s)")
    return (f"{lead} ran as rank 0 of their workers_per_trial alone on one GPU (simulated ranks, "
            "resources.simulate_ranks): their peaks are one GPU's of that many, measured; their step times and "
            "tokens/s are modelled (one rank's compute plus comm_ms of all-gather, reduce-scatter and all-reduce "
            "bytes at the card's GPU-to-GPU bandwidth, no overlap), not timed on that many GPUs; their losses are "
            "no learning signal.")
