"""The sweep's driver side of a trial's reports: :class:`TrialCollector` (fed by the recorder, the
sweep's Tune callback) turns the stream of one trial's reports (:mod:`~dpo_sweep.sweep.protocol`)
into a :class:`CollectedTrial`: one ``TrialResult`` and its ``StepRecord`` rows, ready to be
appended to ``results.csv`` / ``steps.csv``. No Ray calls here."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from dpo_sweep.config import TrialConfig
from dpo_sweep.core.held_out import HELD_OUT_FIELDS
from dpo_sweep.core.status import Status
from dpo_sweep.records import StepRecord, TrialResult, config_columns, failed_result
from dpo_sweep.sweep.protocol import OutcomeReport, StepReport, TrialEnding, TrialFailure, short_error


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
    outcome: OutcomeReport | None = None
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
        if step := StepReport.from_report(result):
            p.steps.append(step.record)
            p.startup_s, p.measure_s = step.startup_s, step.measure_s
        if outcome := OutcomeReport.from_report(result):
            p.outcome = outcome
        if ending := TrialEnding.from_report(result):
            return self._finish(key, ending.failure)
        return None

    def abandon(self, key: str, cfg: TrialConfig, error: str, status: str = Status.ERROR) -> CollectedTrial:
        """Close a trial whose process died or was ended (``status`` ``timeout``: past its limit):
        lost to the machine, so its row is marked for --resume to run again."""
        self._get(key, cfg)
        return self._finish(key, TrialFailure(status, short_error(error) or "the trial process died", infrastructure=True))

    def stopped(self, key: str, cfg: TrialConfig, step: int, why: str) -> CollectedTrial:
        """Close a trial that an early-stopping scheduler ended at ``step`` (``why``: its rule):
        a ``stopped`` row with its steps so far and the held-out scores of its last eval point."""
        p = self._pending.pop(key, None) or _Pending(cfg)
        steps = tuple(s for s in p.steps if s.step <= step)
        scored = [s for s in steps if math.isfinite(s.eval_reward_accuracy)]
        held_out = {f: getattr(scored[-1], f) for f in HELD_OUT_FIELDS} if scored else {}
        result = failed_result(cfg, Status.STOPPED, f"stopped at step {step}: {why}", steps,
                               startup_s=p.startup_s, measure_s=p.measure_s)
        result = dataclasses.replace(result, **held_out, stopped_step=step)
        return CollectedTrial(result=result, steps=steps)

    def _finish(self, key: str, failure: TrialFailure | None) -> CollectedTrial:
        p = self._pending.pop(key)
        # The steps come from their own reports, whatever the ending; the row from the trainer
        # when it got to write one, else from what those steps (and their timing) tell.
        environment = p.outcome.environment if p.outcome is not None else None
        if failure is None and p.outcome is not None:
            result = p.outcome.result
        else:
            failure = failure or TrialFailure(Status.ERROR, "the trainer returned without reporting its outcome")
            result = failed_result(p.cfg, failure.status, failure.error, p.steps, failing_peak_gb=failure.peak_mem_gb,
                                   startup_s=p.startup_s, measure_s=p.measure_s)
        # Its configuration's columns again: the outcome crossed as JSON, which turns tuples into lists.
        result = dataclasses.replace(result, **config_columns(p.cfg),
                                     infrastructure_failure=bool(failure is not None and failure.infrastructure))
        return CollectedTrial(result=result, steps=tuple(p.steps), environment=environment)
