"""The sweep plan's shared state (:mod:`~dpo_sweep.plan.schedule`): a measurement group, which
the measure phase runs and every phase reads, and the rows handed out, which every phase writes
to. Each phase keeps its own state (:mod:`~dpo_sweep.plan.measure_phase`,
:mod:`~dpo_sweep.plan.learn_phase`, :mod:`~dpo_sweep.plan.runoff_phase`)."""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from dpo_sweep.config import TrialConfig
from dpo_sweep.core.status import Status
from dpo_sweep.plan.rows import shared_row
from dpo_sweep.plan.runoff import timed_row
from dpo_sweep.records import PENDING, StepRecord, TrialResult


class GroupState(enum.Enum):
    """Where a group's measurement is: not started, its measure job running, ended, or pruned
    (predicted over budget, or dominating an OOM in memory) without running."""

    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    PRUNED = "pruned"


@dataclass
class Group:
    """The configurations one memory/time measurement serves (one measurement_key; in full_grid
    one configuration each), and what that measurement gave."""

    measuring: TrialConfig
    members: tuple[TrialConfig, ...]
    state: GroupState = GroupState.PENDING
    ran_grad_acc: int = 0
    predicted_gb: float = math.nan
    result: TrialResult | None = None
    steps: tuple[StepRecord, ...] = ()
    saved: dict[str, TrialResult] = field(default_factory=dict)  # rows a resumed sweep restored, by trial id

    @property
    def ended(self) -> bool:
        """Measured or pruned: nothing of this group runs any more."""
        return self.state in (GroupState.DONE, GroupState.PRUNED)

    @property
    def measured_ok(self) -> bool:
        return self.state is GroupState.DONE and self.result.status == Status.OK

    def ran_in_full(self, cfg: TrialConfig) -> bool:
        """``cfg`` is the configuration measured, and at its own grad_acc."""
        return self.measuring.trial_id == cfg.trial_id and self.ran_grad_acc == cfg.grad_acc

    def row(self, m: TrialConfig, runoff: TrialResult | None = None) -> TrialResult:
        """Member ``m``'s row from this measurement (a resumed sweep's: the row it restored), with
        ``runoff``'s time when it had one (its stability columns still to fill)."""
        row = self.saved.get(m.trial_id) or shared_row(
            m, self.result, self.steps, ran_grad_acc=self.ran_grad_acc, measured_by=self.measuring.trial_id,
            predicted_peak_gb=self.predicted_gb)
        return timed_row(row, runoff) if runoff is not None and row.status == Status.OK else row


@dataclass
class Rows:
    """The results rows handed out (``written``; ``pending``: their stability still to come) and
    what waits to be taken: step rows, new rows, console notes, rows rewritten since written."""

    written: set[str] = field(default_factory=set)
    pending: set[str] = field(default_factory=set)
    steps: list[StepRecord] = field(default_factory=list)
    rows: list[TrialResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    replaced: list[TrialResult] = field(default_factory=list)

    def final(self, trial_id: str) -> bool:
        """Its row is written, its stability columns in."""
        return trial_id in self.written and trial_id not in self.pending

    def emit(self, row: TrialResult) -> None:
        self.written.add(row.trial_id)
        if row.stability == PENDING:
            self.pending.add(row.trial_id)
        self.rows.append(row)

    def note(self, line: str) -> None:
        self.notes.append(line)
