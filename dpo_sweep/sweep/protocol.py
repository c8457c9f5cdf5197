"""What one trial's processes tell each other: the typed messages of a trial's reports.

A trial's run (a Ray Train worker's or a warm worker's, :mod:`~dpo_sweep.sweep.trial_run`) reports
a :class:`StepReport` per optimizer step, then rank 0's :class:`OutcomeReport` (the summary row and
its machine); the Tune trainable (:mod:`~dpo_sweep.sweep.trainable`) ends with a
:class:`TrialEnding`: finished, or the :class:`TrialFailure` it classified
(:func:`classify_failure`). The sweep's collector (:mod:`~dpo_sweep.sweep.collector`) reads them
back from Tune's result dicts. Each message writes and reads its own keys here, and nowhere else.

What crosses Tune is a dict of plain values (Ray pickles it, NaN included); the keys carry the
``dpo/`` prefix so that they never collide with the keys Tune fills in itself (its own
``trial_id``). No torch here: the driver process imports this module.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any, Mapping

from dpo_sweep.core.status import Status
from dpo_sweep.core.held_out import HELD_OUT_COLUMNS
from dpo_sweep.records import StepRecord, TrialResult, peak_up_to_failure_gb

STEP_KEY = "dpo/step"          # a StepRecord, as a dict, one report per optimizer step
STARTUP_KEY = "dpo/startup_s"  # TrialClock.startup_s() so far (for a trial that ends without a row)
MEASURE_KEY = "dpo/measure_s"  # TrialClock.measure_s() so far
OUTCOME_KEY = "dpo/outcome"    # rank 0's summary row and machine, as a JSON string, after the last step
ENDING_KEY = "dpo/summary"     # the trainable's last report: how the trial's run ended (JSON string)
#: At a learning trial's eval points only (data.eval_pairs): the step, the clock of an early-stopping
#: scheduler's rungs (sweep/early_stop.py), and each held-out metric under metric_key(field).
EVAL_STEP_KEY = "dpo/eval_step"
MAX_ERROR_CHARS = 2000


#: The held-out metrics an eval point reports at the top level (StepRecord fields).
HELD_OUT_METRICS = ("eval_reward_accuracy", "eval_reward_margin", "eval_loss")


def metric_key(field: str) -> str:
    """The report key of a held-out metric: its column's name (``eval_rewards/accuracies``)."""
    return HELD_OUT_COLUMNS.get(field, field)


def _from_dict(cls: type, data: Mapping[str, Any]) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True)
class StepReport:
    """One optimizer step's row and the trial's clock so far. Every rank reports it (Train V2
    expects the same number of reports from each worker); Tune forwards rank 0's."""

    record: StepRecord
    startup_s: float = math.nan
    measure_s: float = math.nan

    def to_report(self) -> dict[str, Any]:
        report = {STEP_KEY: dataclasses.asdict(self.record), STARTUP_KEY: self.startup_s,
                  MEASURE_KEY: self.measure_s}
        if math.isfinite(self.record.eval_reward_accuracy):  # an eval point: the scheduler's to compare
            report[EVAL_STEP_KEY] = self.record.step
            report.update({metric_key(f): getattr(self.record, f) for f in HELD_OUT_METRICS})
        return report

    @staticmethod
    def from_report(report: Mapping[str, Any]) -> StepReport | None:
        """The step report in ``report``, or None when it holds none."""
        if not isinstance(report.get(STEP_KEY), dict):
            return None
        return StepReport(_from_dict(StepRecord, report[STEP_KEY]), float(report.get(STARTUP_KEY, math.nan)),
                          float(report.get(MEASURE_KEY, math.nan)))


@dataclass(frozen=True)
class OutcomeReport:
    """Rank 0's summary row and machine (environment.json's content as its worker sees it), after
    the last step. The step rows travel once, in their own reports."""

    result: TrialResult
    environment: dict[str, Any] | None = None

    def to_report(self) -> dict[str, Any]:
        # JSON, NaN kept: Python's json writes and reads it.
        text = json.dumps({"result": dataclasses.asdict(self.result), "environment": self.environment}, default=str)
        return {OUTCOME_KEY: text}

    @staticmethod
    def from_report(report: Mapping[str, Any]) -> OutcomeReport | None:
        if not isinstance(report.get(OUTCOME_KEY), str):
            return None
        data = json.loads(report[OUTCOME_KEY])
        return OutcomeReport(_from_dict(TrialResult, data["result"]), data.get("environment"))


@dataclass(frozen=True)
class TrialFailure:
    """How a trial's run failed: ``oom`` or ``error``, the message, and the peak memory up to the
    failure (GB, NaN when no worker carried it)."""

    status: str
    error: str
    peak_mem_gb: float = math.nan
    infrastructure: bool = False  # a process or node of the trial died: not the configuration's result

    @staticmethod
    def from_exception(exc: BaseException, *, rank: int | None = None) -> TrialFailure:
        """``exc`` classified (:func:`classify_failure`) with its peak (:func:`failure_peak`);
        ``rank``: the one worker it came from, named in the message as a Ray Train failure names it."""
        status, message = classify_failure(exc)
        if rank is not None:
            message = short_error(f"rank {rank}: {message}")
        return TrialFailure(status, message, failure_peak(exc), infrastructure=is_infrastructure(exc))

    @property
    def process_usable(self) -> bool:
        """Whether the failed process may run another trial: after an OOM the allocator recovers;
        after any other error a CUDA context may be left unusable."""
        return self.status == Status.OOM


@dataclass(frozen=True)
class TrialEnding:
    """How a trial's run ended, the Tune trainable's last report: finished (its row came in the
    :class:`OutcomeReport`) or the failure; ``wall_s``: the trainable's own time."""

    failure: TrialFailure | None = None
    wall_s: float = math.nan

    @property
    def status(self) -> str:
        return "finished" if self.failure is None else self.failure.status

    def to_report(self) -> dict[str, Any]:
        f = self.failure
        data = {"status": self.status, "error": f.error if f else "",
                "peak_mem_gb": f.peak_mem_gb if f else math.nan, "wall_s": self.wall_s,
                "infrastructure": bool(f and f.infrastructure)}
        return {ENDING_KEY: json.dumps(data)}

    @staticmethod
    def from_report(report: Mapping[str, Any]) -> TrialEnding | None:
        if not isinstance(report.get(ENDING_KEY), str):
            return None
        data = json.loads(report[ENDING_KEY])
        status = data.get("status", Status.ERROR)
        wall_s = float(data.get("wall_s", math.nan))
        if status == "finished":
            return TrialEnding(None, wall_s)
        failure = TrialFailure(status, data.get("error", ""), float(data.get("peak_mem_gb", math.nan)),
                               bool(data.get("infrastructure", False)))
        return TrialEnding(failure, wall_s)


# --- Failures -> statuses ---------------------------------------------------------------------


def short_error(text: str) -> str:
    """An error message on one line, at most :data:`MAX_ERROR_CHARS` long."""
    text = " ".join(text.split())
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


def classify_failure(exc: BaseException) -> tuple[str, str]:
    """How a trial's run failed -> ``(status, message)``: ``oom`` with the failed allocation's
    message when any worker ran out of memory, else ``error`` with the first worker's message.
    ``exc``: a Ray Train ``WorkerGroupError`` (its ``worker_failures`` by rank) or one exception."""
    failures: dict[int, BaseException] = dict(getattr(exc, "worker_failures", None) or {})
    if failures:
        ranked = sorted(failures.items())
        for rank, err in ranked:
            if _is_oom(err):
                return Status.OOM, short_error(f"rank {rank}: {_root_message(err)}")
        rank, err = ranked[0]
        return Status.ERROR, short_error(f"rank {rank}: {type(_root(err)).__name__}: {_root_message(err)}")
    if _is_oom(exc):
        return Status.OOM, short_error(_root_message(exc))
    return Status.ERROR, short_error(f"{type(exc).__name__}: {exc}")


#: Ray's errors for a process, node or object lost under a trial (not the trial's own exception).
_INFRASTRUCTURE_ERRORS = ("RayActorError", "ActorDiedError", "ActorUnavailableError", "WorkerCrashedError",
                          "NodeDiedError", "ObjectLostError", "OwnerDiedError", "LocalRayletDiedError",
                          "RaySystemError")


def is_infrastructure(exc: BaseException) -> bool:
    """Whether a trial's failure is the machine's (a Ray worker, actor or node died, Ray's memory
    monitor killed a process) rather than the configuration's: any worker failure's exception, or
    what it wraps, is one of Ray's system errors."""
    failures = list((getattr(exc, "worker_failures", None) or {}).values()) or [exc]
    for failure in failures:
        seen: BaseException | None = failure
        while seen is not None:
            names = {c.__name__ for c in type(seen).__mro__}
            if names & set(_INFRASTRUCTURE_ERRORS) or (
                    "OutOfMemoryError" in names and type(seen).__module__.startswith("ray")):
                return True
            cause = getattr(seen, "cause", None) or seen.__cause__
            seen = cause if isinstance(cause, BaseException) and cause is not seen else None
    return False


def failure_peak(exc: BaseException) -> float:
    """The peak memory up to the failure (GB), max over the failed workers; NaN if none carried it
    (the trainer's memory sampler attaches it; Ray pickles it along with the exception)."""
    from dpo_sweep.telemetry import failure_peak_gb  # torch: only once it failed

    failures = list((getattr(exc, "worker_failures", None) or {}).values()) or [exc]
    return peak_up_to_failure_gb([failure_peak_gb(e) for f in failures for e in (f, _root(f))], math.nan)


def _is_oom(exc: BaseException) -> bool:
    import torch  # only once a trial failed

    if isinstance(exc, torch.OutOfMemoryError):
        return True
    cause = getattr(exc, "cause", None)  # a RayTaskError wraps the worker's exception
    return cause is not None and cause is not exc and _is_oom(cause)


def _root(exc: BaseException) -> BaseException:
    cause = getattr(exc, "cause", None)
    return _root(cause) if isinstance(cause, BaseException) and cause is not exc else exc


def _root_message(exc: BaseException) -> str:
    root = _root(exc)
    return str(root) or type(root).__name__
