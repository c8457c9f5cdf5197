"""Warm trial workers: a one-worker trial runs in a long-lived Ray actor instead of a fresh process.

A fresh Ray Train worker per trial pays, every trial, for a Train controller, a worker process,
``import torch`` and transformers and a CUDA context: on the H200 ~23 s before the first optimizer
step of a trial whose steps take 4 s (issue 14). Here the Tune trial process - which Tune keeps
from one trial to the next (``reuse_actors``) - owns one :class:`TrialWorker` actor holding the
trial's GPU (or its CPUs); the actor imports the trainer once, when it is created, and runs trial
after trial:

1. :func:`run_in_warm_worker` (in the Tune trial process) hands it the validated
   ``TrialConfig``; the actor runs :func:`~dpo_sweep.sweep.driver.run_and_report` in a thread and
   streams each report back (a Ray streaming generator), which the trial process forwards with
   ``tune.report`` - the same keys, in the same order, as a Ray Train worker's.
2. A failure is classified inside the actor, as :func:`~dpo_sweep.sweep.driver.tune_trainable`
   classifies a Train worker's (``oom`` / ``error``, the peak up to the failure), and only its
   text leaves: the exception and its traceback, which hold the failed step's tensors, are
   dropped in the actor before the memory is released.
3. After every trial :func:`~dpo_sweep.train.setup.release_after_trial` leaves the process as a
   fresh one would start the next: liger's patches undone, garbage collected, CUDA's cached
   blocks given back and its peak counters reset (CPU: malloc trimmed). The trainer itself sets
   every per-trial setting (seed, allocator cap) at the start of each trial. Peaks stay honest:
   tests/gpu and tests/sweep compare a warm worker's trial, after a bigger one, with a fresh
   process's.
4. After an ``error`` (not an OOM: that is a normal result and the allocator recovers) the actor
   is replaced: a CUDA error can leave the context unusable. If the actor dies, the trial is an
   ``error`` naming that, and the next trial gets a new one.

Multi-worker trials (DDP, FSDP) always run in fresh Ray Train workers: a process group per trial.
"""
from __future__ import annotations

import queue
import threading
import time
from typing import Any, Iterator

import ray

from dpo_sweep.config import TrialConfig
from dpo_sweep.sweep import driver

#: End-of-stream items from the actor (besides the reports: dicts with driver's keys).
_FAILURE = "warm/failure"  # {"status", "error", "peak_mem_gb"}: how the trial failed
_REPLACE = "warm/replace"  # True: the actor should not run another trial (after an error)


def wanted(cfg: TrialConfig) -> bool:
    """Whether ``cfg`` runs in a warm worker (one worker per trial and not switched off)."""
    return cfg.resources.workers_per_trial == 1 and cfg.resources.warm_workers


class TrialWorker:
    """The long-lived process of one trial slot (see the module doc). Made a Ray actor by
    :func:`_start_worker`; a plain object in tests."""

    def __init__(self, trainer: str = driver.DEFAULT_TRAINER):
        started = time.time()
        driver._quiet_train_reports()
        self._run_trial = driver.import_trainer(trainer)
        from dpo_sweep.train import setup  # the trainer's own modules: imported with it

        self._release = setup.release_after_trial
        #: When the import ran: the part that overlaps the first trial is that trial's ``import``
        #: phase (the trial that started this worker waited for it; later trials do not).
        self._import_window: tuple[float, float] | None = (started, time.time())
        self.trials_run = 0

    def ping(self) -> int:
        return self.trials_run

    def run(self, loop_config: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """Run one trial, yielding its reports as they happen, then at most one failure item."""
        entered = time.time()
        trial_start = float(loop_config["trial_start"])
        began, ready = self._import_window or (entered, entered)
        self._import_window = None
        ray_end = min(max(began, trial_start), entered)
        import_end = min(max(ready, ray_end), entered)
        reports: queue.Queue = queue.Queue()
        ended = object()
        failure: dict[str, Any] = {}

        def work() -> None:
            try:
                driver.run_and_report(loop_config, self._run_trial, ray_end=ray_end,
                                      import_end=import_end, report=reports.put, rank=0)
            except BaseException as exc:  # noqa: BLE001 - every failure becomes this trial's status
                status, message = driver.classify_failure(exc)
                # Worded as a Ray Train worker's failure is: one worker, rank 0.
                failure["status"], failure["error"] = status, driver._short(f"rank 0: {message}")
                failure["peak_mem_gb"] = driver.failure_peak(exc)
                del exc  # the traceback holds the failed step's frames and tensors
            finally:
                reports.put(ended)

        log_dir = loop_config.get("log_dir")
        cfg: TrialConfig = loop_config["trial"]
        logs = driver.output_to_file(driver.worker_log_path(log_dir, cfg.trial_id, 0)) if log_dir else None
        if logs is not None:
            logs.__enter__()
        try:
            thread = threading.Thread(target=work, name=f"trial-{cfg.trial_id}", daemon=True)
            thread.start()
            while (item := reports.get()) is not ended:
                yield item
            thread.join()
        finally:
            self.trials_run += 1
            self._release(_device_of(cfg))
            if logs is not None:
                logs.__exit__(None, None, None)
        if failure:
            yield {_FAILURE: failure, _REPLACE: failure["status"] != "oom"}


def _device_of(cfg: TrialConfig) -> Any:
    import torch

    from dpo_sweep.train.loop import resolve_device

    try:
        return resolve_device(cfg)
    except Exception:  # noqa: BLE001 - nothing to release on a device that is not there
        return torch.device("cpu")


# --- The Tune trial process's side -------------------------------------------------------------

#: This Tune trial process's worker and what it was started for (Tune reuses the process from one
#: trial to the next; the actor lives as long as it does, Ray ends it with its owner).
_worker: tuple[tuple[Any, ...], Any] | None = None


def _start_worker(cfg: TrialConfig, use_gpu: bool, trainer: str) -> Any:
    global _worker
    key = (trainer, use_gpu, cfg.resources.cpus_per_worker)
    if _worker is not None and _worker[0] == key:
        return _worker[1]
    _stop_worker()
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    actor = ray.remote(TrialWorker).options(
        num_cpus=cfg.resources.cpus_per_worker, num_gpus=1 if use_gpu else 0,
        # Not inside the Tune trial's own placement group (0.1 CPU): the worker asks for its own.
        scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=None),
        max_restarts=0,
    ).remote(trainer)
    _worker = (key, actor)
    return actor


def _stop_worker() -> None:
    global _worker
    if _worker is not None:
        ray.kill(_worker[1], no_restart=True)
    _worker = None


def run_in_warm_worker(loop_config: dict[str, Any], use_gpu: bool) -> dict[str, Any]:
    """Run the trial of ``loop_config`` in this Tune trial process's warm worker, forwarding its
    reports to Tune; returns the trial's summary (``status``, ``error``, maybe ``peak_mem_gb``)
    as :func:`~dpo_sweep.sweep.driver.tune_trainable` reports it."""
    from ray import tune

    cfg: TrialConfig = loop_config["trial"]
    actor = _start_worker(cfg, use_gpu, loop_config.get("trainer", driver.DEFAULT_TRAINER))
    summary: dict[str, Any] = {"status": "finished", "error": ""}
    try:
        for ref in actor.run.remote(loop_config):
            item = ray.get(ref)
            if _FAILURE in item:
                summary.update(status=item[_FAILURE]["status"], error=item[_FAILURE]["error"],
                               peak_mem_gb=item[_FAILURE]["peak_mem_gb"])
                if item[_REPLACE]:
                    _stop_worker()
            else:
                tune.report(item)
    except ray.exceptions.RayActorError as exc:
        summary.update(status="error", error=driver._short(f"the trial's worker process died: {exc}"))
        _stop_worker()
    return summary

