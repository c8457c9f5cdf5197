"""The sweep's plan: which trials run, in what order, what is pruned, and each
configuration's results row once the trials it depends on are in. Pure: no Ray, no torch; the
Ray Tune ``Searcher`` (:mod:`dpo_sweep.sweep.planner`) only asks it for the next trial and tells
it what finished.

The story of a sweep, in three phases (:class:`~dpo_sweep.plan.jobs.JobKind`: each job says its
phase, and the configuration it runs for as its ``source``; the state of each phase is an object
of :mod:`~dpo_sweep.plan.state`):

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
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, Sequence

from dpo_sweep.core import budget
from dpo_sweep.config import ModelSpec, TrialConfig
from dpo_sweep.core.status import Status, TimeSource
from dpo_sweep.plan.calibrate import Measurement, calibrate, predicted
from dpo_sweep.plan.jobs import Due, Job, JobKind, job_id, without_eval, without_worst_case
from dpo_sweep.plan.levers import trainable_params
from dpo_sweep.plan.memory import MemoryEstimate, ModelShape, model_shape, predict_peak_gb
from dpo_sweep.plan.rows import LearningSource, pending_stability, with_stability
from dpo_sweep.plan.runoff import RUNOFF_MAX, RUNOFF_SAFETY_MARGIN, finalists, frontier_ties, runoff_cap
from dpo_sweep.core.trial_facts import planned_device
from dpo_sweep.plan.rules import (BUDGET_MARGIN, budgeted_gb, dedupe, learning_config, learning_key,
                                  measure_grad_acc, measurement_key, pick_learning_trial, prune_after_oom,
                                  prune_over_budget)
from dpo_sweep.plan.state import Group, GroupState, LearnState, MeasureState, RowState, RunoffState
from dpo_sweep.records import PENDING, StepRecord, TrialResult, failed_result
from dpo_sweep.core.lengths import LengthProfile

Estimator = Callable[[TrialConfig], MemoryEstimate]


@dataclass(frozen=True)
class DataEstimate:
    """The memory model over each configuration's own data: the lengths preflight measured, by
    trial id (``preflight.lengths_by_trial``), so that the plan orders, prunes and calibrates on
    the worst micro-batch the trial will run - what ``validate`` prints - not on every sequence
    at max_length. A trial without lengths is sized at max_length. ``shapes``: the models' shapes
    the preflight built (``startup.model_shapes``); a model without one is built here. A class,
    not a closure: the plan travels with the recorder, which Tune pickles."""

    lengths: Mapping[str, LengthProfile | None] = field(default_factory=dict)
    shapes: Mapping[ModelSpec, ModelShape] = field(default_factory=dict)

    def __call__(self, cfg: TrialConfig) -> MemoryEstimate:
        return predict_peak_gb(cfg, device=planned_device(cfg), lengths=self.lengths.get(cfg.trial_id),
                               shape=model_shape(cfg.model, self.shapes))


class SweepPlan:
    """The planner's state over one sweep's configurations (see the module doc).

    ``next_job()`` -> the next :class:`Job` to start, or None (wait while :meth:`running`, else
    the sweep is over); ``finish(job_id, result, steps)`` when a job's trial ended;
    ``take_output()`` -> the step rows and results rows ready to append since the last call;
    ``take_notes()`` -> the console lines the plan has to say since the last call. Its state is
    one object per phase (measure, learn, runoff) and the rows handed out.
    """

    def __init__(self, trials: Sequence[TrialConfig], *, budget_gb: float | None = None,
                 full_grid: bool = False, estimate: Estimator | None = None,
                 lengths: Mapping[str, LengthProfile | None] | None = None,
                 shapes: Mapping[ModelSpec, ModelShape] | None = None,
                 margin: float = BUDGET_MARGIN, measured: Sequence[TrialResult] = ()) -> None:
        """``estimate``: the memory model (default: :class:`DataEstimate` over ``lengths``, the
        data's lengths by trial id; ``lengths`` is only for that default). ``shapes``: the models'
        shapes built elsewhere (the memory model's and the trainable-parameter count's; the rest
        are built here). ``measured``: rows a
        resumed sweep already wrote whose stability is still pending (:data:`PENDING`): a group
        whose every member has one is not measured again, only learned."""
        if estimate is not None and lengths is not None:
            raise ValueError("SweepPlan: give the data's lengths or an estimator, not both")
        self.full_grid = full_grid
        self.budget_gb = budget_gb
        self.margin = margin
        self._shapes = shapes or {}
        self._estimate = estimate or DataEstimate(lengths or {}, self._shapes)
        self._order = {t.trial_id: i for i, t in enumerate(trials)}
        self._cfgs = {t.trial_id: t for t in trials}
        if full_grid:
            groups = {t.trial_id: Group(t, (t,)) for t in trials}
        else:
            groups = {measurement_key(g.measuring): Group(g.measuring, g.members) for g in dedupe(trials)}
        self._measure = MeasureState(groups, {m.trial_id: key for key, g in groups.items() for m in g.members},
                                     full_grid)
        self._learn = LearnState({t.trial_id: learning_key(t) for t in trials})
        self._runoff = RunoffState()
        self._running: dict[str, Job] = {}
        self._out = RowState()
        self._restore(measured)

    def summary_line(self) -> str:
        """What the sweep will do, before it starts."""
        if self.full_grid:
            return f"planner off (--full-grid): {len(self._order)} configuration(s), each run in full"
        groups = self._measure.groups
        budgets = {self.budget_of(g.measuring) for g in groups.values()} - {None}
        learning = dict.fromkeys(f"{c.train.steps} steps in {c.train.precision}"
                                 for c in map(learning_config, self._cfgs.values()))
        return (f"planner: {len(self._order)} configuration(s) share {len(groups)} memory/time "
                f"measurement(s), cheapest predicted peak first; over-budget pruning "
                + (f"against {', '.join(f'{b:.1f}' for b in sorted(budgets))} GB" if budgets else "off (no budget known)")
                + f"; learning trials of {' or '.join(learning)} (train.learning_steps, learning_precision)")

    # --- what the Searcher asks -------------------------------------------------------------

    def next_job(self) -> Job | None:
        # A learning trial in the rows' own precision runs before the runoff: it times its
        # configuration in full at the real effective batch, which that configuration's runoff would.
        job = (self._next_measurement() or self._next_learning(timing=True) or self._next_runoff()
               or self._next_learning())
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
        self._out.steps.extend(steps)
        if job.kind is JobKind.LEARN:
            self._finish_learning(job, result)
        elif job.kind is JobKind.RUNOFF:
            self._finish_runoff(job, result)
        else:
            self._finish_measurement(job, result, steps)
        self._emit_ready()

    def take_output(self) -> tuple[list[StepRecord], list[TrialResult]]:
        steps, rows = self._out.steps, self._out.rows
        self._out.steps, self._out.rows = [], []
        return steps, rows

    def take_replaced(self) -> list[TrialResult]:
        """Rows already handed out by :meth:`take_output` whose numbers changed since (a runoff
        timed them in full, their learning trial ended): to rewrite in results.csv, each once."""
        rows, self._out.replaced = self._out.replaced, []
        return list({r.trial_id: r for r in rows}.values())

    def take_notes(self) -> list[str]:
        notes, self._out.notes = self._out.notes, []
        return notes

    def unwritten(self) -> list[str]:
        """Configurations without a results row yet, in the space's order."""
        return [t for t in self._order if t not in self._out.written]

    def unfinished(self) -> list[str]:
        """Configurations whose row is not final yet: not written, or written with its stability
        still pending (its learning trial has not ended), in the space's order."""
        return [t for t in self._order if t not in self._out.written or t in self._out.pending]

    def trials_due(self) -> list[Due]:
        """The trials still to start, as far as the plan knows them now (the recorder's estimate
        of what is left): the pending measurements not predicted over their budget, one learning
        trial per set-up whose rows wait for one, and the runoffs - the queued ones once the runoff
        phase has begun (a later round is known only when this one has ended); before it, the first
        round that the rows measured so far would call for, less the configurations their learning
        trials will time. Each with its step time when a measurement gives it."""
        if self.full_grid:
            return [Due(g.measuring, JobKind.MEASURE, math.nan) for g in self._measure.pending()]
        due = [Due(cfg, JobKind.MEASURE, math.nan) for g in self._measure.pending()
               if not self.over_budget(cfg := g.measuring.model_copy(update={"grad_acc": measure_grad_acc(g.measuring)}))]
        learning = self._learning_due()
        due += [Due(j.cfg, JobKind.LEARN, self._known_step_ms(j.source)) for j in learning]
        if self._runoff.rounds:
            runoffs = [j.source for j in self._runoff.queue]
        else:
            timed = {j.source.trial_id for j in learning if j.times_row}
            leaders, edges = self._runoff_picks()
            runoffs = [self._cfgs[r.trial_id] for r in leaders + edges if r.trial_id not in timed]
        return due + [Due(self._runoff_job(c).cfg, JobKind.RUNOFF, self._known_step_ms(c)) for c in runoffs]

    def running_due(self) -> dict[str, Due]:
        """The running jobs by job id, each with its step time when a measurement gives it."""
        return {jid: Due(j.cfg, j.kind, math.nan if j.kind is JobKind.MEASURE else self._known_step_ms(j.source))
                for jid, j in self._running.items()}

    def _learning_due(self) -> list[Job]:
        """The learning trial each set-up's written rows still wait for, not started yet: the one the
        plan will run when every configuration of the set-up is measured, else as it would run on
        what is measured so far (the fastest measured ok configuration; the first pending one when
        none is)."""
        running = {j.key for j in self._running_of(JobKind.LEARN)}
        due: dict[str, Job] = {}
        for t in self.unfinished():
            lkey = self._learn.key_of[t]
            if lkey in self._learn.learned or lkey in running or lkey in due or self._measure.own_learning(self._cfgs[t]):
                continue
            cfgs = [self._cfgs[c] for c, k in self._learn.key_of.items() if k == lkey]
            ok = [c for c in cfgs if self._measure.of(c).measured_ok]
            job = self._learning_job(ok, lkey) if ok else None
            if job is None:
                cfg = self._cfgs[t]
                job = Job.of(JobKind.LEARN, cfg, without_worst_case(learning_config(cfg)), lkey)
            due[lkey] = job
        return list(due.values())

    def _known_step_ms(self, cfg: TrialConfig) -> float:
        """``cfg``'s step time as its row has it now (runoff over extrapolated); NaN when its group
        is not measured ok yet."""
        group = self._measure.of(cfg)
        return self._time_row(cfg, group).step_time_ms if group.measured_ok else math.nan

    def restored(self) -> set[str]:
        """The configurations whose rows a resumed sweep kept (``measured``): only learned now."""
        return {t for g in self._measure.groups.values() for t in g.saved}

    def groups(self) -> list[Group]:
        """The measurement groups, in the order of their measuring configurations in the space."""
        return list(self._measure.groups.values())

    def _running_of(self, kind: JobKind) -> list[Job]:
        return [j for j in self._running.values() if j.kind is kind]

    def _restore(self, rows: Sequence[TrialResult]) -> None:
        saved = {r.trial_id: r for r in rows if r.status == Status.OK and r.stability == PENDING}
        for group in self._measure.groups.values():
            if group.members and all(m.trial_id in saved for m in group.members):
                group.state, group.ran_grad_acc = GroupState.DONE, measure_grad_acc(group.measuring)
                group.result, group.saved = saved[group.measuring.trial_id], {m.trial_id: saved[m.trial_id]
                                                                               for m in group.members}
                group.predicted_gb = group.result.predicted_peak_gb
                self._out.written.update(group.saved)
                self._out.pending.update(group.saved)

    def predict(self, cfg: TrialConfig) -> float:
        """The calibrated predicted peak (GB); NaN when the model's config cannot be read here."""
        try:
            return predicted(self._measure.calibration, cfg, self._estimate)
        except (OSError, ValueError, KeyError):
            return math.nan

    # --- the measure phase -------------------------------------------------------------------

    def _cheapest(self, groups: list[Group]) -> Group:
        if self.full_grid:
            return groups[0]

        def key(g: Group) -> tuple:
            gb = self.predict(g.measuring)
            return (math.isnan(gb), gb if not math.isnan(gb) else 0.0, self._order[g.measuring.trial_id])
        return min(groups, key=key)

    def _next_measurement(self) -> Job | None:
        while pending := self._measure.pending():
            group = self._cheapest(pending)
            group.predicted_gb = self.predict(group.measuring)
            reason = None if self.full_grid else self.over_budget(group.measuring)
            if reason:
                self._prune(group, reason)
                continue
            group.state = GroupState.RUNNING
            group.ran_grad_acc = group.measuring.grad_acc if self.full_grid else measure_grad_acc(group.measuring)
            cfg = group.measuring.model_copy(update={"grad_acc": group.ran_grad_acc})
            if not self._measure.own_learning(group.measuring):  # its rows' stability comes from a learning trial
                cfg = without_eval(cfg)
            return Job.of(JobKind.MEASURE, group.measuring, cfg, self._measure.group_of[cfg.trial_id])
        return None

    def _finish_measurement(self, job: Job, result: TrialResult, steps: Sequence[StepRecord]) -> None:
        group = self._measure.groups[job.key]
        group.state, group.result, group.steps = GroupState.DONE, result, tuple(steps)
        if result.status == Status.OK and math.isfinite(result.peak_mem_gb):
            self._measure.measurements.append(Measurement(job.cfg, result.peak_mem_gb))
            self._measure.calibration = calibrate(self._measure.measurements, self._estimate)
        if result.status == Status.OOM and not self.full_grid:
            self._prune_after(job.cfg)

    def budget_of(self, cfg: TrialConfig) -> float | None:
        """What bounds the peak: the emulated card (resources.gpu_memory_gb), else the GPU's
        memory the sweep was given; None (no pruning over budget) when neither is known."""
        return cfg.resources.gpu_memory_gb or self.budget_gb

    def over_budget(self, cfg: TrialConfig) -> str | None:
        """Why ``cfg`` is pruned before it runs, or None (see rules.prune_over_budget)."""
        budget = self.budget_of(cfg)
        gb = self.predict(cfg)
        if budget is None or math.isnan(gb):
            return None
        est = self._estimate(cfg)
        return prune_over_budget(cfg, gb, budget, self.margin, uncapped_gb=est.total_gb - budgeted_gb(cfg, est))

    def _prune_after(self, oom_cfg: TrialConfig) -> None:
        pending = {g.measuring.trial_id: g for g in self._measure.pending()}
        for cfg, reason in prune_after_oom(oom_cfg, [g.measuring for g in pending.values()]):
            self._prune(pending[cfg.trial_id], reason)

    def _prune(self, group: Group, reason: str) -> None:
        group.state = GroupState.PRUNED
        if math.isnan(group.predicted_gb):  # pruned after an OOM before it was next in line
            group.predicted_gb = self.predict(group.measuring)
        for m in group.members:
            row = failed_result(m, Status.PRUNED, reason)
            self._emit(replace(row, predicted_peak_gb=group.predicted_gb, trainable_params=_trainable(m, self._shapes)))

    # --- the learn phase ---------------------------------------------------------------------

    def _learning_over_budget(self, cfg: TrialConfig) -> str | None:
        """Why ``learning_config(cfg)`` is predicted not to fit, or None. A learning trial in the
        measured precision fits: only its steps differ, and the peak does not grow with them."""
        lcfg = learning_config(cfg)
        if (lcfg.train.precision, lcfg.model) == (cfg.train.precision, cfg.model):
            return None
        return self.over_budget(lcfg)

    def _next_learning(self, timing: bool = False) -> Job | None:
        """The next learning trial; ``timing``: only one that also times its configuration in full
        (:meth:`_times_its_row`), which runs before the runoff."""
        needing = {self._learn.key_of[t] for t in self.unfinished()}
        running = {j.key for j in self._running_of(JobKind.LEARN)}
        for lkey in dict.fromkeys(self._learn.key_of.values()):
            if lkey not in needing or lkey in self._learn.learned or lkey in running:
                continue
            cfgs = [self._cfgs[t] for t, k in self._learn.key_of.items() if k == lkey]
            groups = [self._measure.of(c) for c in cfgs]
            if not all(g.ended for g in groups):
                continue  # pick the fastest once every configuration of the set-up is measured
            ok = [c for c, g in zip(cfgs, groups) if g.measured_ok]
            full = [c for c in ok if self._measure.own_learning(c)]
            if full:
                self._learn.learned[lkey] = LearningSource.of(full[0], self._measure.of(full[0]).result)
                continue
            if not ok:
                self._learn.learned[lkey] = None  # no configuration of it measured ok: no stability
                continue
            job = self._learning_job(ok, lkey)
            if timing and not job.times_row:
                continue
            self._hand_out_learning(job)
            return job
        return None

    def _learning_job(self, ok: list[TrialConfig], lkey: str) -> Job:
        """The learning trial of a set-up whose measured ok configurations are ``ok`` (not empty):
        the fastest (by the step time its row has now: a runoff's over an extrapolation) whose
        learning configuration fits, else the fastest in the space's precision, with its note.
        Pure: nothing is marked or said (:meth:`_hand_out_learning` does)."""
        def fastest(cfgs: list[TrialConfig]) -> TrialConfig | None:
            return pick_learning_trial(cfgs, predict=lambda _c: 0.0, budget_gb=math.inf, step_ms=self._known_step_ms)

        ran_out = self._learn.ran_out.get(lkey)
        reasons = {c.trial_id: ran_out or self._learning_over_budget(c) for c in ok}
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
        job = Job.of(JobKind.LEARN, pick, without_worst_case(cfg), lkey, note=note, variant=variant)
        return replace(job, times_row=self._times_its_row(job))

    def _times_its_row(self, job: Job) -> bool:
        """A learning trial times its configuration in full, as its runoff would: it runs in that
        configuration's precision and model (only its steps, warm-up and evaluation differ, none of
        which a step's time depends on), whose row's step time is extrapolated and not timed yet."""
        src = job.source
        return ((job.cfg.train.precision, job.cfg.model) == (src.train.precision, src.model)
                and self._time_row(src, self._measure.of(src)).step_time_source == TimeSource.EXTRAPOLATED
                and self._timing_key(src) not in self._runoff.tried)

    def _timing_key(self, cfg: TrialConfig) -> tuple[str, int]:
        """What one timing in full serves: ``cfg``'s measurement group at its grad_acc (the
        runoff state's keys)."""
        return self._measure.group_of[cfg.trial_id], cfg.grad_acc

    def _hand_out_learning(self, job: Job) -> None:
        """Say what ``job`` costs and why; mark the configuration it times."""
        if job.note:
            self._out.notes.append(f"note: {job.note}")
        steps, ms = job.cfg.train.steps, self._known_step_ms(job.source)
        cost = f", ~{_seconds(steps * ms / 1e3)} of steps at {_seconds(ms / 1e3)} each" if math.isfinite(ms) else ""
        line = (f"learning: {job.job_id} runs {steps} steps at grad_acc {job.cfg.grad_acc}{cost}: a stability "
                f"verdict needs {steps} steps at the real effective batch ({job.cfg.effective_batch()} pairs)")
        if job.times_row:
            key = self._timing_key(job.source)
            self._runoff.tried.add(key)
            self._runoff.by_learning.add(key)
            line += f"; it times {job.source.trial_id} in full too, in place of a runoff"
        self._out.notes.append(line)

    def _finish_learning(self, job: Job, result: TrialResult) -> None:
        if result.status == Status.OOM and job.cfg.train.precision != job.source.train.precision:
            # The memory model under-predicted the learning precision (it can by up to 6.8 %): learn
            # in the space's precision instead, as when it is predicted not to fit.
            self._learn.ran_out[job.key] = f"{job.job_id} ran out of memory"
            return
        self._learn.learned[job.key] = LearningSource.of(job.cfg, result, job.note)
        if job.times_row:
            if result.status == Status.OK:
                self._take_full_time(job, result)
            else:  # a runoff may time it yet
                self._runoff.tried.discard(self._timing_key(job.source))
                self._runoff.by_learning.discard(self._timing_key(job.source))

    # --- the runoff phase ----------------------------------------------------------------------

    def _next_runoff(self) -> Job | None:
        if self.full_grid:
            return None
        if not self._runoff.queue:
            if self._measure.ongoing():
                return None  # the fastest is known once every group is measured
            if self._running_of(JobKind.RUNOFF) or any(j.times_row for j in self._running_of(JobKind.LEARN)):
                return None  # the next round reads the times this one (or a learning trial) brings
            self._runoff.queue = self._runoff_round()
        return self._runoff.queue.pop(0) if self._runoff.queue else None

    def _runoff_round(self) -> list[Job]:
        """The next round of runoffs (see plan/runoff.py): the recommendation's finalists, then
        the frontier's ties, none timed in full before, within what is left of the cap."""
        leaders, edges = self._runoff_picks()
        self._runoff.rounds += 1
        self._runoff.mark(leaders + edges, self._measure.group_of)
        for rows, why in ((leaders, "tied with the fastest within the step-time noise"),
                          (edges, "tie on the memory/throughput frontier")):
            if rows:
                steps = self._cfgs[rows[0].trial_id].train.steps
                costs = ", ".join(_seconds(steps * r.step_time_ms / 1e3) for r in rows)
                self._out.notes.append(f"runoff: {', '.join(r.trial_id for r in rows)} {why} on extrapolated "
                                       f"step times; timing each in full at its grad_acc ({steps} steps: ~{costs})")
        return [self._runoff_job(self._cfgs[r.trial_id]) for r in leaders + edges]

    def _runoff_picks(self) -> tuple[list[TrialResult], list[TrialResult]]:
        """(finalists, frontier ties) of a round from the rows measured so far, none timed in full
        before, within what is left of the cap; nothing marked (the round marks what it runs)."""
        left, group_of = runoff_cap(len(self._measure.groups)) - self._runoff.runoffs_run(), self._measure.group_of
        taken = set(self._runoff.tried)

        def pick(rows: list[TrialResult], limit: int) -> list[TrialResult]:
            picked = [r for r in rows if (group_of[r.trial_id], r.grad_acc) not in taken][:limit]
            taken.update((group_of[r.trial_id], r.grad_acc) for r in picked)
            return picked

        leaders = pick(finalists(self._fitting_rows(), usable_gb=None, limit=None), min(left, RUNOFF_MAX))
        edges = pick(frontier_ties(self._fitting_rows(margin=None), limit=None), left - len(leaders))
        return leaders, edges

    def _fitting_rows(self, margin: float | None = RUNOFF_SAFETY_MARGIN) -> list[TrialResult]:
        """Every measured ok row that fits its budget less ``margin`` (the recommendation's default
        margin; None: every ok row, as the frontier takes them)."""
        rows = []
        for group in self._measure.groups.values():
            if not group.measured_ok:
                continue
            for m in group.members:
                budget_gb = self.budget_of(m)
                if (budget_gb is None or margin is None
                        or budget.fits(group.result.peak_mem_gb, budget.usable_gb(budget_gb, margin))):
                    rows.append(self._time_row(m, group))
        return rows

    def _runoff_job(self, cfg: TrialConfig) -> Job:
        return Job.of(JobKind.RUNOFF, cfg, without_worst_case(without_eval(cfg)), self._measure.group_of[cfg.trial_id])

    def _finish_runoff(self, job: Job, result: TrialResult) -> None:
        if result.status != Status.OK:
            self._out.notes.append(f"runoff: {job.job_id} {result.status}; its rows keep the extrapolated step time")
            return
        self._take_full_time(job, result)

    def _take_full_time(self, job: Job, result: TrialResult) -> None:
        """``job`` (a runoff, or a learning trial that timed its configuration) measured its
        source's step time in full: its group's rows at that grad_acc take it, rewritten if written."""
        gkey = self._measure.group_of[job.source.trial_id]
        group, grad_acc = self._measure.groups[gkey], job.source.grad_acc
        before = self._time_row(job.source, group)
        self._runoff.times[(gkey, grad_acc)] = result
        timed = "" if job.kind is JobKind.RUNOFF else f" timed {job.source.trial_id}:"
        self._out.notes.append(f"{job.kind}: {job.job_id}{timed} {result.step_time_ms:.0f} ms per step in full "
                               f"(extrapolated {before.step_time_ms:.0f} ms)")
        for m in group.members:
            if m.grad_acc == grad_acc and m.trial_id in self._out.written and (row := self._row_of(m, group)):
                self._out.replaced.append(row)

    # --- rows ----------------------------------------------------------------------------------

    def _time_row(self, m: TrialConfig, group: Group) -> TrialResult:
        """``m``'s row from its group's measurement (a resumed sweep's: the row it restored), with
        its runoff's time when it had one."""
        return group.row(m, runoff=self._runoff.times.get((self._measure.group_of[m.trial_id], m.grad_acc)))

    def _row_of(self, m: TrialConfig, group: Group) -> TrialResult:
        """``m``'s results row; while its learning trial is still to come, with its stability
        columns :data:`PENDING` (:func:`~dpo_sweep.plan.rows.pending_stability`)."""
        row = self._time_row(m, group)
        if row.status != Status.OK:
            return row
        if self._measure.own_learning(m):
            return with_stability(row, LearningSource.of(m, row))
        if (lkey := self._learn.key_of[m.trial_id]) in self._learn.learned:
            return with_stability(row, self._learn.learned[lkey])
        return pending_stability(row)

    def _emit_ready(self) -> None:
        for group in self._measure.groups.values():
            if group.state is not GroupState.DONE:
                continue
            for m in group.members:
                if m.trial_id not in self._out.written:
                    self._emit(self._row_of(m, group))
                elif m.trial_id in self._out.pending and self._learn.key_of[m.trial_id] in self._learn.learned:
                    self._out.replaced.append(self._row_of(m, group))  # its learning trial ended
                    self._out.pending.discard(m.trial_id)

    def _emit(self, row: TrialResult) -> None:
        self._out.written.add(row.trial_id)
        if row.stability == PENDING:
            self._out.pending.add(row.trial_id)
        self._out.rows.append(row)


def _seconds(s: float) -> str:
    """``12 s``, ``0.8 s``: a cost said before it runs."""
    return f"{s:.0f} s" if s >= 10 else f"{s:.1f} s"


def _trainable(cfg: TrialConfig, shapes: Mapping[ModelSpec, ModelShape]) -> int | None:
    """The parameters ``cfg`` would train (plan/levers.py), for a row that never built its model;
    None when the model's shape cannot be read here."""
    try:
        return trainable_params(cfg, model_shape(cfg.model, shapes))
    except (OSError, ValueError, KeyError):
        return None
