"""The sweep plan's state (:mod:`~dpo_sweep.plan.schedule`), one object per phase - measure,
learn, runoff - and one for the rows handed out. Plain data with the few questions each phase
asks of its own state; the plan decides what happens next."""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from dpo_sweep.config import TrialConfig
from dpo_sweep.core.status import Status
from dpo_sweep.plan.calibrate import Calibration, Measurement, calibrate
from dpo_sweep.plan.jobs import Job
from dpo_sweep.plan.rows import LearningSource, shared_row
from dpo_sweep.plan.rules import learning_config
from dpo_sweep.plan.runoff import timed_row
from dpo_sweep.records import StepRecord, TrialResult


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
class MeasureState:
    """The measure phase: the groups (by measurement_key; in full_grid by trial id), each
    configuration's group, and the memory model's calibration on the peaks measured so far."""

    groups: dict[str, Group]
    group_of: dict[str, str]  # trial id -> its group's key
    full_grid: bool = False  # every configuration its own group, run in full
    measurements: list[Measurement] = field(default_factory=list)
    calibration: Calibration = field(default_factory=lambda: calibrate([]))

    def of(self, cfg: TrialConfig) -> Group:
        return self.groups[self.group_of[cfg.trial_id]]

    def own_learning(self, cfg: TrialConfig) -> bool:
        """``cfg``'s own trial gives its stability columns: it ran in full, and (unless full_grid,
        where every row is its own) with exactly its set-up's learning steps and precision."""
        return self.of(cfg).ran_in_full(cfg) and (self.full_grid or learning_config(cfg) == cfg)

    def pending(self) -> list[Group]:
        return [g for g in self.groups.values() if g.state is GroupState.PENDING]

    def ongoing(self) -> bool:
        """A group is still to be measured or being measured."""
        return not all(g.ended for g in self.groups.values())


@dataclass
class LearnState:
    """The learn phase: each configuration's learning set-up and, by set-up, where its stability
    columns come from (None: nowhere, no configuration of it measured ok)."""

    key_of: dict[str, str]  # trial id -> learning_key
    learned: dict[str, LearningSource | None] = field(default_factory=dict)
    ran_out: dict[str, str] = field(default_factory=dict)  # learning_key -> why its learning precision did not fit


@dataclass
class RunoffState:
    """The runoff phase: this round's jobs still to start and, by (measurement_key, grad_acc),
    the step times given a runoff and the ok runoffs' results."""

    queue: list[Job] = field(default_factory=list)
    tried: set[tuple[str, int]] = field(default_factory=set)
    times: dict[tuple[str, int], TrialResult] = field(default_factory=dict)
    by_learning: set[tuple[str, int]] = field(default_factory=set)  # tried by a learning trial: no runoff's cost
    rounds: int = 0  # the runoff rounds begun

    def runoffs_run(self) -> int:
        """The runoff trials started (what the cap bounds): not the learning trials that timed a row."""
        return len(self.tried - self.by_learning)

    def mark(self, rows: list[TrialResult], group_of: dict[str, str]) -> None:
        """``rows``' (measurement_key, grad_acc) given their runoff now."""
        self.tried.update((group_of[r.trial_id], r.grad_acc) for r in rows)

@dataclass
class RowState:
    """The results rows handed out (``written``; ``pending``: their stability still to come) and
    what waits to be taken: step rows, new rows, console notes, rows rewritten since written."""

    written: set[str] = field(default_factory=set)
    pending: set[str] = field(default_factory=set)
    steps: list[StepRecord] = field(default_factory=list)
    rows: list[TrialResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    replaced: list[TrialResult] = field(default_factory=list)
