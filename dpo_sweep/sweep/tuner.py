"""The sweep itself: the trials not yet in results.csv, run with ``tune.Tuner`` on the connected
Ray cluster. The planner's Searcher (:mod:`dpo_sweep.sweep.planner`) decides which Tune trials
run (fewer than the configurations: shared measurements, pruning; ``full_grid``: one per
configuration); see :mod:`dpo_sweep.sweep.trainable` for one trial."""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ray import tune

from dpo_sweep import space as space_mod
from dpo_sweep.config import ModelSpec, TrialConfig, scheduler_of
from dpo_sweep.plan.shape import ModelShape
from dpo_sweep.plan.schedule import SweepPlan
from dpo_sweep.core.lengths import LengthProfile
from dpo_sweep.sweep import warm_worker
from dpo_sweep.sweep.task import Trainer, TrialTask, trial_id_of
from dpo_sweep.sweep.trainable import TRIAL_CPUS, tune_trainable
from dpo_sweep.train.faults import fault_rules
from dpo_sweep.sweep.console import say
from dpo_sweep.files import unwritable
from dpo_sweep.results_dir import ResultsDir
from dpo_sweep.sweep.output_dir import drop_rows, pending_rows
from dpo_sweep.sweep.ray_cluster import InfrastructureError
from dpo_sweep.sweep.recorder import SweepRecorder
from dpo_sweep.sweep.slots import TrialSlots, start_warm_workers
from dpo_sweep.sweep.planner import PlanSearcher, card_memory_gb
from dpo_sweep.sweep.early_stop import EarlyStop, early_stop
from dpo_sweep.sweep.stopping import (DEFAULT_TRIAL_TIMEOUT_FLOOR_S, SameFailureStop, StopRequest, SweepStopper,
                                      quiet_tune_once_stopping, stop_on_sigint)

#: Tune settings of the sweep's driver process (a user's own environment variables win):
#: - our SIGINT handling (stopping.py) instead of Tune's;
#: - Tune's console output off: the old reporter at verbose 0 prints nothing, where the new one
#:   printed its experiment table and result path whatever the verbosity;
#: - no TensorBoard/CSV/JSON result loggers (and so no TensorBoard hint): results.csv is ours;
#: - no check that every report carries the scheduler's metric.
TUNE_DRIVER_ENV = {
    "TUNE_DISABLE_SIGINT_HANDLER": "1",
    "RAY_AIR_NEW_OUTPUT": "0",
    "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1",
    # search.scheduler's metric is in a learning trial's eval-point reports only, not in every one.
    "TUNE_DISABLE_STRICT_METRIC_CHECKING": "1",
}
#: Without those loggers there is no result.json for fit()'s ResultGrid, which it warns about for
#: every trial; the sweep reads its results from its own callback, never from the ResultGrid.
RESULT_GRID_LOGGER = "ray.tune.analysis.experiment_analysis"


@dataclass
class SweepSummary:
    out_dir: Path
    ran: int  # trials that finished in this run (their rows are in results.csv)
    skipped: int
    crashed: list[str] = field(default_factory=list)
    timed_out: list[str] = field(default_factory=list)  # trials ended past their time limit (rows: timeout)
    stopped: str | None = None  # why the sweep ended early: stopping.INTERRUPTED or a failure's cause
    not_run: list[str] = field(default_factory=list)  # trials without a row (stopped early)
    finished: int = 0  # trials with a row, earlier runs' included
    ray_trials: int = 0  # Tune trials started for the ``ran`` configurations (the planner's saving)
    signum: int = 0  # the stop signal of an interrupted sweep
    write_error: str | None = None  # why a results file could not be written (the sweep stopped)


def _trial_dirname(trial: Any) -> str:
    return trial_id_of(trial.config)


def tune_config(max_concurrent: int, search_alg: PlanSearcher | None = None, num_samples: int = 1,
                scheduler: EarlyStop | None = None) -> tune.TuneConfig:
    """``num_samples``: at most this many Tune trials (the plan ends the sweep earlier);
    ``scheduler``: search.scheduler's early stop (None: Tune's FIFO)."""
    return tune.TuneConfig(
        search_alg=search_alg,
        scheduler=scheduler,
        num_samples=num_samples,
        max_concurrent_trials=max_concurrent,
        # The trial process only waits on fit() and never touches a GPU: keeping it saves a
        # process start and its imports per trial (the Train workers are still new every trial).
        reuse_actors=True,
        trial_dirname_creator=_trial_dirname,
    )


def run_sweep(sp: space_mod.Space, out_dir: Path, *, trials: Sequence[TrialConfig], slots: TrialSlots,
              done_ids: set[str], trainer: Trainer | None = None,
              out: Callable[[str], None] = say, full_grid: bool = False,
              lengths: Mapping[str, LengthProfile | None] | None = None,
              shapes: Mapping[ModelSpec, ModelShape] | None = None,
              pool: warm_worker.WarmPool | None = None,
              trial_timeout_floor_s: float = DEFAULT_TRIAL_TIMEOUT_FLOOR_S,
              on_rows: Callable[[], None] | None = None) -> SweepSummary:
    """Run the space's trials that are not in ``done_ids`` on the connected Ray cluster;
    ``trials``: the space's trials as they run (:func:`~dpo_sweep.sweep.slots.absolute_paths`),
    ``slots``: where and how many at a time (:func:`~dpo_sweep.sweep.slots.trial_slots`);
    ``trainer``: a stand-in for the trainer (tests), None: the real one; ``lengths`` / ``shapes``:
    each trial's data lengths and each model's shape as preflight measured and built them (the
    plan's memory model);
    ``pool``: warm workers the caller started (:func:`start_warm_workers`) and closes.
    ``on_rows``: called after each write of rows (``dpo-sweep run``'s live report; it must not raise)."""

    faults = fault_rules()  # tests only (train/faults.py); a bad value is said before anything starts
    todo = [t for t in trials if t.trial_id not in done_ids]
    total = len(trials)
    if done_ids:
        out(f"resume: {total - len(todo)} of {total} trial(s) already in {ResultsDir(out_dir).results}")
    if not todo:
        return SweepSummary(out_dir, ran=0, skipped=total, finished=total)
    use_gpu, concurrent, workers = slots.use_gpu, slots.concurrent, slots.workers
    out(f"{len(todo)} configuration(s) to run{' (--full-grid: each in full)' if full_grid else ''}, "
        f"{concurrent} trial(s) at a time, {workers} worker(s) each on "
        f"{'GPU' if use_gpu else 'CPU'}; results go to {out_dir}/")

    storage = str((out_dir / "ray").resolve())
    stop = StopRequest()
    pending = pending_rows(out_dir)  # a resumed sweep's rows that wait for their learning trial
    plan = SweepPlan(todo, budget_gb=card_memory_gb() if use_gpu else None, full_grid=full_grid, lengths=lengths,
                     shapes=shapes, measured=pending)
    if pending:
        kept = plan.restored()
        drop_rows(out_dir, {r.trial_id for r in pending} - kept)  # their groups are measured again
        out(f"resume: {len(kept)} row(s) already measured wait only for their learning trial")
    out(plan.summary_line())
    recorder = SweepRecorder(out_dir, plan, total, total - len(todo), stop=stop, concurrent=concurrent,
                             timeout_floor_s=trial_timeout_floor_s, on_rows=on_rows)
    for key, value in TUNE_DRIVER_ENV.items():
        os.environ.setdefault(key, value)
    logging.getLogger(RESULT_GRID_LOGGER).setLevel(logging.ERROR)
    # Warm workers start now, unless the caller started them already (``dpo-sweep run`` does, while
    # its preflight runs): their process start and imports overlap Tune's own start.
    own_pool = pool is None
    pool = pool or start_warm_workers(todo, slots, trainer)
    recorder.pool_name = pool.name if pool is not None else None
    # What every trial's task shares; the planner's Searcher puts in each trial's configuration.
    task = TrialTask(todo[0], use_gpu=use_gpu, storage_path=storage, log_dir=str(ResultsDir(out_dir).logs.resolve()),
                     warm_pool=pool.name if pool is not None else None, trainer=trainer)
    # Once the plan knows a trial's outcome: the ETA prices it, and the same-failure early stop.
    recorder.early_stop = early_stop(scheduler_of(sp.spec.search), max(t.train.learning_steps_resolved() for t in todo))
    if recorder.early_stop is not None:
        out(recorder.early_stop.describe())
    searcher = PlanSearcher(plan, recorder, task, faults,
                            end_hooks=(recorder.pricing.trial_ended, SameFailureStop(stop, total).trial_ended))
    try:
        tuner = tune.Tuner(
            tune.with_resources(tune_trainable, {"CPU": TRIAL_CPUS}),
            # A measure trial per configuration at most, and a learning trial per configuration.
            tune_config=tune_config(concurrent, searcher, num_samples=2 * len(todo), scheduler=recorder.early_stop),
            run_config=tune.RunConfig(
                name=time.strftime(f"{sp.name}-%Y%m%d-%H%M%S"),
                storage_path=storage,
                callbacks=[recorder],
                stop=SweepStopper(stop),
                failure_config=tune.FailureConfig(max_failures=0),
                verbose=0,
            ),
        )
        with stop_on_sigint(stop), quiet_tune_once_stopping(stop):
            tuner.fit()
    except Exception as err:  # noqa: BLE001
        if problem := unwritable(out_dir):  # what Tune met is the disk: say that, not its symptom
            stop.write_error = stop.reason = problem
        else:
            raise InfrastructureError(f"Ray Tune failed: {type(err).__name__}: {err}") from err
    finally:
        if own_pool and pool is not None:
            pool.close()  # their GPUs are free again (a caller's pool: the caller closes it)
    missing = plan.unfinished()
    ran = len(todo) - len(missing)
    if stop.reason is not None:
        return SweepSummary(out_dir, ran=ran, skipped=total - len(todo), crashed=recorder.crashed,
                            stopped=stop.reason, not_run=missing, finished=recorder.finished,
                            ray_trials=len(recorder.ended), signum=stop.signum, write_error=stop.write_error)
    if missing:
        raise InfrastructureError(
            f"Tune ended without a result for {len(missing)} trial(s) ({', '.join(missing[:5])}"
            f"{', ...' if len(missing) > 5 else ''}); if the sweep was interrupted, run the same "
            "command with --resume to run only those")
    return SweepSummary(out_dir, ran=ran, skipped=total - len(todo), crashed=recorder.crashed,
                        timed_out=recorder.timeouts, finished=recorder.finished, ray_trials=len(recorder.ended))
