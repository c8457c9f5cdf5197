"""One trial's run in the process that trains it: a Ray Train worker
(:func:`~dpo_sweep.sweep.trainable.train_loop_per_worker`) or a warm worker
(:class:`~dpo_sweep.sweep.warm_worker.TrialWorker`) alike.

:func:`run_and_report` runs the task's trainer (:class:`~dpo_sweep.sweep.task.TrialTask`:
``run_trial(cfg, on_step=..., catch_failures=False)``) and sends each optimizer step's :class:`~dpo_sweep.sweep.protocol.StepReport`, then rank 0's
:class:`~dpo_sweep.sweep.protocol.OutcomeReport` (the summary row and its machine), through the
``report`` it is given: Ray Train's ``report`` in a Train worker, the actor's stream in a warm
worker. A failure propagates; the caller classifies it (:class:`~dpo_sweep.sweep.protocol.TrialFailure`).
Everything the trial prints goes to its log file (:func:`output_to_file`, :func:`worker_log_path`).

``startup_s`` / ``measure_s`` have one definition, :class:`~dpo_sweep.telemetry.timing.TrialClock`:
the worker starts it at the Tune trial's start and the trainer marks its steps on it.
"""
from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from dpo_sweep.records import StepRecord
from dpo_sweep.results_dir import ResultsDir
from dpo_sweep.sweep.protocol import OutcomeReport, StepReport
from dpo_sweep.sweep.task import TrialTask


def startup_line(trial_id: str, ray_s: float, import_s: float) -> str:
    """Rank 0's console line on where its trial's start-up went (benchmarks/sweep_overhead.py
    reads it)."""
    return (f"[{trial_id}] worker loop started {ray_s:.1f} s after the trial, trainer imported "
            f"in {import_s:.1f} s")


def worker_log_path(log_dir: str, trial_id: str, rank: int) -> Path:
    """``DIR/logs/<trial_id>.log`` for rank 0, ``<trial_id>.rank<N>.log`` for the others."""
    return Path(log_dir) / ResultsDir.log_name(trial_id, rank)


@contextmanager
def output_to_file(path: Path) -> Iterator[None]:
    """This process's stdout and stderr - file descriptors 1 and 2, so C++ (c10d) and CUDA
    messages too, not only Python's - appended to ``path`` within the block. A worker process
    runs one trial, but its descriptors are given back anyway: Ray writes its own markers there."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with path.open("ab", buffering=0) as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, copy in zip((1, 2), saved):
                os.dup2(copy, fd)
                os.close(copy)


def run_and_report(task: TrialTask, run_trial: Callable[..., Any], *, ray_end: float,
                   import_end: float, report: Callable[[dict[str, Any]], None], rank: int,
                   warm: Any = None) -> None:
    """Run the trial and send each step's row, then the outcome, through ``report`` (Ray Train's in
    a Train worker, a queue in a warm worker). ``ray_end`` / ``import_end``: when Ray had this
    process running the trial and when the trainer was imported (wall clock; start-up split).
    ``warm``: the warm worker's :class:`~dpo_sweep.train.warm_state.WarmState` (None in a Train
    worker: its process runs one trial). ``run_trial``: the task's trainer, imported by the caller
    (:meth:`~dpo_sweep.sweep.task.TrialTask.run_trial`: its import is a phase of the start-up)."""
    from dpo_sweep.telemetry.timing import TrialClock  # imports torch (the trainer just did): workers only

    cfg = task.cfg
    # Start-up counts from the Tune trial's start: Ray's worker start-up is part of it.
    clock = TrialClock(started_at=task.trial_start)
    clock.mark("ray", at=ray_end)
    clock.mark("import", at=import_end)
    if rank == 0:
        # Where a trial's start-up goes: Ray (trial, controller, worker processes) until here,
        # then importing the trainer, then the trainer's own data and model build (it logs those).
        print(startup_line(cfg.trial_id, ray_end - clock.started_at, import_end - ray_end), flush=True)

    def on_step(record: StepRecord) -> None:
        report(StepReport(record, clock.startup_s(), clock.measure_s()).to_report())

    outcome = run_trial(cfg, on_step=on_step, log=print if rank == 0 else None,
                        catch_failures=False, clock=clock, warm=warm, fault=task.fault)
    environment = _worker_environment() if rank == 0 else None
    report(OutcomeReport(outcome.result, environment).to_report())


def _worker_environment() -> dict[str, Any] | None:
    """environment.json's content as seen by a training worker: its GPU, driver and CUDA (the
    sweep's driver process may run on a CPU-only head node)."""
    try:
        from dpo_sweep.telemetry import environment_info
    except ImportError:
        return None
    return environment_info()
