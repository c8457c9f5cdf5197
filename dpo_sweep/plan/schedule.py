"""The sweep's plan: which trials run, in what order, what is pruned, and each
configuration's results row once the trials it depends on are in. Pure: no Ray, no torch; the
Ray Tune ``Searcher`` (:mod:`dpo_sweep.sweep.planner`) only asks it for the next trial and tells
it what finished.

The story of a sweep, in three phases (:class:`~dpo_sweep.plan.jobs.JobKind`: each job says its
phase, and the configuration it runs for as its ``source``). Each phase is an object that owns its
state and picks its next job - :mod:`~dpo_sweep.plan.measure_phase`,
:mod:`~dpo_sweep.plan.learn_phase`, :mod:`~dpo_sweep.plan.runoff_phase` - over the calibrated
peaks (:mod:`~dpo_sweep.plan.peaks`); :class:`SweepPlan` asks them in turn, routes each ended
job to its phase, and hands out the rows (:mod:`~dpo_sweep.plan.state`):

1. Configurations that share a :func:`~dpo_sweep.plan.rules.measurement_key` form one group; the
   group's measuring configuration (the smallest grad_acc) runs as a **measure** trial under its
   own trial id, at :func:`~dpo_sweep.plan.rules.measure_grad_acc` micro-steps per optimizer step,
   without the held-batch evaluation (``train.evaluate``) unless it is its rows' learning trial too.
2. Groups start cheapest predicted peak first (the memory model, calibrated on every measured
   peak so far). A group predicted over the budget by more than the margin is ``pruned``; after
   an ``oom`` every pending group whose configuration dominates it in memory is ``pruned``,
   naming the trial that ran out.
3. Every member's row copies its group's memory columns and takes the step time at its own
   grad_acc (:mod:`dpo_sweep.plan.rows`).
4. Every ok row takes its loss-trajectory columns from one **learning** trial per
   :func:`~dpo_sweep.plan.rules.learning_key`, run as :func:`~dpo_sweep.plan.rules.learning_config`
   makes it (``train.learning_steps`` steps in ``train.learning_precision``): a configuration of
   that set-up that already ran in full with exactly those steps and precision when there is one,
   else, once its set-up's groups are in, ``<trial_id>-learning`` of the fastest measured ok
   configuration that the memory model says fits in the learning precision; when none fits, the
   fastest in the space's own precision, with a note (console and ``stability_note``). A row is
   handed out when its measurement ends, its stability columns ``pending``, and handed out again
   (:meth:`SweepPlan.take_replaced`) when its learning trial ends; a resumed sweep's pending rows
   (``measured``) are kept, and only their learning trial runs. A learning trial in its
   configuration's own precision and model runs that configuration at its real grad_acc: it
   times it in full (``Job.times_row``), so it runs before the runoff and in place of that
   configuration's runoff. Learning trials and runoffs run no worst-case step (no row takes
   their peak), and each says as it starts what it costs and why.

5. The **runoff** (:mod:`~dpo_sweep.plan.runoff`): once every group is measured, the rows the
   recommendation would weigh - fitting the budget, their throughput tied within its p10-p90
   noise with the fastest's - whose step time was extrapolated are timed in full at their own
   grad_acc as ``<trial_id>-runoff`` (at most ``RUNOFF_MAX``); so are the extrapolated rows of a
   frontier decided by such a tie (a leaner row's interval reaching a row's own). Round after
   round, each reading the times the last one brought, until nothing is left to settle or
   ``runoff_cap`` runoffs have run. Their rows take that time (``step_time_source: runoff``,
   ``timed_by``), rewritten in results.csv if already written.

``full_grid``: every configuration is its own measure trial at its real grad_acc with its own
steps and precision, in the space's order; nothing is pruned, shared or extrapolated.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

from dpo_sweep.core.status import Status
from dpo_sweep.config import ModelSpec, TrialConfig
from dpo_sweep.plan.jobs import Due, Job, JobKind
from dpo_sweep.plan.learn_phase import LearnPhase
from dpo_sweep.plan.measure_phase import MeasurePhase
from dpo_sweep.plan.shape import ModelShape
from dpo_sweep.plan.peaks import DataEstimate, Estimator, PeakModel
from dpo_sweep.plan.rows import LearningSource, pending_stability, with_stability
from dpo_sweep.plan.rules import BUDGET_MARGIN, learning_config
from dpo_sweep.plan.runoff_phase import RunoffPhase
from dpo_sweep.plan.state import Group, GroupState, Rows
from dpo_sweep.records import StepRecord, TrialResult
from dpo_sweep.core.lengths import LengthProfile

__all__ = ["DataEstimate", "Estimator", "SweepPlan"]


class SweepPlan:
    """The planner over one sweep's configurations (see the module doc): the three phases, the
    jobs running, the rows handed out.

    ``next_job()`` -> the next :class:`Job` to start, or None (wait while :meth:`running`, else
    the sweep is over); ``finish(job_id, result, steps)`` when a job's trial ended;
    ``take_output()`` -> the step rows and results rows ready to append since the last call;
    ``take_notes()`` -> the console lines the plan has to say since the last call.
    """

    def __init__(self, trials: Sequence[TrialConfig], *, budget_gb: float | None = None,
                 full_grid: bool = False, estimate: Estimator | None = None,
                 lengths: Mapping[str, LengthProfile | None] | None = None,
                 shapes: Mapping[ModelSpec, ModelShape] | None = None,
                 margin: float = BUDGET_MARGIN, measured: Sequence[TrialResult] = ()) -> None:
        """``estimate``: the memory model (default: :class:`DataEstimate` over ``lengths``, the
        data's lengths by trial id; ``lengths`` is only for that default). ``shapes``: the models'
        shapes built elsewhere (the memory model's and the trainable-parameter count's; the rest
        are built here). ``measured``: rows a resumed sweep already wrote whose stability is still
        pending (:data:`~dpo_sweep.records.PENDING`): a group whose every member has one is not
        measured again, only learned."""
        if estimate is not None and lengths is not None:
            raise ValueError("SweepPlan: give the data's lengths or an estimator, not both")
        self.full_grid = full_grid
        shapes = shapes or {}
        self._cfgs = {t.trial_id: t for t in trials}
        self._rows = Rows()
        self._peaks = PeakModel(estimate or DataEstimate(lengths or {}, shapes), budget_gb, margin)
        self._measure = MeasurePhase(trials, full_grid, self._peaks, self._rows, shapes)
        self._runoff = RunoffPhase(self._measure, self._peaks, self._rows)
        self._learn = LearnPhase(trials, self._measure, self._runoff, self._peaks, self._rows)
        self._running: dict[str, Job] = {}
        restored = self._measure.restore(measured)
        self._rows.written.update(restored)
        self._rows.pending.update(restored)

    def summary_line(self) -> str:
        """What the sweep will do, before it starts."""
        if self.full_grid:
            return f"planner off (--full-grid): {len(self._cfgs)} configuration(s), each run in full"
        groups = self._measure.groups
        budgets = {self.budget_of(g.measuring) for g in groups} - {None}
        learning = dict.fromkeys(f"{c.train.steps} steps in {c.train.precision}"
                                 for c in map(learning_config, self._cfgs.values()))
        return (f"planner: {len(self._cfgs)} configuration(s) share {len(groups)} memory/time "
                f"measurement(s), cheapest predicted peak first; over-budget pruning "
                + (f"against {', '.join(f'{b:.1f}' for b in sorted(budgets))} GB" if budgets else "off (no budget known)")
                + f"; learning trials of {' or '.join(learning)} (train.learning_steps, learning_precision)")

    # --- what the Searcher asks -------------------------------------------------------------

    def next_job(self) -> Job | None:
        # A learning trial in the rows' own precision runs before the runoff: it times its
        # configuration in full at the real effective batch, which that configuration's runoff would.
        timing = any(j.kind is JobKind.RUNOFF or j.times_row for j in self._running.values())
        job = (self._measure.next_job() or self._next_learning(timing=True)
               or self._runoff.next_job(busy=timing) or self._next_learning())
        if job is not None:
            self._running[job.job_id] = job
        self._emit_ready()
        return job

    def running(self) -> bool:
        """A job has started and not finished (``next_job()`` None then means: wait for it)."""
        return bool(self._running)

    def job(self, job_id: str) -> Job:
        return self._running[job_id]

    def finish(self, job_id: str, result: TrialResult, steps: Sequence[StepRecord]) -> None:
        job = self._running.pop(job_id)
        self._rows.steps.extend(steps)
        if job.kind is JobKind.LEARN:
            if self._learn.finish(job, result) and job.times_row:
                if result.status == Status.OK:
                    self._take_full_time(job, result)
                else:  # a runoff may time it yet
                    self._runoff.release(self._runoff.key(job.source))
        elif job.kind is JobKind.RUNOFF:
            if result.status == Status.OK:
                self._take_full_time(job, result)
            else:
                self._rows.note(f"runoff: {job.job_id} {result.status}; its rows keep the extrapolated step time")
        else:
            self._measure.finish(job, result, steps)
        self._emit_ready()

    def take_output(self) -> tuple[list[StepRecord], list[TrialResult]]:
        steps, rows = self._rows.steps, self._rows.rows
        self._rows.steps, self._rows.rows = [], []
        return steps, rows

    def take_replaced(self) -> list[TrialResult]:
        """Rows already handed out by :meth:`take_output` whose numbers changed since (a runoff
        timed them in full, their learning trial ended): to rewrite in results.csv, each once."""
        rows, self._rows.replaced = self._rows.replaced, []
        return list({r.trial_id: r for r in rows}.values())

    def take_notes(self) -> list[str]:
        notes, self._rows.notes = self._rows.notes, []
        return notes

    def unwritten(self) -> list[str]:
        """Configurations without a results row yet, in the space's order."""
        return [t for t in self._cfgs if t not in self._rows.written]

    def unfinished(self) -> list[str]:
        """Configurations whose row is not final yet: not written, or written with its stability
        still pending (its learning trial has not ended), in the space's order."""
        return [t for t in self._cfgs if not self._rows.final(t)]

    def trials_due(self) -> list[Due]:
        """The trials still to start, as far as the plan knows them now (the recorder's estimate
        of what is left): the pending measurements not predicted over their budget, one learning
        trial per set-up whose rows wait for one, and the runoffs - the queued ones once the runoff
        phase has begun (a later round is known only when this one has ended); before it, the first
        round that the rows measured so far would call for, less the configurations their learning
        trials will time. Each with its step time when a measurement gives it."""
        due = self._measure.due()
        if self.full_grid:
            return due
        learning = self._learn.due()
        due += [Due(j.cfg, JobKind.LEARN, self._runoff.step_ms(j.source)) for j in learning]
        return due + self._runoff.due(timed={j.source.trial_id for j in learning if j.times_row})

    def running_due(self) -> dict[str, Due]:
        """The running jobs by job id, each with its step time when a measurement gives it."""
        return {jid: Due(j.cfg, j.kind, math.nan if j.kind is JobKind.MEASURE else self._runoff.step_ms(j.source))
                for jid, j in self._running.items()}

    def restored(self) -> set[str]:
        """The configurations whose rows a resumed sweep kept (``measured``): only learned now."""
        return {t for g in self._measure.groups for t in g.saved}

    def groups(self) -> list[Group]:
        """The measurement groups, in the order of their measuring configurations in the space."""
        return list(self._measure.groups)

    def predict(self, cfg: TrialConfig) -> float:
        """The calibrated predicted peak (GB); NaN when the model's config cannot be read here."""
        return self._peaks.predict(cfg)

    def budget_of(self, cfg: TrialConfig) -> float | None:
        """What bounds the peak (see :meth:`PeakModel.budget_of`)."""
        return self._peaks.budget_of(cfg)

    def over_budget(self, cfg: TrialConfig) -> str | None:
        """Why ``cfg`` is pruned before it runs, or None (see rules.prune_over_budget)."""
        return self._peaks.over_budget(cfg)

    # --- between the phases -------------------------------------------------------------------

    def _next_learning(self, timing: bool = False) -> Job | None:
        """The learn phase's next job; one that times its configuration claims that timing from
        the runoff phase."""
        job = self._learn.next_job(timing)
        if job is not None and job.times_row:
            self._runoff.claim(self._runoff.key(job.source), by_learning=True)
        return job

    def _take_full_time(self, job: Job, result: TrialResult) -> None:
        """``job`` (a runoff, or a learning trial that timed its configuration) measured its
        source's step time in full: its group's rows at that grad_acc take it, rewritten if written."""
        src = job.source
        before = self._runoff.time_row(src)
        self._runoff.record(self._runoff.key(src), result)
        timed = "" if job.kind is JobKind.RUNOFF else f" timed {src.trial_id}:"
        self._rows.note(f"{job.kind}: {job.job_id}{timed} {result.step_time_ms:.0f} ms per step in full "
                        f"(extrapolated {before.step_time_ms:.0f} ms)")
        for m in self._measure.of(src).members:
            if m.grad_acc == src.grad_acc and m.trial_id in self._rows.written and (row := self._row_of(m)):
                self._rows.replaced.append(row)

    def _row_of(self, m: TrialConfig) -> TrialResult:
        """``m``'s results row; while its learning trial is still to come, with its stability
        columns pending (:func:`~dpo_sweep.plan.rows.pending_stability`)."""
        row = self._runoff.time_row(m)
        if row.status != Status.OK:
            return row
        if self._measure.own_learning(m):
            return with_stability(row, LearningSource.of(m, row))
        if (set_up := self._learn.of(m)).decided:
            return with_stability(row, set_up.source)
        return pending_stability(row)

    def _emit_ready(self) -> None:
        for group in self._measure.groups:
            if group.state is not GroupState.DONE:
                continue
            for m in group.members:
                if m.trial_id not in self._rows.written:
                    self._rows.emit(self._row_of(m))
                elif m.trial_id in self._rows.pending and self._learn.of(m).decided:
                    self._rows.replaced.append(self._row_of(m))  # its learning trial ended
                    self._rows.pending.discard(m.trial_id)
