"""Warm trial workers: a one-worker trial runs in a long-lived Ray actor instead of a fresh process.

A fresh Ray Train worker per trial pays, every trial, for a Train controller, a worker process,
``import torch`` and transformers and a CUDA context, often longer than the trial's own steps
(benchmarks/README.md#start-up-and-shutdown). Here a trial runs in one of the sweep's
:class:`TrialWorker` actors, each holding one trial's GPU (or its CPUs); a worker imports the
trainer once, when it is created, and runs trial after trial:

0. The sweep's driver starts its workers and a :class:`WorkerPool` that hands them out
   (:func:`start_pool`) as soon as Ray is up, before Tune: the workers import while the preflight
   ends and Tune starts, and they outlive any one Tune trial process. A worker leaves out what
   no trial uses (:func:`~dpo_sweep.sweep.worker_setup.unused_packages_hidden`), and keeps what
   its imports made out of the garbage collector's walks (``gc.freeze``). Then it tokenises the
   sweep's data in a thread (``WarmState.prefetch``): the first trial finds it made.
1. :func:`run_in_warm_worker` (in the Tune trial process) takes a free one and hands it the trial's
   :class:`~dpo_sweep.sweep.task.TrialTask`; the actor runs
   :func:`~dpo_sweep.sweep.trial_run.run_and_report` in a thread and streams each report back (a
   Ray streaming generator), which the trial process forwards with ``tune.report`` - the same
   keys, in the same order, as a Ray Train worker's.
2. A failure is classified inside the actor, as :func:`~dpo_sweep.sweep.trainable.tune_trainable`
   classifies a Train worker's (``oom`` / ``error``, the peak up to the failure), and only its
   text leaves: the exception and its traceback, which hold the failed step's tensors, are
   dropped in the actor before the memory is released.
3. After every trial its :class:`~dpo_sweep.train.warm_state.WarmState` leaves the process as a
   fresh one would start the next: liger's patches undone, garbage collected, CUDA's cached
   blocks given back and its peak counters reset (CPU: malloc trimmed). The trainer itself sets
   every per-trial setting (seed, allocator cap) at the start of each trial; what the worker
   keeps, in that same object, is the last data set's tokenised pairs and their precomputed
   reference log-probs, which the next trial of the sweep would make again the same. Peaks stay
   honest: tests/gpu and tests/sweep compare a warm worker's trial, after a bigger one, with a
   fresh process's.
4. After an ``error`` (not an OOM: that is a normal result and the allocator recovers) the actor
   is replaced: a CUDA error can leave the context unusable. If the actor dies, the trial is an
   ``error`` naming that, and the next trial gets a new one.

Multi-worker trials (DDP, FSDP) always run in fresh Ray Train workers: a process group per trial.
"""
from __future__ import annotations

import contextlib
import gc
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import ray

from dpo_sweep.config import TrialConfig, distinct_models
from dpo_sweep.core import trial_facts
from dpo_sweep.core.status import Status
from dpo_sweep.sweep.protocol import TrialFailure, short_error
from dpo_sweep.sweep.task import Trainer, TrialTask, resolve_trainer
from dpo_sweep.sweep.trial_run import output_to_file, run_and_report, worker_log_path
from dpo_sweep.sweep.worker_setup import unused_packages_hidden
from dpo_sweep.train.data import data_key


class TrialStopped(BaseException):
    """Raised in a warm worker's trial thread at the step after Tune stopped the trial: a
    BaseException, so that the trainer's own failure handling never turns it into an ``error``."""


def wanted(cfg: TrialConfig) -> bool:
    """Whether ``cfg`` runs in a warm worker (one worker process per trial, simulated ranks
    included, and not switched off)."""
    return trial_facts.processes(cfg) == 1 and cfg.resources.warm_workers


class TrialWorker:
    """The long-lived process of one trial slot (see the module doc). A Ray actor of the sweep's
    :class:`WorkerPool`; a plain object in tests."""

    def __init__(self, trainer: Trainer | None = None, models: list[Any] = (), data: TrialConfig | None = None):
        """``trainer``: the sweep's stand-in for the trainer (tests), None: the real one."""
        started = time.time()  # no Ray Train here: importing it costs seconds
        with unused_packages_hidden():
            self._run_trial = resolve_trainer(trainer)
            from dpo_sweep.train.model import prepare_imports  # the trainer's own modules: imported with it
            from dpo_sweep.train.warm_state import WarmState

            for spec in models:  # the modelling code the sweep's trials will build (lazy in transformers)
                prepare_imports(spec)
        #: What this worker keeps from one trial to the next, and how it lets go of the rest.
        self._warm = WarmState()
        # What the imports made lives as long as the process: out of the collector's sight, so
        # that the full collection after every trial walks only what trials made (with all of it
        # imported, each collection would walk every module's objects).
        gc.freeze()
        #: When the import ran: the part that overlaps the first trial is that trial's ``import``
        #: phase (the trial that started this worker waited for it; later trials do not).
        self._import_window: tuple[float, float] | None = (started, time.time())
        if data is not None:  # the sweep's data, tokenised while the driver's preflight runs
            self._warm.prefetch(data)
        self.trials_run = 0
        # One trial at a time: the actor takes a second call (stop) while a trial runs, and a trial
        # that Tune stopped ends at its next step while the next one waits here.
        self._one_trial = threading.Lock()
        self._stop: str | None = None  # the trial to end at its next step (stop)

    def stop(self, trial_id: str) -> None:
        """End the trial ``trial_id`` at its next step, if it runs here (Tune stopped it: an early
        stop's decision); its steps so far are its result, which the sweep's driver already holds."""
        self._stop = trial_id

    def run(self, task: TrialTask) -> Iterator[dict[str, Any]]:
        """Run one trial, yielding its reports as they happen (dicts, as Tune takes them), then its
        :class:`~dpo_sweep.sweep.protocol.TrialFailure` if it failed."""
        entered = time.time()
        trial_start = task.trial_start
        first = self._import_window is not None
        began, ready = self._import_window or (entered, entered)
        self._import_window = None
        ray_end = min(max(began, trial_start), entered)
        import_end = min(max(ready, ray_end), entered)
        reports: queue.Queue = queue.Queue()
        ended = object()
        failure: list[TrialFailure] = []

        def report(item: dict[str, Any]) -> None:
            reports.put(item)
            if self._stop == cfg.trial_id:
                raise TrialStopped(cfg.trial_id)

        def work() -> None:
            try:
                run_and_report(task, task.trainer or self._run_trial, ray_end=ray_end,
                               import_end=import_end, report=report, rank=0, warm=self._warm)
            except TrialStopped:
                pass  # no consumer is left for its reports: Tune ended the trial
            except BaseException as exc:  # noqa: BLE001 - every failure becomes this trial's status
                # Worded as a Ray Train worker's failure is: one worker, rank 0.
                failure.append(TrialFailure.from_exception(exc, rank=0))
                del exc  # the traceback holds the failed step's frames and tensors
            finally:
                reports.put(ended)

        cfg = task.cfg
        with contextlib.ExitStack() as stack:
            stack.enter_context(self._one_trial)
            if task.log_dir:  # everything the trial prints goes to its log file, as a Train worker's does
                stack.enter_context(output_to_file(worker_log_path(task.log_dir, cfg.trial_id, 0)))
            if first:  # where this worker's own start went, beside the trial's start-up split
                print(import_window_line(cfg.trial_id, began, ready, trial_start), flush=True)
            try:
                thread = threading.Thread(target=work, name=f"trial-{cfg.trial_id}", daemon=True)
                thread.start()
                while (item := reports.get()) is not ended:
                    yield item
                thread.join()
            finally:
                self.trials_run += 1
                self._warm.release(_device_of(cfg))
        if failure:  # a plain yield: Ray drives the generator with send(), which a list's iterator lacks
            yield failure[0]


def import_window_line(trial_id: str, began: float, ready: float, trial_start: float) -> str:
    """The first trial's log line on its warm worker's imports, in seconds from the trial's start
    (negative: before it)."""
    return (f"[{trial_id}] warm worker: imports took {ready - began:.1f} s, "
            f"from {began - trial_start:+.1f} s to {ready - trial_start:+.1f} s of the trial's start")


def _device_of(cfg: TrialConfig) -> Any:
    import torch

    from dpo_sweep.train.loop import resolve_device

    try:
        return resolve_device(cfg)
    except Exception:  # noqa: BLE001 - nothing to release on a device that is not there
        return torch.device("cpu")


# --- The pool: created by the sweep's driver, used by the Tune trial processes -----------------


class WorkerPool:
    """The sweep's warm workers, one per concurrent trial, handed to this actor when the sweep
    starts; the Tune trial processes take them from it by its name. A Ray actor
    (:func:`start_pool`); the workers it creates itself (replacements) it owns, so they end with it."""

    def __init__(self, workers: list[Any], options: dict[str, Any], trainer: Trainer | None, models: list[Any],
                 data: TrialConfig | None = None):
        import asyncio

        self._options, self._trainer, self._models, self._data = options, trainer, models, data
        self._free: asyncio.Queue = asyncio.Queue()
        self._lent: dict[str, Any] = {}
        for worker in workers:
            self._free.put_nowait(worker)

    def _new_worker(self) -> Any:
        return new_worker(self._options, self._trainer, self._models, self._data)

    async def acquire(self, trial_id: str = "") -> Any:
        """A free worker (waits for one: the sweep runs at most as many trials as it has), lent to
        ``trial_id`` until it is released or abandoned."""
        worker = await self._free.get()
        self._lent[trial_id] = worker
        return worker

    async def release(self, worker: Any, replace: bool = False, trial_id: str = "") -> None:
        """Give ``worker`` back; ``replace``: it is not to run another trial (after an error, or
        dead): a new one takes its place."""
        if trial_id and self._lent.pop(trial_id, None) is None:
            return  # abandoned already: its replacement is in the queue
        if replace:
            ray.kill(worker, no_restart=True)
            worker = self._new_worker()
        self._free.put_nowait(worker)

    async def abandon(self, trial_id: str) -> None:
        """End the worker lent to ``trial_id`` (a trial past its time limit, whose process the
        sweep ended: it never releases it; the worker may be stopped or hung) and put a new one in
        its place."""
        worker = self._lent.pop(trial_id, None)
        if worker is not None:
            ray.kill(worker, no_restart=True)
            self._free.put_nowait(self._new_worker())


def new_worker(options: dict[str, Any], trainer: Trainer | None, models: list[Any], data: TrialConfig | None = None) -> Any:
    """A :class:`TrialWorker` actor; it starts importing the trainer and ``models``' code at once,
    then tokenising ``data``'s pairs."""
    # Two calls at a time: ``stop`` reaches a worker while its trial runs (TrialWorker._one_trial).
    return ray.remote(TrialWorker).options(**options, max_restarts=0, max_concurrency=2).remote(trainer, models, data)


@dataclass
class WarmPool:
    """The driver's handle on the sweep's pool: its name (the trials find it by that), the actor,
    and the first workers, which the driver created (:func:`start_pool`) and so owns."""

    name: str
    actor: Any
    workers: list[Any]

    def close(self) -> None:
        """End the pool and every worker (the pool's own replacements end with it): their GPUs
        are free again. Ending an actor twice is harmless."""
        for actor in (self.actor, *self.workers):
            ray.kill(actor, no_restart=True)


def shared_data(trials: Sequence[TrialConfig]) -> TrialConfig | None:
    """A trial whose data every one of ``trials`` reads (the same pairs, tokenizer and
    ``max_length``): what a warm worker tokenises as it starts; None when they read several."""
    return trials[0] if len({data_key(t) for t in trials}) == 1 else None


def start_pool(name: str, count: int, trials: Sequence[TrialConfig], use_gpu: bool,
               trainer: Trainer | None = None) -> WarmPool:
    """The sweep's :class:`WorkerPool` named ``name`` with ``count`` workers that start importing
    the trainer and ``trials``' model classes now. The driver creates the workers itself, at the
    same time as the pool: a worker's process start and imports are the first trial's wait, and
    they need not wait for the pool's own process to start. Then each tokenises the trials' data
    (:func:`shared_data`)."""
    first = trials[0].resources
    options = {"num_cpus": first.cpus_per_worker, "num_gpus": 1 if use_gpu else 0}
    models = distinct_models(trials)
    data = shared_data(trials)
    workers = [new_worker(options, trainer, models, data) for _ in range(count)]
    actor = ray.remote(WorkerPool).options(name=name, num_cpus=0, max_concurrency=max(4, 2 * count)).remote(
        workers, options, trainer, models, data)
    return WarmPool(name, actor, workers)


def run_in_warm_worker(task: TrialTask) -> TrialFailure | None:
    """Run ``task`` in a warm worker of the sweep's pool (``task.warm_pool``), forwarding its
    reports to Tune; how it failed, None when it did not."""
    from ray import tune

    pool = ray.get_actor(task.warm_pool)
    trial_id = task.trial_id
    worker = ray.get(pool.acquire.remote(trial_id))
    failure: TrialFailure | None = None
    try:
        # Named after the trial: the dashboard's task list shows which trial a worker runs.
        for ref in worker.run.options(name=f"trial {trial_id}").remote(task):
            item = ray.get(ref)
            if isinstance(item, TrialFailure):
                failure = item
            else:
                tune.report(item)
    except SystemExit:  # Tune stopped the trial (an early stop at a rung): the worker ends it at its next step
        worker.stop.remote(trial_id)
        raise
    except ray.exceptions.RayActorError as exc:
        failure = TrialFailure(Status.ERROR, short_error(f"the trial's worker process died: {exc}"), infrastructure=True)
    finally:
        # After an error (or a dead actor) a new worker takes this one's place.
        pool.release.remote(worker, failure is not None and not failure.process_usable, trial_id)
    return failure
