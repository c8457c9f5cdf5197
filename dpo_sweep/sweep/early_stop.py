"""Early stopping of learning trials on their held-out metric: Ray Tune's ``ASHAScheduler``
(``search.scheduler``, :class:`~dpo_sweep.config.SchedulerSpec`), as the sweep's Tune scheduler.

Only a learning trial's eval points carry the metric and the rung's clock
(:data:`~dpo_sweep.sweep.protocol.EVAL_STEP_KEY`, :func:`~dpo_sweep.sweep.protocol.metric_key`):
Ray's ASHA passes over every other report (a measurement's steps, a step between eval points),
so the rungs compare held-out scores at the same optimizer step. :class:`EarlyStop` keeps which
trial it stopped and at which step, which the recorder turns into that trial's ``stopped`` outcome
(the trial reported no end of its own: Tune ended it).
"""
from __future__ import annotations

from typing import Any

from ray.tune.schedulers import ASHAScheduler, TrialScheduler

from dpo_sweep.config import SchedulerSpec
from dpo_sweep.sweep.protocol import EVAL_STEP_KEY, metric_key


class EarlyStop(ASHAScheduler):
    """Ray Tune's ASHA over the learning trials' eval points; ``stopped``: Tune's trial id -> the
    step it was stopped at."""

    def __init__(self, spec: SchedulerSpec, max_steps: int) -> None:
        # A trial that reaches its last step finished: it is not stopped there (stop_last_trials off).
        super().__init__(time_attr=EVAL_STEP_KEY, metric=metric_key(spec.metric), mode=spec.resolved_mode(),
                         max_t=max(max_steps, spec.grace_period), grace_period=spec.grace_period,
                         reduction_factor=spec.reduction_factor, brackets=spec.brackets, stop_last_trials=False)
        self.spec = spec
        self.stopped: dict[str, int] = {}

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict) -> str:
        decision = super().on_trial_result(tune_controller, trial, result)
        if decision == TrialScheduler.STOP and EVAL_STEP_KEY in result:
            self.stopped[trial.trial_id] = int(result[EVAL_STEP_KEY])
        return decision

    def stopped_at(self, tune_id: str) -> int | None:
        """The step the trial ``tune_id`` was stopped at, or None when it was not stopped."""
        return self.stopped.get(tune_id)

    def rule(self, step: int) -> str:
        """Why a trial stopped at ``step``: the rule that stopped it, for its row's ``error``."""
        s = self.spec
        return (f"its {metric_key(s.metric)} there was below the best 1/{s.reduction_factor:g} of the trials "
                f"that reached step {step} before it (search.scheduler: asha)")

    def describe(self) -> str:
        s = self.spec
        return (f"early stopping: Ray Tune's ASHAScheduler on {metric_key(s.metric)} ({s.resolved_mode()}), "
                f"grace_period {s.grace_period} steps, reduction_factor {s.reduction_factor:g}")


def early_stop(spec: SchedulerSpec | None, max_steps: int) -> EarlyStop | None:
    """The sweep's scheduler for ``search.scheduler`` (None: Tune's FIFO, no early stop);
    ``max_steps``: the longest learning trial's steps."""
    return EarlyStop(spec, max_steps) if spec is not None else None
