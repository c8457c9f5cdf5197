"""The measure phase of the sweep's plan (:mod:`~dpo_sweep.plan.schedule`): one memory/time
measurement per group of configurations that share a :func:`~dpo_sweep.plan.rules.measurement_key`,
cheapest predicted peak first, each run at :func:`~dpo_sweep.plan.rules.measure_grad_acc`
micro-steps; a group predicted over the budget, or dominating an OOM in memory, is pruned with its
rows. In full_grid every configuration is its own group, run in full in the space's order. Pure."""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Mapping, Sequence

from dpo_sweep.core.status import Status
from dpo_sweep.config import ModelSpec, TrialConfig
from dpo_sweep.plan.jobs import Due, Job, JobKind, without_eval
from dpo_sweep.plan.keys import TimingKey
from dpo_sweep.plan.levers import trainable_params
from dpo_sweep.plan.shape import ModelShape, model_shape
from dpo_sweep.plan.peaks import PeakModel
from dpo_sweep.plan.rules import (MemoryPosition, dedupe, learning_config, measure_grad_acc, memory_position,
                                  prune_after_oom)
from dpo_sweep.plan.state import Group, GroupState, Rows
from dpo_sweep.records import PENDING, StepRecord, TrialResult, failed_result


class MeasurePhase:
    """The groups (in the order of their measuring configurations' first appearance) and what
    each measurement gave; reads the peaks, writes the pruned groups' rows."""

    def __init__(self, trials: Sequence[TrialConfig], full_grid: bool, peaks: PeakModel, rows: Rows,
                 shapes: Mapping[ModelSpec, ModelShape]) -> None:
        self.full_grid = full_grid
        self._peaks, self._rows, self._shapes = peaks, rows, shapes
        self._order = {t.trial_id: i for i, t in enumerate(trials)}
        self._positions: dict[str, MemoryPosition] = {}
        self.cfgs = {t.trial_id: t for t in trials}
        if full_grid:
            self.groups = [Group(t, (t,)) for t in trials]
        else:
            self.groups = [Group(g.measuring, g.members) for g in dedupe(trials)]
        self._group_of = {m.trial_id: g for g in self.groups for m in g.members}

    def of(self, cfg: TrialConfig) -> Group:
        return self._group_of[cfg.trial_id]

    def timing_key(self, trial_id: str, grad_acc: int) -> TimingKey:
        """What one timing in full of ``trial_id``'s row at ``grad_acc`` serves."""
        return TimingKey(self._group_of[trial_id].measuring.trial_id, grad_acc)

    def own_learning(self, cfg: TrialConfig) -> bool:
        """``cfg``'s own trial gives its stability columns: it ran in full, and (unless full_grid,
        where every row is its own) with exactly its set-up's learning steps and precision."""
        return self.of(cfg).ran_in_full(cfg) and (self.full_grid or learning_config(cfg) == cfg)

    def pending(self) -> list[Group]:
        return [g for g in self.groups if g.state is GroupState.PENDING]

    def ongoing(self) -> bool:
        """A group is still to be measured or being measured."""
        return not all(g.ended for g in self.groups)

    def restore(self, rows: Sequence[TrialResult]) -> set[str]:
        """Take a resumed sweep's rows whose stability is still pending (:data:`PENDING`): a group
        whose every member has one is measured already. The trial ids of the rows taken."""
        saved = {r.trial_id: r for r in rows if r.status == Status.OK and r.stability == PENDING}
        taken: set[str] = set()
        for group in self.groups:
            if group.members and all(m.trial_id in saved for m in group.members):
                group.state, group.ran_grad_acc = GroupState.DONE, measure_grad_acc(group.measuring)
                group.result, group.saved = saved[group.measuring.trial_id], {m.trial_id: saved[m.trial_id]
                                                                               for m in group.members}
                group.predicted_gb = group.result.predicted_peak_gb
                taken.update(group.saved)
        return taken

    def next_job(self) -> Job | None:
        """The next group's measurement, cheapest predicted peak first; a group predicted over
        its budget is pruned on the way."""
        while pending := self.pending():
            group = self._cheapest(pending)
            group.predicted_gb = self._peaks.predict(group.measuring)
            reason = None if self.full_grid else self._peaks.over_budget(group.measuring)
            if reason:
                self._prune(group, reason)
                continue
            group.state = GroupState.RUNNING
            group.ran_grad_acc = group.measuring.grad_acc if self.full_grid else measure_grad_acc(group.measuring)
            cfg = group.measuring.model_copy(update={"grad_acc": group.ran_grad_acc})
            if not self.own_learning(group.measuring):  # its rows' stability comes from a learning trial
                cfg = without_eval(cfg)
            return Job.of(JobKind.MEASURE, group.measuring, cfg)
        return None

    def finish(self, job: Job, result: TrialResult, steps: Sequence[StepRecord]) -> None:
        group = self.of(job.source)
        group.state, group.result, group.steps = GroupState.DONE, result, tuple(steps)
        if result.status == Status.OK and math.isfinite(result.peak_mem_gb):
            self._peaks.add(job.cfg, result.peak_mem_gb)
        if result.status == Status.OOM and not self.full_grid:
            pending = {g.measuring.trial_id: g for g in self.pending()}
            for cfg, reason in prune_after_oom(job.cfg, [g.measuring for g in pending.values()]):
                self._prune(pending[cfg.trial_id], reason)

    def due(self) -> list[Due]:
        """The measurements still to start that are not predicted over their budget."""
        if self.full_grid:
            return [Due(g.measuring, JobKind.MEASURE, math.nan) for g in self.pending()]
        return [Due(cfg, JobKind.MEASURE, math.nan) for g in self.pending()
                if not self._peaks.over_budget(cfg := g.measuring.model_copy(
                    update={"grad_acc": measure_grad_acc(g.measuring)}))]

    def _cheapest(self, groups: list[Group]) -> Group:
        """The cheapest predicted peak of ``groups`` that needs more memory than none of the others
        (:func:`~dpo_sweep.plan.rules.dominates_in_memory`): the leaner of two such is measured first
        whatever a calibration fitted on noisy peaks predicts, since its OOM prunes the other and
        its fit leaves the other to measure anyway."""
        if self.full_grid:
            return groups[0]
        at = {g.measuring.trial_id: self._position(g.measuring) for g in groups}

        def leaner_exists(g: Group) -> bool:
            mine = at[g.measuring.trial_id]
            return any(mine.dominates(other) and not other.dominates(mine)
                       for tid, other in at.items() if tid != g.measuring.trial_id)

        def key(g: Group) -> tuple:
            gb = self._peaks.predict(g.measuring)
            return (math.isnan(gb), gb if not math.isnan(gb) else 0.0, self._order[g.measuring.trial_id])
        return min([g for g in groups if not leaner_exists(g)], key=key)

    def _position(self, cfg: TrialConfig) -> MemoryPosition:
        if (pos := self._positions.get(cfg.trial_id)) is None:
            pos = self._positions[cfg.trial_id] = memory_position(cfg)
        return pos

    def _prune(self, group: Group, reason: str) -> None:
        group.state = GroupState.PRUNED
        if math.isnan(group.predicted_gb):  # pruned after an OOM before it was next in line
            group.predicted_gb = self._peaks.predict(group.measuring)
        for m in group.members:
            row = failed_result(m, Status.PRUNED, reason)
            self._rows.emit(replace(row, predicted_peak_gb=group.predicted_gb,
                                    trainable_params=_trainable(m, self._shapes)))


def _trainable(cfg: TrialConfig, shapes: Mapping[ModelSpec, ModelShape]) -> int | None:
    """The parameters ``cfg`` would train (plan/levers.py), for a row that never built its model;
    None when the model's shape cannot be read here."""
    try:
        return trainable_params(cfg, model_shape(cfg.model, shapes))
    except (OSError, ValueError, KeyError):
        return None
