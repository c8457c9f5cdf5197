"""One sweep trial: the Ray Tune function trainable that runs the DPO trainer in a warm worker or in
Ray Train workers (the sweep's driver process only starts it: :mod:`~dpo_sweep.sweep.tuner`).

The story of one trial, top to bottom:

1. Tune starts :func:`tune_trainable` with the :class:`~dpo_sweep.sweep.task.TrialTask` the
   planner's Searcher made, which it stamps with the trial's start.
2. A one-worker trial runs in one of the sweep's warm workers (:mod:`dpo_sweep.sweep.warm_worker`:
   long-lived actors that run trial after trial, their memory released in between; they call
   :func:`~dpo_sweep.sweep.trial_run.run_and_report` as a Train worker does and their reports
   reach Tune the same way). Otherwise it builds a Ray Train ``TorchTrainer`` (``num_workers =
   resources.workers_per_trial``, fractional CPUs per worker, one GPU per worker when GPUs are
   used) and calls ``fit()``. Train V2 is the default in Ray 2.60 and passing a trainer to
   ``tune.Tuner`` is deprecated, hence the function trainable around ``fit()``. Its
   ``torch_config`` is :class:`~dpo_sweep.sweep.torch_backend.LazyTorchConfig` (the trial's Train
   controller process then never imports torch), and Tune reuses the trial process from one trial
   to the next (``reuse_actors``): only the training workers, the processes that touch the GPU,
   are new for every trial.
3. Every worker runs :func:`train_loop_per_worker` on the task: ``run_and_report`` of
   :mod:`~dpo_sweep.sweep.trial_run`. Each optimizer step is reported with ``ray.train.report``
   (all ranks report, as Train requires; Tune sees rank 0's metrics through
   ``TuneReportCallback``). After the last step rank 0 reports the summary row (and its machine);
   the step rows travel once, in the per-step reports.
4. ``fit()`` raising is a result, not a crash: a ``WorkerGroupError`` whose worker failure is a
   ``torch.OutOfMemoryError`` becomes status ``oom`` with the failed allocation's message, anything
   else ``error`` with the message. The trainable's own last report carries this ending, with
   the peak memory up to the failure that the failed workers' exceptions carry (the trainer's
   memory sampler attaches it; Ray pickles it along with the exception).
5. In the sweep's driver process :class:`~dpo_sweep.sweep.collector.TrialCollector` (fed by the
   recorder, the sweep's Tune callback) turns the stream of reports of one trial into one
   ``TrialResult`` and its ``StepRecord`` rows; when Tune ends the trial the planner's Searcher
   hands them to the plan (:mod:`~dpo_sweep.sweep.planner`), and the recorder appends the rows
   the plan then has ready to the results files.

The trial's ``TrialConfig`` travels validated, in the task (validated once, when the space was
loaded). The reports are the typed messages of :mod:`~dpo_sweep.sweep.protocol`. This module imports
:mod:`~dpo_sweep.sweep.warm_worker`, never the other way round: a warm worker must not import
Ray Train.
"""
from __future__ import annotations

import time
from typing import Any

from dpo_sweep.config import TrialConfig
from dpo_sweep.core import trial_facts
from dpo_sweep.sweep import warm_worker
from dpo_sweep.sweep.protocol import TrialEnding, TrialFailure
from dpo_sweep.sweep.task import TrialTask, task_of
from dpo_sweep.sweep.trial_run import output_to_file, run_and_report, worker_log_path

#: CPUs the Tune trial process itself holds: it only waits on ``fit()``. Kept small so that on a
#: machine of few cores the trial and its workers (0.5 CPU each by default) fit together.
TRIAL_CPUS = 0.1


# --- Ray Train workers ------------------------------------------------------------------------


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """Runs inside every Ray Train worker (``config``: the task's :meth:`~TrialTask.as_config`):
    everything it prints goes to the trial's log file (:func:`worker_log_path`; the driver's
    console gets one line per trial from the reports)."""
    import ray.train

    task = task_of(config)
    if not task.log_dir:
        _train_loop(task)
        return
    rank = ray.train.get_context().get_world_rank()
    with output_to_file(worker_log_path(task.log_dir, task.trial_id, rank)):
        _train_loop(task)


def _train_loop(task: TrialTask) -> None:
    """Build, step, measure, report (the trainer does the first three; this function only wires
    its per-step callback to ``ray.train.report``)."""
    import ray.train

    entered = time.time()
    _quiet_train_reports()
    run_trial = task.run_trial()
    run_and_report(task, run_trial, ray_end=entered, import_end=time.time(), report=ray.train.report,
                   rank=ray.train.get_context().get_world_rank())


def _quiet_train_reports() -> None:
    """Ray Train logs every ``report`` call with its whole metrics dict at INFO: one multi-line
    record per step per worker in the sweep's console. The trainer's own step line says it better."""
    import logging

    try:
        from ray.train.v2._internal.execution import context as train_context  # private module
    except ImportError:
        return
    logging.getLogger(train_context.__file__).setLevel(logging.WARNING)


# --- Tune trainable ---------------------------------------------------------------------------


def scaling_config(cfg: TrialConfig, use_gpu: bool) -> Any:
    from ray.train import ScalingConfig

    per_worker: dict[str, float] = {"CPU": cfg.resources.cpus_per_worker}
    if use_gpu:
        per_worker["GPU"] = 1  # one GPU per worker: DDP/FSDP ranks never share a device
    return ScalingConfig(num_workers=trial_facts.processes(cfg), use_gpu=use_gpu,
                         resources_per_worker=per_worker)


def tune_trainable(config: dict[str, Any]) -> None:
    """The Tune function trainable for one trial (see the module doc); ``config``: its
    :class:`~dpo_sweep.sweep.task.TrialTask`'s :meth:`~dpo_sweep.sweep.task.TrialTask.as_config`."""
    from ray import tune

    task = task_of(config).started(at=time.time())
    if task.warm_pool and warm_worker.wanted(task.cfg):
        failure = warm_worker.run_in_warm_worker(task)
    else:
        failure = _fit_in_train_workers(task)
    tune.report(TrialEnding(failure, wall_s=time.time() - task.trial_start).to_report())


def _fit_in_train_workers(task: TrialTask) -> TrialFailure | None:
    """The trial in fresh Ray Train workers (``TorchTrainer.fit()``), its reports forwarded to Tune
    (:mod:`~dpo_sweep.sweep.train_relay`); how it failed, None when it did not. The Train run is
    named after the trial."""
    from ray import tune
    from ray.train import FailureConfig, RunConfig
    from ray.train.torch import TorchTrainer

    from dpo_sweep.sweep.torch_backend import LazyTorchConfig
    from dpo_sweep.sweep.train_relay import fit_and_forward

    name = f"train-{task.trial_id}-{int(task.trial_start)}"

    def fit(callback: Any) -> None:
        TorchTrainer(
            train_loop_per_worker,
            train_loop_config=task.as_config(),
            # Ray's TorchConfig would make every trial's fresh controller process import torch first.
            torch_config=LazyTorchConfig(),
            scaling_config=scaling_config(task.cfg, task.use_gpu),
            run_config=RunConfig(
                name=name,
                storage_path=task.storage_path,
                # An OOM or a crash is this trial's result: never retry it.
                failure_config=FailureConfig(max_failures=0),
                callbacks=[callback],
            ),
        ).fit()

    try:
        fit_and_forward(fit, f"reports-{name}", tune.report)
    except Exception as exc:  # noqa: BLE001 - every failure becomes this trial's status
        return TrialFailure.from_exception(exc)
    return None
