"""The runoff phase of the sweep's plan (:mod:`~dpo_sweep.plan.schedule`): once every group is
measured, the extrapolated rows a recommendation would weigh, and those a frontier tie rests on,
timed in full at their own grad_acc (``<trial_id>-runoff``), round after round within
:func:`~dpo_sweep.plan.runoff.runoff_cap` (the rules: :mod:`~dpo_sweep.plan.runoff`). It keeps
every timing in full by :class:`~dpo_sweep.plan.keys.TimingKey` - a runoff's, or a learning
trial's that timed its configuration - and so is where a row's step time as it stands now is
read. Pure."""
from __future__ import annotations

import math

from dpo_sweep.core.status import TimeSource
from dpo_sweep.core import budget
from dpo_sweep.config import TrialConfig
from dpo_sweep.plan.jobs import Due, Job, JobKind, seconds, without_eval, without_worst_case
from dpo_sweep.plan.keys import TimingKey
from dpo_sweep.plan.measure_phase import MeasurePhase
from dpo_sweep.plan.peaks import PeakModel
from dpo_sweep.plan.runoff import RUNOFF_MAX, RUNOFF_SAFETY_MARGIN, finalists, frontier_ties, runoff_cap
from dpo_sweep.plan.state import Rows
from dpo_sweep.records import TrialResult


class RunoffPhase:
    """This round's runoffs still to start and, by timing key, the timings in full taken or
    claimed (``tried``; ``by_learning``: claimed by a learning trial, no runoff's cost) and the
    ok ones' results (``times``). Reads the measure phase and the budget, writes its notes."""

    def __init__(self, measure: MeasurePhase, peaks: PeakModel, rows: Rows) -> None:
        self._measure, self._peaks, self._rows = measure, peaks, rows
        self.queue: list[Job] = []
        self.tried: set[TimingKey] = set()
        self.by_learning: set[TimingKey] = set()
        self.times: dict[TimingKey, TrialResult] = {}
        self.rounds = 0  # the runoff rounds begun

    # --- a row's step time as it stands now ---------------------------------------------------

    def key(self, cfg: TrialConfig) -> TimingKey:
        return self._measure.timing_key(cfg.trial_id, cfg.grad_acc)

    def time_row(self, m: TrialConfig) -> TrialResult:
        """``m``'s row from its group's measurement (a resumed sweep's: the row it restored), with
        its timing in full when it had one."""
        return self._measure.of(m).row(m, runoff=self.times.get(self.key(m)))

    def step_ms(self, cfg: TrialConfig) -> float:
        """``cfg``'s step time as its row has it now (timed in full over extrapolated); NaN when
        its group is not measured ok yet."""
        if not self._measure.of(cfg).measured_ok:
            return math.nan
        return self.time_row(cfg).step_time_ms

    def needs_timing(self, cfg: TrialConfig) -> bool:
        """``cfg``'s step time is extrapolated and no timing in full of it is taken or claimed."""
        return self.time_row(cfg).step_time_source == TimeSource.EXTRAPOLATED and self.key(cfg) not in self.tried

    def claim(self, key: TimingKey, by_learning: bool = False) -> None:
        self.tried.add(key)
        if by_learning:
            self.by_learning.add(key)

    def release(self, key: TimingKey) -> None:
        """A learning trial that claimed ``key`` did not time it: a runoff may yet."""
        self.tried.discard(key)
        self.by_learning.discard(key)

    def record(self, key: TimingKey, result: TrialResult) -> None:
        """An ok timing in full: the rows of ``key`` take it from now on."""
        self.times[key] = result

    # --- the runoffs --------------------------------------------------------------------------

    def next_job(self, busy: bool) -> Job | None:
        """The next runoff, or None; ``busy``: a runoff or a learning trial that times a row is
        running, whose time the next round reads."""
        if self._measure.full_grid:
            return None
        if not self.queue:
            if self._measure.ongoing():
                return None  # the fastest is known once every group is measured
            if busy:
                return None  # the next round reads the times this one (or a learning trial) brings
            self.queue = self._round()
        return self.queue.pop(0) if self.queue else None

    def job_for(self, cfg: TrialConfig) -> Job:
        return Job.of(JobKind.RUNOFF, cfg, without_worst_case(without_eval(cfg)))

    def due(self, timed: set[str]) -> list[Due]:
        """The runoffs still to start: the queued ones once the phase has begun (a later round is
        known only when this one has ended); before it, the first round that the rows measured so
        far would call for, less the configurations in ``timed`` (their learning trials time them)."""
        if self.rounds:
            runoffs = [j.source for j in self.queue]
        else:
            leaders, edges = self.picks()
            runoffs = [self._measure.cfgs[r.trial_id] for r in leaders + edges if r.trial_id not in timed]
        return [Due(self.job_for(c).cfg, JobKind.RUNOFF, self.step_ms(c)) for c in runoffs]

    def picks(self) -> tuple[list[TrialResult], list[TrialResult]]:
        """(finalists, frontier ties) of a round from the rows measured so far, none timed in full
        before, within what is left of the cap; nothing marked (the round marks what it runs)."""
        left = runoff_cap(len(self._measure.groups)) - len(self.tried - self.by_learning)
        taken = set(self.tried)

        def key(r: TrialResult) -> TimingKey:
            return self._measure.timing_key(r.trial_id, r.grad_acc)

        def pick(rows: list[TrialResult], limit: int) -> list[TrialResult]:
            picked = [r for r in rows if key(r) not in taken][:limit]
            taken.update(key(r) for r in picked)
            return picked

        leaders = pick(finalists(self._fitting_rows(), usable_gb=None, limit=None), min(left, RUNOFF_MAX))
        edges = pick(frontier_ties(self._fitting_rows(margin=None), limit=None), left - len(leaders))
        return leaders, edges

    def _round(self) -> list[Job]:
        """The next round of runoffs (see plan/runoff.py): the recommendation's finalists, then
        the frontier's ties, none timed in full before, within what is left of the cap."""
        leaders, edges = self.picks()
        self.rounds += 1
        self.tried.update(self._measure.timing_key(r.trial_id, r.grad_acc) for r in leaders + edges)
        for rows, why in ((leaders, "tied with the fastest within the step-time noise"),
                          (edges, "tie on the memory/throughput frontier")):
            if rows:
                steps = self._measure.cfgs[rows[0].trial_id].train.steps
                costs = ", ".join(seconds(steps * r.step_time_ms / 1e3) for r in rows)
                self._rows.note(f"runoff: {', '.join(r.trial_id for r in rows)} {why} on extrapolated "
                                f"step times; timing each in full at its grad_acc ({steps} steps: ~{costs})")
        return [self.job_for(self._measure.cfgs[r.trial_id]) for r in leaders + edges]

    def _fitting_rows(self, margin: float | None = RUNOFF_SAFETY_MARGIN) -> list[TrialResult]:
        """Every measured ok row that fits its budget less ``margin`` (the recommendation's default
        margin; None: every ok row, as the frontier takes them)."""
        rows = []
        for group in self._measure.groups:
            if not group.measured_ok:
                continue
            for m in group.members:
                budget_gb = self._peaks.budget_of(m)
                if (budget_gb is None or margin is None
                        or budget.fits(group.result.peak_mem_gb, budget.usable_gb(budget_gb, margin))):
                    rows.append(self.time_row(m))
        return rows
