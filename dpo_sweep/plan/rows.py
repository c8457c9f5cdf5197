"""A configuration's results row from the trials that measured it (pure; no Ray, no torch).

A row's numbers come from up to two trials:

* its **memory/time measurement** (``measured_by``): the peak columns are copied; the step time
  is the measurement's own when it ran at the row's grad_acc (``step_time_source: measured``),
  else ``t_opt + grad_acc x t_micro`` fitted on the measurement's steps (``extrapolated``);
  throughput and MFU follow the extrapolated time (work per step grows with grad_acc), and its
  p10-p90 interval is the measurement's, scaled to it and widened by the extrapolation's own
  relative error (``extrapolation_error``, :class:`FittedStep`): p10 / (1 + e), p90 x (1 + e);
* its **learning trial** (``stability_from``): the loss trajectory at the row's real effective
  batch gives ``loss_mean``, ``loss_std``, ``grad_norm_mean``, ``reward_accuracy`` and
  ``reward_margin`` and stability.py's signals and verdict; ``stability_steps`` and
  ``stability_precision`` say how that trial ran (its ``train.learning_steps`` and
  ``learning_precision``, or the row's own steps and precision when the row is that trial).
"""
from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Sequence

from dpo_sweep.config import TrialConfig
from dpo_sweep.core import comms
from dpo_sweep.core.held_out import HELD_OUT_FIELDS
from dpo_sweep.core.status import Status, TimeSource
from dpo_sweep.plan.rules import extrapolate_step_ms, fit_step_time
from dpo_sweep.records import PENDING, TIMING_COLUMNS, StepRecord, TrialResult, config_columns

#: The columns a row takes from its learning trial, with the value they have when there is none.
STABILITY_COLUMNS: dict[str, object] = {
    "loss_mean": math.nan, "loss_std": math.nan, "grad_norm_mean": math.nan, "reward_accuracy": math.nan,
    "reward_margin": math.nan,
    # dpo_sweep/core/stability.py's signals and verdict, and the final weights' held-batch loss.
    "stability": "", "loss_slope": math.nan, "loss_spread": math.nan, "grad_norm_spike": math.nan,
    "logratio_std_max": math.nan, "reward_accuracy_slope": math.nan, "reward_margin_slope": math.nan,
    "rollback_step": None, "eval_loss": math.nan,
    # The held-out split's scores at the learning trial's last eval point (data.eval_pairs).
    "eval_reward_accuracy": math.nan, "eval_reward_margin": math.nan, "eval_rewards_chosen": math.nan,
    "eval_logps_chosen": math.nan, "eval_chosen_drift": math.nan, "eval_pairs": 0,
}



@dataclasses.dataclass(frozen=True)
class FittedStep:
    """A step time extrapolated from a short accumulation, and how precisely it is known."""

    step_ms: float
    #: The step's relative standard error from its steady micro-step's alone: the standard error
    #: of a median, sqrt(pi / 2) x their standard deviation / sqrt(n), times grad_acc, over the
    #: step. The short run's micro-steps are a sample of the data's micro-batches and the real
    #: step adds grad_acc of them. NaN when fewer than two micro-steps were timed.
    rel_error: float


def fitted_step(steps: Sequence[StepRecord], ran_grad_acc: int, grad_acc: int, workers: int = 1) -> FittedStep:
    """The step time at ``grad_acc`` from the measured steps of a trial that ran ``ran_grad_acc``
    micro-steps per step on ``workers`` workers (NaN when no measured step timed its micro-steps)."""
    timed = [s for s in steps if s.measured and not s.worst_case and math.isfinite(s.micro_step_ms) and math.isfinite(s.step_time_ms)]
    if not timed:
        return FittedStep(math.nan, math.nan)
    model = fit_step_time([s.step_time_ms for s in timed], [[s.micro_step_ms] * ran_grad_acc for s in timed])
    step_ms = extrapolate_step_ms(model.t_opt_ms, model.t_micro_ms, grad_acc)
    sample = [t for s in timed for t in s.steady_micro_steps(last_syncs=workers > 1)]
    if len(sample) < 2 or not step_ms > 0:
        return FittedStep(step_ms, math.nan)
    standard_error = math.sqrt(math.pi / 2) * statistics.stdev(sample) / math.sqrt(len(sample))
    return FittedStep(step_ms, grad_acc * standard_error / step_ms)


def fitted_step_ms(steps: Sequence[StepRecord], ran_grad_acc: int, grad_acc: int) -> float:
    """:func:`fitted_step`'s step time."""
    return fitted_step(steps, ran_grad_acc, grad_acc).step_ms


def _time_columns(measured: TrialResult, steps: Sequence[StepRecord], ran_grad_acc: int,
                  grad_acc: int, workers: int, per_micro_step: bool = False) -> dict:
    """``per_micro_step``: a simulated row's communication recurs with every micro-step
    (core/comms.grows_with_micro_steps), else once per step."""
    own = TimeSource.MODELLED if measured.ranks_simulated else TimeSource.MEASURED
    if grad_acc == ran_grad_acc or measured.status != Status.OK:
        return {"step_time_source": own if measured.status == Status.OK else ""}
    fitted = fitted_step(steps, ran_grad_acc, grad_acc, workers)
    if measured.ranks_simulated:  # the steps' times are the rank's compute: the communication at grad_acc added
        comm_ms = measured.comm_ms * (grad_acc / ran_grad_acc if per_micro_step else 1.0)
        fitted = FittedStep(fitted.step_ms + comm_ms, fitted.rel_error)
        return {**_scaled(measured, fitted, grad_acc / ran_grad_acc), "comm_ms": comm_ms,
                "step_time_source": TimeSource.MODELLED}
    return {**_scaled(measured, fitted, grad_acc / ran_grad_acc), "step_time_source": TimeSource.EXTRAPOLATED}


def _scaled(measured: TrialResult, fitted: FittedStep, work: float) -> dict:
    """The time columns at the fitted step time (``work``: tokens and FLOPs per step, relative)."""
    ratio = fitted.step_ms / measured.step_time_ms  # the spread and the rates scale with the step
    widen = 1 + (fitted.rel_error if math.isfinite(fitted.rel_error) else 0.0)  # the extrapolation's own error
    return {"step_time_ms": fitted.step_ms, "step_time_p10_ms": measured.step_time_p10_ms * ratio / widen,
            "step_time_p90_ms": measured.step_time_p90_ms * ratio * widen,
            "tokens_per_s": measured.tokens_per_s * work / ratio, "mfu": measured.mfu * work / ratio,
            "extrapolation_error": fitted.rel_error}


def shared_row(cfg: TrialConfig, measured: TrialResult, steps: Sequence[StepRecord], *, ran_grad_acc: int,
               measured_by: str, predicted_peak_gb: float) -> TrialResult:
    """``cfg``'s row from the measurement ``measured`` (taken at ``ran_grad_acc`` micro-steps per
    step by trial ``measured_by``): its knobs, the measurement's memory, the time at its grad_acc.
    A row measured by another trial carries no start-up or measuring time of its own (it cost none)."""
    own = measured_by == cfg.trial_id
    return dataclasses.replace(
        measured, **config_columns(cfg), loss_type=cfg.train.loss,
        predicted_peak_gb=predicted_peak_gb, measured_by=measured_by, stability_from="",
        **{c: getattr(measured, c) if own else math.nan for c in TIMING_COLUMNS},
        **_time_columns(measured, steps, ran_grad_acc, cfg.grad_acc, cfg.resources.workers_per_trial,
                        comms.grows_with_micro_steps(cfg.resources.parallelism, cfg.resources.sync_every_micro_step)),
    )


@dataclasses.dataclass(frozen=True)
class LearningSource:
    """The trial a set-up's rows take their stability columns from, as it ran."""

    trial_id: str
    result: TrialResult
    steps: int         # its configured optimizer steps (stability_steps)
    precision: str     # stability_precision
    note: str = ""     # stability_note: why it ran in another precision than train.learning_precision

    @classmethod
    def of(cls, cfg: TrialConfig, result: TrialResult, note: str = "") -> "LearningSource":
        return cls(cfg.trial_id, result, cfg.train.steps, cfg.train.precision, note)


def pending_stability(row: TrialResult) -> TrialResult:
    """``row`` as written before its learning trial ends: the stability columns empty, its
    verdict :data:`PENDING`."""
    return dataclasses.replace(row, **{**STABILITY_COLUMNS, "stability": PENDING}, stability_from="")


def with_stability(row: TrialResult, learned: LearningSource | None) -> TrialResult:
    """``row`` with the stability columns of its learning trial ``learned`` (None: there is none,
    e.g. every configuration of the set-up ran out of memory). A learning trial that diverged
    makes the row ``diverged``: the learning, not the memory, is what diverges."""
    if row.status != Status.OK:
        return row
    if learned is None:
        return dataclasses.replace(row, **STABILITY_COLUMNS, stability_from="")
    got = learned.result
    update = {c: getattr(got, c) for c in STABILITY_COLUMNS}
    if got.status == Status.DIVERGED:
        update.update(status=Status.DIVERGED, error=f"diverged in learning trial {learned.trial_id}: {got.error}")
    elif got.status == Status.STOPPED:  # its learning was stopped early: the row is not a choice
        update = {**STABILITY_COLUMNS, **{c: getattr(got, c) for c in (*HELD_OUT_FIELDS, "eval_pairs")},
                  "status": Status.STOPPED, "stopped_step": got.stopped_step,
                  "error": f"learning trial {learned.trial_id} {got.error}"}
    elif got.status != Status.OK:
        update = dict(STABILITY_COLUMNS)
    return dataclasses.replace(row, **update, stability_from=learned.trial_id, stability_steps=learned.steps,
                               stability_precision=learned.precision, stability_note=learned.note)
