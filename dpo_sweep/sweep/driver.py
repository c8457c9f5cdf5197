"""One sweep trial: a Ray Tune function trainable that runs the DPO trainer in a warm worker or in
Ray Train workers.

The story of one trial, top to bottom:

1. Tune starts :func:`tune_trainable` with ``{"trial": <TrialConfig as JSON>, ...}``.
2. A one-worker trial runs in one of the sweep's warm workers
   (:mod:`dpo_sweep.sweep.warm_worker`: long-lived actors that run trial after trial, their
   memory released in between; they call :func:`run_and_report` as a Train worker does and
   their reports reach Tune the same way). Otherwise it builds a Ray Train ``TorchTrainer``
   (``num_workers = resources.workers_per_trial``, fractional CPUs per worker, one GPU per
   worker when GPUs are used) and calls ``fit()``. Train V2 is the
   default in Ray 2.60 and passing a trainer to ``tune.Tuner`` is deprecated, hence the function
   trainable around ``fit()``. Its ``torch_config`` is :class:`~dpo_sweep.sweep.torch_backend.
   LazyTorchConfig` (the trial's Train controller process then never imports torch), and Tune
   reuses the trial process from one trial to the next (``reuse_actors``): only the training
   workers, the processes that touch the GPU, are new for every trial.
3. Every worker runs :func:`train_loop_per_worker`: ``run_trial(cfg, on_step=..., catch_failures=
   False)``. Each optimizer step is reported with ``ray.train.report`` (all ranks report, as Train
   requires; Tune sees rank 0's metrics through ``TuneReportCallback``). After the last step rank 0
   reports the summary row (and its machine) as one JSON string; the step rows travel once, in
   the per-step reports.
4. ``fit()`` raising is a result, not a crash: a ``WorkerGroupError`` whose worker failure is a
   ``torch.OutOfMemoryError`` becomes status ``oom`` with the failed allocation's message, anything
   else ``error`` with the message. The trainable's own last report carries this summary, with
   the peak memory up to the failure that the failed workers' exceptions carry (the trainer's
   memory sampler attaches it; Ray pickles it along with the exception).
5. In the sweep's driver process :class:`TrialCollector` (fed by the runner's Tune callback) turns
   the stream of reports of one trial into a :class:`CollectedTrial`: one ``TrialResult`` and its
   ``StepRecord`` rows, ready to be appended to ``results.csv`` / ``steps.csv``.

The trial's ``TrialConfig`` is validated once, in :func:`tune_trainable` (Tune's param_space holds
it as JSON); the workers get the validated object, and the sweep's callback looks its own up.
``startup_s`` / ``measure_s`` have one definition, :class:`~dpo_sweep.telemetry.timing.TrialClock`:
the worker starts it at the Tune trial's start and the trainer marks its steps on it.

All report keys carry the ``dpo/`` prefix so they never collide with the keys Tune fills in itself
(Tune adds its own ``trial_id``).
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import math
import os
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from dpo_sweep.config import TrialConfig
from dpo_sweep.records import StepRecord, TrialResult, config_columns, failed_result, peak_up_to_failure_gb

#: Where the trainer lives; tests may point a sweep at a stand-in with the same signature.
DEFAULT_TRAINER = "dpo_sweep.train.loop:run_trial"
#: CPUs the Tune trial process itself holds: it only waits on ``fit()``. Kept small so that on a
#: 2-core machine the trial and its workers (0.5 CPU each by default) fit together.
TRIAL_CPUS = 0.1

STEP_KEY = "dpo/step"          # a StepRecord, as a dict, one report per optimizer step
OUTCOME_KEY = "dpo/outcome"    # rank 0's summary row and machine, as a JSON string, after the last step
SUMMARY_KEY = "dpo/summary"    # the trainable's last report: how fit() ended (JSON string)
STARTUP_KEY = "dpo/startup_s"  # TrialClock.startup_s() so far (for a trial that ends without a row)
MEASURE_KEY = "dpo/measure_s"  # TrialClock.measure_s() so far
MAX_ERROR_CHARS = 2000
#: Under the results directory: one log file per trial with everything its workers print.
LOGS_DIR = "logs"


# --- Ray Train worker ------------------------------------------------------------------------


def import_trainer(path: str) -> Callable[..., Any]:
    """``"package.module:function"`` -> the function (the trainer's ``run_trial``)."""
    module_name, _, attr = path.partition(":")
    return getattr(importlib.import_module(module_name), attr or "run_trial")


def outcome_to_json(result: TrialResult, environment: dict[str, Any] | None = None) -> str:
    """A trial's summary row and machine as JSON (NaN survives: Python's json writes and reads it)."""
    return json.dumps({"result": dataclasses.asdict(result), "environment": environment}, default=str)


def _from_dict(cls: type, data: dict[str, Any]) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})


def outcome_from_json(text: str) -> tuple[TrialResult, dict[str, Any] | None]:
    data = json.loads(text)
    return _from_dict(TrialResult, data["result"]), data.get("environment")


def step_from_report(data: dict[str, Any]) -> StepRecord:
    """A StepRecord back from its per-step report (a plain dict: Ray pickles it, NaN included)."""
    return _from_dict(StepRecord, data)


def _worker_environment() -> dict[str, Any] | None:
    """environment.json's content as seen by a training worker: its GPU, driver and CUDA (the
    sweep's driver process may run on a CPU-only head node)."""
    try:
        from dpo_sweep.telemetry import environment_info
    except ImportError:
        return None
    return environment_info()


def _quiet_train_reports() -> None:
    """Ray Train logs every ``report`` call with its whole metrics dict at INFO: one multi-line
    record per step per worker in the sweep's console. The trainer's own step line says it better."""
    import logging

    try:
        from ray.train.v2._internal.execution import context as train_context  # private module
    except ImportError:
        return
    logging.getLogger(train_context.__file__).setLevel(logging.WARNING)


def startup_line(trial_id: str, ray_s: float, import_s: float) -> str:
    """Rank 0's console line on where its trial's start-up went (benchmarks/sweep_overhead.py
    reads it)."""
    return (f"[{trial_id}] worker loop started {ray_s:.1f} s after the trial, trainer imported "
            f"in {import_s:.1f} s")


def worker_log_path(log_dir: str, trial_id: str, rank: int) -> Path:
    """``DIR/logs/<trial_id>.log`` for rank 0, ``<trial_id>.rank<N>.log`` for the others."""
    return Path(log_dir) / (f"{trial_id}.log" if rank == 0 else f"{trial_id}.rank{rank}.log")


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


def train_loop_per_worker(loop_config: dict[str, Any]) -> None:
    """Runs inside every Ray Train worker: everything it prints goes to the trial's log file
    (:func:`worker_log_path`; the driver's console gets one line per trial from the reports)."""
    import ray.train

    cfg: TrialConfig = loop_config["trial"]  # validated once, by tune_trainable
    log_dir = loop_config.get("log_dir")
    if not log_dir:
        _train_loop(loop_config)
        return
    rank = ray.train.get_context().get_world_rank()
    with output_to_file(worker_log_path(log_dir, cfg.trial_id, rank)):
        _train_loop(loop_config)


def _train_loop(loop_config: dict[str, Any]) -> None:
    """Build, step, measure, report (the trainer does the first three; this function only wires
    its per-step callback to ``ray.train.report``)."""
    import ray.train

    entered = time.time()
    _quiet_train_reports()
    run_trial = import_trainer(loop_config.get("trainer", DEFAULT_TRAINER))
    run_and_report(loop_config, run_trial, ray_end=entered, import_end=time.time(), report=ray.train.report,
                   rank=ray.train.get_context().get_world_rank())


def run_and_report(loop_config: dict[str, Any], run_trial: Callable[..., Any], *, ray_end: float,
                   import_end: float, report: Callable[[dict[str, Any]], None], rank: int) -> None:
    """Run the trial and send each step's row, then the outcome, through ``report`` (Ray Train's in
    a Train worker, a queue in a warm worker). ``ray_end`` / ``import_end``: when Ray had this
    process running the trial and when the trainer was imported (wall clock; start-up split)."""
    from dpo_sweep.telemetry.timing import TrialClock  # imports torch (the trainer just did): workers only

    cfg: TrialConfig = loop_config["trial"]  # validated once, by tune_trainable
    # Start-up counts from the Tune trial's start: Ray's worker start-up is part of it.
    clock = TrialClock(started_at=loop_config["trial_start"])
    clock.mark("ray", at=ray_end)
    clock.mark("import", at=import_end)
    if rank == 0:
        # Where a trial's start-up goes: Ray (trial, controller, worker processes) until here,
        # then importing the trainer, then the trainer's own data and model build (it logs those).
        print(startup_line(cfg.trial_id, ray_end - clock.started_at, import_end - ray_end), flush=True)

    def on_step(record: StepRecord) -> None:
        # Every rank reports (Train V2 expects the same number of reports from each worker); Tune
        # forwards rank 0's. A plain dict: the driver's Tune callback rebuilds the StepRecord.
        report({STEP_KEY: dataclasses.asdict(record), STARTUP_KEY: clock.startup_s(),
                MEASURE_KEY: clock.measure_s()})

    outcome = run_trial(cfg, on_step=on_step, log=print if rank == 0 else None,
                        catch_failures=False, clock=clock)
    environment = _worker_environment() if rank == 0 else None
    report({OUTCOME_KEY: outcome_to_json(outcome.result, environment)})


# --- Tune trainable ---------------------------------------------------------------------------


def scaling_config(cfg: TrialConfig, use_gpu: bool) -> Any:
    from ray.train import ScalingConfig

    per_worker: dict[str, float] = {"CPU": cfg.resources.cpus_per_worker}
    if use_gpu:
        per_worker["GPU"] = 1  # one GPU per worker: DDP/FSDP ranks never share a device
    return ScalingConfig(num_workers=cfg.resources.workers_per_trial, use_gpu=use_gpu,
                         resources_per_worker=per_worker)


def _is_oom(exc: BaseException) -> bool:
    import torch

    if isinstance(exc, torch.OutOfMemoryError):
        return True
    cause = getattr(exc, "cause", None)  # a RayTaskError wraps the worker's exception
    return cause is not None and cause is not exc and _is_oom(cause)


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


def classify_failure(exc: BaseException) -> tuple[str, str]:
    """How ``fit()`` failed -> ``(status, message)``: ``oom`` with the failed allocation's
    message when any worker ran out of memory, else ``error`` with the first worker's message."""
    failures: dict[int, BaseException] = dict(getattr(exc, "worker_failures", None) or {})
    if failures:
        ranked = sorted(failures.items())
        for rank, err in ranked:
            if _is_oom(err):
                return "oom", _short(f"rank {rank}: {_root_message(err)}")
        rank, err = ranked[0]
        return "error", _short(f"rank {rank}: {type(_root(err)).__name__}: {_root_message(err)}")
    if _is_oom(exc):
        return "oom", _short(_root_message(exc))
    return "error", _short(f"{type(exc).__name__}: {exc}")


def failure_peak(exc: BaseException) -> float:
    """The peak memory up to the failure (GB), max over the failed workers; NaN if none carried it."""
    from dpo_sweep.telemetry import failure_peak_gb  # torch: only once it failed

    failures = list((getattr(exc, "worker_failures", None) or {}).values()) or [exc]
    return peak_up_to_failure_gb([failure_peak_gb(e) for f in failures for e in (f, _root(f))], math.nan)


def _root(exc: BaseException) -> BaseException:
    cause = getattr(exc, "cause", None)
    return _root(cause) if isinstance(cause, BaseException) and cause is not exc else exc


def _root_message(exc: BaseException) -> str:
    root = _root(exc)
    return str(root) or type(root).__name__


def tune_trainable(param: dict[str, Any]) -> None:
    """The Tune function trainable for one trial (see the module doc)."""
    from ray import tune

    from dpo_sweep.sweep import warm_worker

    trial_start = time.time()
    cfg = TrialConfig.model_validate(param["trial"])  # the one validation of this trial's config
    loop_config = {"trial": cfg, "trial_start": trial_start, "log_dir": param.get("log_dir"),
                   "trainer": param.get("trainer", DEFAULT_TRAINER)}
    use_gpu = bool(param.get("use_gpu", False))
    if param.get("warm_pool") and warm_worker.wanted(cfg):
        summary = warm_worker.run_in_warm_worker(loop_config, param["warm_pool"])
    else:
        summary = _fit_in_train_workers(loop_config, use_gpu, param["storage_path"])
    summary["wall_s"] = time.time() - trial_start
    tune.report({SUMMARY_KEY: json.dumps(summary)})


def _fit_in_train_workers(loop_config: dict[str, Any], use_gpu: bool, storage_path: str) -> dict[str, Any]:
    """The trial in fresh Ray Train workers (``TorchTrainer.fit()``), its reports forwarded to Tune
    (:mod:`~dpo_sweep.sweep.train_relay`); how it ended. The Train run is named after the trial."""
    from ray import tune
    from ray.train import FailureConfig, RunConfig
    from ray.train.torch import TorchTrainer

    from dpo_sweep.sweep.torch_backend import LazyTorchConfig
    from dpo_sweep.sweep.train_relay import fit_and_forward

    cfg: TrialConfig = loop_config["trial"]
    name = f"train-{cfg.trial_id}-{int(loop_config['trial_start'])}"

    def fit(callback: Any) -> None:
        TorchTrainer(
            train_loop_per_worker,
            train_loop_config=loop_config,
            # Ray's TorchConfig would make every trial's fresh controller process import torch first.
            torch_config=LazyTorchConfig(),
            scaling_config=scaling_config(cfg, use_gpu),
            run_config=RunConfig(
                name=name,
                storage_path=storage_path,
                # An OOM or a crash is this trial's result: never retry it.
                failure_config=FailureConfig(max_failures=0),
                callbacks=[callback],
            ),
        ).fit()

    summary: dict[str, Any] = {"status": "finished", "error": ""}
    try:
        fit_and_forward(fit, f"reports-{name}", tune.report)
    except Exception as exc:  # noqa: BLE001 - every failure becomes this trial's status
        summary["status"], summary["error"] = classify_failure(exc)
        summary["peak_mem_gb"] = failure_peak(exc)
    return summary


# --- Driver side: reports -> rows ------------------------------------------------------------


@dataclass(frozen=True)
class CollectedTrial:
    """One finished trial, as it goes into results.csv and steps.csv."""

    result: TrialResult
    steps: tuple[StepRecord, ...]
    environment: dict[str, Any] | None = None  # rank 0's host, GPU and versions (when it got that far)


@dataclass
class _Pending:
    cfg: TrialConfig
    steps: list[StepRecord] = field(default_factory=list)
    outcome: tuple[TrialResult, dict[str, Any] | None] | None = None
    startup_s: float = math.nan
    measure_s: float = math.nan


class TrialCollector:
    """Accumulates one sweep's Tune results per trial (driver process, no Ray calls).

    ``add(trial_key, cfg, result)`` takes one Tune result dict and returns a
    :class:`CollectedTrial` when it was the trial's last report, else None. ``abandon`` closes a
    trial that died without its last report (its trainable crashed).
    """

    def __init__(self) -> None:
        self._pending: dict[str, _Pending] = {}

    def _get(self, key: str, cfg: TrialConfig) -> _Pending:
        return self._pending.setdefault(key, _Pending(cfg))

    def add(self, key: str, cfg: TrialConfig, result: dict[str, Any]) -> CollectedTrial | None:
        p = self._get(key, cfg)
        if STARTUP_KEY in result:
            p.startup_s = float(result[STARTUP_KEY])
            p.measure_s = float(result.get(MEASURE_KEY, math.nan))
        if isinstance(result.get(STEP_KEY), dict):
            p.steps.append(step_from_report(result[STEP_KEY]))
        if isinstance(result.get(OUTCOME_KEY), str):
            p.outcome = outcome_from_json(result[OUTCOME_KEY])
        if isinstance(result.get(SUMMARY_KEY), str):
            summary = json.loads(result[SUMMARY_KEY])
            return self._finish(key, summary.get("status", "error"), summary.get("error", ""),
                                float(summary.get("peak_mem_gb", math.nan)))
        return None

    def abandon(self, key: str, cfg: TrialConfig, error: str) -> CollectedTrial:
        self._get(key, cfg)
        return self._finish(key, "error", _short(error) or "the trial process died")

    def _finish(self, key: str, status: str, error: str, failing_peak_gb: float = math.nan) -> CollectedTrial:
        p = self._pending.pop(key)
        # The steps come from their own reports, whatever the ending; the row from the trainer
        # when it got to write one, else from what those steps (and their timing) tell.
        environment = p.outcome[1] if p.outcome is not None else None
        if status == "finished" and p.outcome is not None:
            result = p.outcome[0]
        else:
            if status == "finished":
                status, error = "error", "the trainer returned without reporting its outcome"
            result = failed_result(p.cfg, status, error, p.steps, failing_peak_gb=failing_peak_gb,
                                   startup_s=p.startup_s, measure_s=p.measure_s)
        # Its configuration's columns again: the outcome crossed as JSON, which turns tuples into lists.
        result = dataclasses.replace(result, **config_columns(p.cfg))
        return CollectedTrial(result=result, steps=tuple(p.steps), environment=environment)
