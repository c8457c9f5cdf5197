"""What a Tune trial is asked to run: :class:`TrialTask`, the one message that crosses Ray from the
sweep's driver to the Tune trial (the planner's Searcher makes it) and on to the processes that
train (a warm worker, or every Ray Train worker). Everything a trial's run needs besides its
configuration travels here, typed, and nowhere else. No torch here: the driver imports this module.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

from dpo_sweep.config import TrialConfig
from dpo_sweep.train.faults import InjectedFault

#: The keys of the dicts Ray passes on (Tune's trial config, Ray Train's ``train_loop_config``):
#: the task (:func:`task_of`), and its trial id beside it (:func:`trial_id_of`), which Tune's
#: experiment state then shows as plain JSON (benchmarks/sweep_overhead.py reads it there).
TASK_KEY = "task"
TRIAL_ID_KEY = "trial_id"
#: The trainer's signature: ``run_trial(cfg, *, on_step, log, catch_failures, clock, warm, fault)``
#: -> its :class:`~dpo_sweep.train.loop.TrialOutcome`.
Trainer = Callable[..., Any]


@dataclass(frozen=True)
class TrialTask:
    """One Tune trial's run: the validated configuration and where and how it runs."""

    cfg: TrialConfig
    """The trial's configuration, validated once, when the space was loaded."""
    use_gpu: bool = False
    """One GPU per worker (the sweep's ``resources.use_gpu`` against the cluster)."""
    storage_path: str = ""
    """Where Ray Train keeps a Train run's files (``DIR/ray``)."""
    log_dir: str | None = None
    """``DIR/logs``: the workers' output; None: their output stays on the console."""
    warm_pool: str | None = None
    """The name of the sweep's pool of warm workers; None: fresh Ray Train workers."""
    trainer: Trainer | None = None
    """A stand-in for the trainer (tests: a module-level function, which Ray pickles by
    reference); None: :func:`dpo_sweep.train.loop.run_trial`."""
    fault: InjectedFault | None = None
    """A fault to inject (tests only: :mod:`~dpo_sweep.train.faults`)."""
    trial_start: float = 0.0
    """When the Tune trial started (wall clock; :meth:`started`): the trial's start-up counts from here."""

    @property
    def trial_id(self) -> str:
        return self.cfg.trial_id

    def as_config(self) -> dict[str, Any]:
        """The dict Ray passes on (see :data:`TASK_KEY`)."""
        return {TASK_KEY: self, TRIAL_ID_KEY: self.trial_id}

    def for_trial(self, cfg: TrialConfig, fault: InjectedFault | None = None) -> TrialTask:
        """This task's settings for the trial of ``cfg`` (the Searcher's: one task per Tune trial)."""
        return dataclasses.replace(self, cfg=cfg, fault=fault)

    def started(self, at: float) -> TrialTask:
        """This task as the Tune trial that runs it, started at ``at``, hands it on."""
        return dataclasses.replace(self, trial_start=at)

    def run_trial(self) -> Trainer:
        """The trainer this task runs (:func:`resolve_trainer`)."""
        return resolve_trainer(self.trainer)


def task_of(config: dict[str, Any]) -> TrialTask:
    """The task in a dict Ray passed on (see :data:`TASK_KEY`)."""
    return config[TASK_KEY]


def trial_id_of(config: dict[str, Any]) -> str:
    """The trial id in a dict Ray passed on (a Tune trial's ``config``)."""
    return config[TRIAL_ID_KEY]


def resolve_trainer(trainer: Trainer | None) -> Trainer:
    """``trainer``, or the real one when None. Imports it (torch, transformers): call it only in a
    process that trains."""
    if trainer is not None:
        return trainer
    from dpo_sweep.train.loop import run_trial

    return run_trial
