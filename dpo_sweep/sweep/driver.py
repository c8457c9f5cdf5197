"""One sweep trial: a Ray Tune function trainable that runs the DPO trainer in Ray Train workers.

The story of one trial, top to bottom:

1. Tune starts :func:`tune_trainable` with ``{"trial": <TrialConfig as JSON>, ...}``.
2. It builds a Ray Train ``TorchTrainer`` (``num_workers = resources.workers_per_trial``, fractional
   CPUs per worker, one GPU per worker when GPUs are used) and calls ``fit()``. Train V2 is the
   default in Ray 2.60 and passing a trainer to ``tune.Tuner`` is deprecated, hence the function
   trainable around ``fit()``. Its ``torch_config`` is :class:`~dpo_sweep.sweep.torch_backend.
   LazyTorchConfig` (the trial's Train controller process then never imports torch), and Tune
   reuses the trial process from one trial to the next (``reuse_actors``): only the training
   workers, the processes that touch the GPU, are new for every trial.
3. Every worker runs :func:`train_loop_per_worker`: ``run_trial(cfg, on_step=..., catch_failures=
   False)``. Each optimizer step is reported with ``ray.train.report`` (all ranks report, as Train
   requires; Tune sees rank 0's metrics through ``TuneReportCallback``). After the last step rank 0
   reports the whole outcome (the summary row and the step rows) as one JSON string.
4. ``fit()`` raising is a result, not a crash: a ``WorkerGroupError`` whose worker failure is a
   ``torch.OutOfMemoryError`` becomes status ``oom`` with the failed allocation's message, anything
   else ``error`` with the message. The trainable's own last report carries this summary, with
   the peak memory up to the failure that the failed workers' exceptions carry (the trainer's
   memory sampler attaches it; Ray pickles it along with the exception).
5. In the sweep's driver process :class:`TrialCollector` (fed by the runner's Tune callback) turns
   the stream of reports of one trial into a :class:`CollectedTrial`: one ``TrialResult`` and its
   ``StepRecord`` rows, ready to be appended to ``results.csv`` / ``steps.csv``.

All report keys carry the ``dpo/`` prefix so they never collide with the keys Tune fills in itself
(Tune adds its own ``trial_id``).
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from dpo_sweep.analysis.results import StepRecord, TrialResult
from dpo_sweep.config import TrialConfig

#: Where the trainer lives; tests may point a sweep at a stand-in with the same signature.
DEFAULT_TRAINER = "dpo_sweep.train.loop:run_trial"
#: CPUs the Tune trial process itself holds: it only waits on ``fit()``. Kept small so that on a
#: 2-core machine the trial and its workers (0.5 CPU each by default) fit together.
TRIAL_CPUS = 0.1

STEP_KEY = "dpo/step"          # a StepRecord, as a dict, one report per optimizer step
OUTCOME_KEY = "dpo/outcome"    # rank 0's TrialOutcome, as a JSON string, after the last step
SUMMARY_KEY = "dpo/summary"    # the trainable's last report: how fit() ended (JSON string)
STARTUP_KEY = "dpo/startup_s"  # trial start -> start of the first optimizer step
MEASURE_KEY = "dpo/measure_s"  # start of the first optimizer step -> end of the latest one
MAX_ERROR_CHARS = 2000


# --- Ray Train worker ------------------------------------------------------------------------


def import_trainer(path: str) -> Callable[..., Any]:
    """``"package.module:function"`` -> the function (the trainer's ``run_trial``)."""
    module_name, _, attr = path.partition(":")
    return getattr(importlib.import_module(module_name), attr or "run_trial")


@dataclass
class StepClock:
    """Turns step records into the trial's ``startup_s`` and ``measure_s``.

    ``trial_start`` is the wall clock (``time.time()``) when the Tune trial started (on a
    multi-node cluster the trial and rank 0 may sit on different hosts: NTP-synchronised clocks
    are assumed, an error of milliseconds against start-ups of seconds); the first
    step's start is its end minus its own duration, so worker start-up, model build and data
    loading count as start-up and every optimizer step counts as measurement.
    """

    trial_start: float
    first_step_start: float | None = None
    last_step_end: float | None = None

    def tick(self, record: StepRecord, now: float | None = None) -> dict[str, float]:
        now = time.time() if now is None else now
        self.last_step_end = now
        if self.first_step_start is None:
            step_s = record.step_time_ms / 1e3 if math.isfinite(record.step_time_ms) else 0.0
            self.first_step_start = now - step_s
        return {STARTUP_KEY: self.first_step_start - self.trial_start,
                MEASURE_KEY: now - self.first_step_start}


def outcome_to_json(result: TrialResult, steps: tuple[StepRecord, ...] | list[StepRecord],
                    environment: dict[str, Any] | None = None) -> str:
    """A trial outcome as JSON (NaN survives: Python's json writes and reads it)."""
    row = dataclasses.asdict(result)
    return json.dumps({"result": row, "steps": [dataclasses.asdict(s) for s in steps],
                       "environment": environment}, default=str)


def _from_dict(cls: type, data: dict[str, Any]) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})


def outcome_from_json(text: str) -> tuple[TrialResult, list[StepRecord], dict[str, Any] | None]:
    data = json.loads(text)
    return (_from_dict(TrialResult, data["result"]),
            [_from_dict(StepRecord, s) for s in data.get("steps", [])],
            data.get("environment"))


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


def train_loop_per_worker(loop_config: dict[str, Any]) -> None:
    """Runs inside every Ray Train worker: build, step, measure, report (the trainer does the
    first three; this function only wires its per-step callback to ``ray.train.report``)."""
    import ray.train

    entered = time.time()
    _quiet_train_reports()
    cfg = TrialConfig.model_validate(loop_config["trial"])
    run_trial = import_trainer(loop_config.get("trainer", DEFAULT_TRAINER))
    rank = ray.train.get_context().get_world_rank()
    if rank == 0:
        # Where a trial's start-up goes: Ray (trial, controller, worker processes) until here,
        # then importing the trainer, then the trainer's own data and model build (it logs those).
        print(startup_line(cfg.trial_id, entered - loop_config["trial_start"], time.time() - entered),
              flush=True)
    clock = StepClock(trial_start=loop_config["trial_start"])

    def on_step(record: StepRecord) -> None:
        # Every rank reports (Train V2 expects the same number of reports from each worker); Tune
        # forwards rank 0's. A plain dict: the driver's Tune callback rebuilds the StepRecord.
        ray.train.report({STEP_KEY: dataclasses.asdict(record), **clock.tick(record)})

    outcome = run_trial(cfg, on_step=on_step, log=print if rank == 0 else None,
                        catch_failures=False)
    result = outcome.result
    if clock.first_step_start is not None and outcome.steps:
        # The sweep's definitions replace the trainer's (which start at run_trial's entry and
        # leave out warm-up): start-up includes Ray worker start-up, measurement every step.
        timing = clock.tick(outcome.steps[-1], now=clock.last_step_end)
        result = dataclasses.replace(result, startup_s=timing[STARTUP_KEY], measure_s=timing[MEASURE_KEY])
    environment = _worker_environment() if rank == 0 else None
    ray.train.report({OUTCOME_KEY: outcome_to_json(result, outcome.steps, environment)})


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
    from dpo_sweep.telemetry import failure_peak_gb, peak_up_to_failure_gb  # torch: only once it failed

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
    from ray.train import FailureConfig, RunConfig
    from ray.train.torch import TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    from dpo_sweep.sweep.torch_backend import LazyTorchConfig

    trial_start = time.time()
    cfg = TrialConfig.model_validate(param["trial"])
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"trial": param["trial"], "trial_start": trial_start,
                           "trainer": param.get("trainer", DEFAULT_TRAINER)},
        # Ray's TorchConfig would make every trial's fresh controller process import torch first.
        torch_config=LazyTorchConfig(),
        scaling_config=scaling_config(cfg, bool(param.get("use_gpu", False))),
        run_config=RunConfig(
            name=f"train-{cfg.trial_id}-{int(trial_start)}",
            storage_path=param["storage_path"],
            # An OOM or a crash is this trial's result: never retry it.
            failure_config=FailureConfig(max_failures=0),
            callbacks=[TuneReportCallback()],
        ),
    )
    summary: dict[str, Any] = {"status": "finished", "error": ""}
    try:
        trainer.fit()
    except Exception as exc:  # noqa: BLE001 - every failure becomes this trial's status
        summary["status"], summary["error"] = classify_failure(exc)
        summary["peak_mem_gb"] = failure_peak(exc)
    summary["wall_s"] = time.time() - trial_start
    tune.report({SUMMARY_KEY: json.dumps(summary)})


# --- Driver side: reports -> rows ------------------------------------------------------------


@dataclass(frozen=True)
class CollectedTrial:
    """One finished trial, as it goes into results.csv and steps.csv."""

    result: TrialResult
    steps: tuple[StepRecord, ...]
    environment: dict[str, Any] | None = None  # rank 0's host, GPU and versions (when it got that far)


def failure_result(cfg: TrialConfig, status: str, error: str,
                   steps: list[StepRecord] | tuple[StepRecord, ...] = (),
                   failing_peak_gb: float = math.nan) -> TrialResult:
    """The summary row of a trial that did not return an outcome (OOM, crash). ``peak_mem_gb``:
    the peak up to the failure, over the steps that ran and ``failing_peak_gb`` (the failing step's)."""
    from dpo_sweep.telemetry import peak_up_to_failure_gb

    return TrialResult(
        trial_id=cfg.trial_id, status=status, **cfg.knobs(), error=error,
        peak_mem_gb=peak_up_to_failure_gb([s.peak_mem_gb for s in steps], failing_peak_gb),
        loss_type=cfg.train.loss, precision=cfg.train.precision, reference=cfg.train.reference,
        attn_implementation=cfg.model.attn_implementation, steps=len(steps),
    )


@dataclass
class _Pending:
    cfg: TrialConfig
    steps: list[StepRecord] = field(default_factory=list)
    outcome: tuple[TrialResult, list[StepRecord], dict[str, Any] | None] | None = None
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
            p.steps.append(_from_dict(StepRecord, result[STEP_KEY]))
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
        environment = p.outcome[2] if p.outcome is not None else None
        if status == "finished" and p.outcome is not None:
            result, steps = p.outcome[0], p.outcome[1]
        elif status == "finished":
            result, steps = failure_result(
                p.cfg, "error", "the trainer returned without reporting its outcome", p.steps), p.steps
        else:
            result, steps = failure_result(p.cfg, status, error, p.steps, failing_peak_gb), p.steps
        if p.outcome is None or not math.isfinite(result.startup_s):
            # No outcome (OOM, crash): the timing of the steps that did run, from their reports.
            result = dataclasses.replace(result, startup_s=p.startup_s, measure_s=p.measure_s)
        return CollectedTrial(result=result, steps=tuple(steps), environment=environment)
