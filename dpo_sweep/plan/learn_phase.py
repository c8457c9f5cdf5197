"""The learn phase of the sweep's plan (:mod:`~dpo_sweep.plan.schedule`): one learning trial per
set-up - the configurations that share a :func:`~dpo_sweep.plan.rules.learning_key` - whose loss
trajectory gives every row of the set-up its stability columns. Once the set-up's groups are
measured, the trial is a configuration that already ran in full with exactly the learning steps
and precision when there is one (nothing to run), else ``<trial_id>-learning`` of the fastest
measured ok configuration whose learning configuration fits, else of the fastest in the space's
precision, with a note. A learning trial in its configuration's own precision and model times
that configuration in full too (``Job.times_row``), in place of its runoff. Pure."""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass, replace
from typing import Sequence

from dpo_sweep.core.status import Status
from dpo_sweep.config import TrialConfig
from dpo_sweep.plan.jobs import Job, JobKind, job_id, seconds, without_worst_case
from dpo_sweep.plan.keys import LearningKey
from dpo_sweep.plan.measure_phase import MeasurePhase
from dpo_sweep.plan.peaks import PeakModel
from dpo_sweep.plan.rows import LearningSource
from dpo_sweep.plan.rules import learning_config, learning_key, pick_learning_trial
from dpo_sweep.plan.runoff_phase import RunoffPhase
from dpo_sweep.plan.state import Rows
from dpo_sweep.records import TrialResult


class Learning(enum.Enum):
    """Where a set-up's stability columns are."""

    PENDING = "pending"  # still to come: its configurations are being measured, or its trial to run
    RUNNING = "running"  # its learning trial runs
    LEARNED = "learned"  # from its ``source``
    NONE = "none"        # nowhere: no configuration of it measured ok


@dataclass(eq=False)  # one object per set-up, hashed by identity
class SetUp:
    """The configurations of one learning set-up (in the space's order) and its learning."""

    key: LearningKey
    members: list[TrialConfig]
    state: Learning = Learning.PENDING
    source: LearningSource | None = None  # LEARNED: the trial its rows take their stability from
    ran_out: str = ""  # why its learning precision did not fit, once a learning trial ran out in it

    @property
    def decided(self) -> bool:
        return self.state in (Learning.LEARNED, Learning.NONE)


class LearnPhase:
    """The set-ups, in order of first appearance; reads the measurements, the step times as they
    stand (the runoff phase's) and the budget, writes its notes."""

    def __init__(self, trials: Sequence[TrialConfig], measure: MeasurePhase, runoff: RunoffPhase,
                 peaks: PeakModel, rows: Rows) -> None:
        self._measure, self._runoff, self._peaks, self._rows = measure, runoff, peaks, rows
        self._trials = list(trials)
        set_ups: dict[LearningKey, SetUp] = {}
        for t in trials:
            key = learning_key(t)
            set_ups.setdefault(key, SetUp(key, [])).members.append(t)
        self.set_ups = list(set_ups.values())
        self._set_up_of = {m.trial_id: s for s in self.set_ups for m in s.members}

    def of(self, cfg: TrialConfig) -> SetUp:
        return self._set_up_of[cfg.trial_id]

    def next_job(self, timing: bool = False) -> Job | None:
        """The next learning trial of a set-up whose rows wait for one, once all its
        configurations are measured; ``timing``: only one that also times its configuration in
        full (:meth:`_times_its_row`), which runs before the runoff. Marks on the way the set-ups
        whose stability needs no trial (a configuration ran it in full) or has none."""
        needing = {self.of(t) for t in self._trials if not self._rows.final(t.trial_id)}
        for set_up in self.set_ups:
            if set_up not in needing or set_up.state is not Learning.PENDING:
                continue
            groups = [self._measure.of(c) for c in set_up.members]
            if not all(g.ended for g in groups):
                continue  # pick the fastest once every configuration of the set-up is measured
            ok = [c for c, g in zip(set_up.members, groups) if g.measured_ok]
            full = [c for c in ok if self._measure.own_learning(c)]
            if full:
                set_up.state = Learning.LEARNED
                set_up.source = LearningSource.of(full[0], self._measure.of(full[0]).result)
                continue
            if not ok:
                set_up.state = Learning.NONE
                continue
            job = self._learning_job(ok, set_up)
            if timing and not job.times_row:
                continue
            self._hand_out(job, set_up)
            return job
        return None

    def due(self) -> list[Job]:
        """The learning trial each set-up's written rows still wait for, not started yet: the one the
        plan will run when every configuration of the set-up is measured, else as it would run on
        what is measured so far (the fastest measured ok configuration; the first pending one when
        none is)."""
        due: dict[SetUp, Job] = {}
        for t in self._trials:
            set_up = self.of(t)
            if (self._rows.final(t.trial_id) or set_up.state is not Learning.PENDING or set_up in due
                    or self._measure.own_learning(t)):
                continue
            ok = [c for c in set_up.members if self._measure.of(c).measured_ok]
            job = self._learning_job(ok, set_up) if ok else None
            if job is None:
                job = Job.of(JobKind.LEARN, t, without_worst_case(learning_config(t)))
            due[set_up] = job
        return list(due.values())

    def finish(self, job: Job, result: TrialResult) -> bool:
        """``job`` ended: its set-up learned from it (True), or, when it ran out of memory in the
        learning precision, waits to learn in the space's precision (False)."""
        set_up = self.of(job.source)
        if result.status == Status.OOM and job.cfg.train.precision != job.source.train.precision:
            # The memory model under-predicted the learning precision (it can by up to 6.8 %): learn
            # in the space's precision instead, as when it is predicted not to fit.
            set_up.state, set_up.ran_out = Learning.PENDING, f"{job.job_id} ran out of memory"
            return False
        set_up.state, set_up.source = Learning.LEARNED, LearningSource.of(job.cfg, result, job.note)
        return True

    def _over_budget(self, cfg: TrialConfig) -> str | None:
        """Why ``learning_config(cfg)`` is predicted not to fit, or None. A learning trial in the
        measured precision fits: only its steps differ, and the peak does not grow with them."""
        lcfg = learning_config(cfg)
        if (lcfg.train.precision, lcfg.model) == (cfg.train.precision, cfg.model):
            return None
        return self._peaks.over_budget(lcfg)

    def _learning_job(self, ok: list[TrialConfig], set_up: SetUp) -> Job:
        """The learning trial of a set-up whose measured ok configurations are ``ok`` (not empty):
        the fastest (by the step time its row has now: a runoff's over an extrapolation) whose
        learning configuration fits, else the fastest in the space's precision, with its note.
        Pure: nothing is marked or said (:meth:`_hand_out` does)."""
        def fastest(cfgs: list[TrialConfig]) -> TrialConfig | None:
            return pick_learning_trial(cfgs, predict=lambda _c: 0.0, budget_gb=math.inf, step_ms=self._runoff.step_ms)

        ran_out = set_up.ran_out
        reasons = {c.trial_id: ran_out or self._over_budget(c) for c in ok}
        note = ""
        if (pick := fastest([c for c in ok if reasons[c.trial_id] is None])) is not None:
            cfg, variant = learning_config(pick), ""
        else:
            pick = fastest(ok)
            cfg = learning_config(pick, precision=pick.train.precision)
            variant = cfg.train.precision if ran_out else ""
            wanted = pick.train.learning_precision_resolved()
            why = ran_out or (f"no configuration of its set-up fits (it would have been {pick.trial_id}, "
                              f"{reasons[pick.trial_id].removeprefix('pruned: ')})")
            note = (f"learning trial {job_id(JobKind.LEARN, pick, variant)} runs in {cfg.train.precision}, the space's precision: in {wanted} {why}")
        job = Job.of(JobKind.LEARN, pick, without_worst_case(cfg), note=note, variant=variant)
        return replace(job, times_row=self._times_its_row(job))

    def _times_its_row(self, job: Job) -> bool:
        """A learning trial times its configuration in full, as its runoff would: it runs in that
        configuration's precision and model (only its steps, warm-up and evaluation differ, none of
        which a step's time depends on), whose row's step time is extrapolated and not timed yet."""
        src = job.source
        return ((job.cfg.train.precision, job.cfg.model) == (src.train.precision, src.model)
                and self._runoff.needs_timing(src))

    def _hand_out(self, job: Job, set_up: SetUp) -> None:
        """Mark ``set_up`` running and say what ``job`` costs and why."""
        set_up.state = Learning.RUNNING
        if job.note:
            self._rows.note(f"note: {job.note}")
        steps, ms = job.cfg.train.steps, self._runoff.step_ms(job.source)
        cost = f", ~{seconds(steps * ms / 1e3)} of steps at {seconds(ms / 1e3)} each" if math.isfinite(ms) else ""
        line = (f"learning: {job.job_id} runs {steps} steps at grad_acc {job.cfg.grad_acc}{cost}: a stability "
                f"verdict needs {steps} steps at the real effective batch ({job.cfg.effective_batch()} pairs)")
        if job.times_row:
            line += f"; it times {job.source.trial_id} in full too, in place of a runoff"
        self._rows.note(line)
