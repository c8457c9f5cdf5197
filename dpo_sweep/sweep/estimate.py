"""The sweep's estimate of what is left (the progress lines' ``~3 min 10 s left``), trial by trial.

Each trial still to run, and each running one, is priced as the plan knows it now
(:class:`~dpo_sweep.plan.jobs.Due`): a fixed cost per trial - what the trials that ended spent
outside their optimizer steps (Ray's start of the trial, the model build, the reference pass of
new pairs, the teardown, the wait for the next trial) - plus its steps:

- a trial of a configuration already measured (a learning trial, a runoff) runs its steps at
  that configuration's step time (its row's: a runoff's, else the extrapolation), and a learning
  trial on a precomputed reference first computes the reference of the pairs it reads, most of
  them new (:data:`REFERENCE_SHARE` of a step each step's pairs);
- a measure trial, whose configuration is not measured yet, at the pace (seconds per token,
  :func:`trial_tokens`) of the measured trials nearest it: the same micro-batch (else the nearest)
  first, then the nearest checkpoint level. A micro-batch of 1 runs its tokens slower than
  larger ones (its kernels too small to fill the GPU), so a first measurement at mb 1 would price
  every other one high (benchmarks/README.md#the-eta);
- a learning trial or runoff whose configuration is not measured yet at the fastest measured
  pace: the plan runs them on the fastest rows (a median pace of the first measurements prices
  them high).

Why not one pace per token for everything: a learning trial at a large grad_acc costs more than
the measure trials' token pace says. And the first trial pays what a warm worker pays once:
imports, tokenising, the weights' first read from disk and the reference pass of the pairs every
measurement shares, the kernels' first compile in its warm-up steps. Counted as every trial's
fixed cost and pace, these put the first estimate far over the truth
(benchmarks/README.md#the-eta); so the first trial's ``import``,
``data`` and ``model`` phases are left out of the fixed cost (:meth:`SweepEstimate.fixed_s`), and
its warm-up steps' excess (:func:`warmup_excess_s`) out of its pace: from the second trial on, the
later trials' own costs price it.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Sequence

from dpo_sweep.config import TrialConfig
from dpo_sweep.plan.jobs import Due, Job, JobKind
from dpo_sweep.records import StepRecord, TrialResult
from dpo_sweep.sweep.collector import CollectedTrial
from dpo_sweep.core.levels import Level

#: A reference pass (one forward, no gradients, batched by tokens) of one step's pairs, as a share
#: of a training step's time (forward and backward, and the level's recompute).
REFERENCE_SHARE = 0.25


def trial_tokens(cfg: TrialConfig) -> int:
    """What a configuration's trial costs, as a proxy: the tokens its optimizer steps go through at
    most (steps x grad_acc x micro_batch x max_length); a step's time grows with them."""
    return cfg.train.steps * cfg.grad_acc * cfg.micro_batch * cfg.train.max_length


def warmup_excess_s(steps: Sequence[StepRecord]) -> float:
    """What the warm-up steps took over the measured steps' median (never below 0; 0 without
    both): a fresh process's first steps compile and tune kernels."""
    timed = [r.step_time_ms for r in steps if not r.worst_case and math.isfinite(r.step_time_ms)]
    measured = [r.step_time_ms for r in steps if r.measured and not r.worst_case and math.isfinite(r.step_time_ms)]
    warmup = len(timed) - len(measured)
    if not measured or not warmup:
        return 0.0
    return max(0.0, (sum(timed) - sum(measured) - warmup * statistics.median(measured)) / 1e3)


@dataclass(frozen=True)
class EndedTrial:
    """What one ended trial tells about the next ones."""

    kind: JobKind
    cost_s: float     # its share of the sweep's wall: from the previous trial's end (or its own start) to its end
    measure_s: float  # its optimizer steps (results.csv measure_s; NaN when it took none)
    once_s: float     # of its start-up, what a warm worker pays once: the import, data and model phases
    tokens: int       # trial_tokens of what it ran
    micro_batch: int  # what it ran (the pace's nearest configurations: _distance)
    level: str
    warmup_s: float   # its warm-up steps' excess over its measured steps (warmup_excess_s)

    @classmethod
    def of(cls, kind: JobKind, cfg: TrialConfig, result: TrialResult, cost_s: float,
           steps: Sequence[StepRecord] = ()) -> EndedTrial:
        once = sum(v for v in (result.startup_import_s, result.startup_data_s, result.startup_model_s) if _finite(v))
        measure = result.measure_s if _finite(result.measure_s) else math.nan
        return cls(kind, cost_s, measure, once, trial_tokens(cfg), cfg.micro_batch, cfg.checkpoint_level,
                   warmup_excess_s(steps) if _finite(measure) else 0.0)


class SweepEstimate:
    """The ended trials so far, and from them the price of the ones left."""

    def __init__(self) -> None:
        self.ended: list[EndedTrial] = []

    def add(self, trial: EndedTrial) -> None:
        self.ended.append(trial)

    def _steps_s(self, i: int) -> float:
        """The ``i``-th ended trial's steps, the first one's warm-up excess left out (a warm
        worker's later trials find the kernels compiled)."""
        e = self.ended[i]
        return max(0.0, e.measure_s - e.warmup_s) if i == 0 else e.measure_s

    def fixed_s(self) -> float:
        """A trial's cost outside its steps: the median over the ended trials after the first; from
        the first alone, its cost less its steps (their warm-up excess with them) and less its
        import, data and model phases, which a warm worker pays once. 0 while no ended trial ran a
        step (:meth:`pace_s_per_token` then prices the whole trial); NaN before a trial has ended."""
        if not self.ended:
            return math.nan
        if not any(_finite(e.measure_s) for e in self.ended):
            return 0.0
        outside = [e.cost_s - (e.measure_s if _finite(e.measure_s) else 0.0) for e in self.ended]
        if len(outside) > 1:
            return max(0.0, statistics.median(outside[1:]))
        return max(0.0, outside[0] - self.ended[0].once_s)  # its steps, warm-up excess included, are out

    def pace_s_per_token(self, fastest: bool = False, like: TrialConfig | None = None) -> float:
        """Seconds per token of the ended measure trials' steps (of any kind's when no measure
        trial ran a step): their median; ``fastest``: the least; ``like``: the median of those
        nearest that configuration (its micro-batch, then its checkpoint level). Of the ended
        trials' whole cost while none ran a step (a failure before the first step). NaN before a
        trial has ended."""
        timed = [i for i, e in enumerate(self.ended) if _finite(e.measure_s) and e.tokens > 0]
        if timed:
            measured = [i for i in timed if self.ended[i].kind is JobKind.MEASURE] or timed
            if like is not None and not fastest:
                near = min(_distance(self.ended[i], like) for i in measured)
                measured = [i for i in measured if _distance(self.ended[i], like) == near]
            paces = [self._steps_s(i) / self.ended[i].tokens for i in measured]
            return min(paces) if fastest else statistics.median(paces)
        whole = [e.cost_s / e.tokens for e in self.ended if e.tokens > 0]
        return statistics.median(whole) if whole else math.nan

    def trial_s(self, due: Due) -> float:
        """What ``due`` costs from its start to its end (NaN before a trial has ended, and for an
        unmeasured configuration while no pace prices it: :meth:`_paced`)."""
        t = due.cfg.train
        if _finite(due.step_ms):
            steps = (t.steps + t.worst_case_step) * due.step_ms / 1e3
            if due.kind is JobKind.LEARN and t.reference == "precomputed":
                steps += REFERENCE_SHARE * t.steps * due.step_ms / 1e3
        else:
            if not self._paced(due.cfg):
                return math.nan
            fastest = due.kind is not JobKind.MEASURE
            steps = self.pace_s_per_token(fastest, like=None if fastest else due.cfg) * trial_tokens(due.cfg)
        return self.fixed_s() + steps

    def _paced(self, cfg: TrialConfig) -> bool:
        """Whether a pace prices ``cfg``: some measured trial ran its micro-batch, or two micro-batch
        sizes have been measured (one alone says nothing of another's: an mb 1 pace prices larger
        micro-batches high, benchmarks/README.md#the-eta), or none ran a step."""
        timed = {e.micro_batch for e in self.ended if _finite(e.measure_s) and e.tokens > 0}
        return not timed or cfg.micro_batch in timed or len(timed) > 1

    def left_s(self, due: Sequence[Due], running: Sequence[tuple[Due, float]], concurrent: int = 1) -> float:
        """What is left: the trials ``due`` whole, the ``running`` ones (each with the seconds it has
        run) less what they ran (never below 0), ``concurrent`` at a time. 0 when nothing is left,
        NaN while one of them has no price (:meth:`trial_s`)."""
        if not due and not running:
            return 0.0
        rest = [self.trial_s(d) - ran for d, ran in running]
        total = sum(self.trial_s(d) for d in due) + sum(r if math.isnan(r) else max(0.0, r) for r in rest)
        return total / max(1, concurrent)


class TrialPricing:
    """What feeds the estimate: when each trial started (``started``, by job id: the recorder's
    ``on_trial_start``) and, once the plan knows a trial's outcome (:meth:`trial_ended`, an end
    hook of the planner's Searcher), its share of the sweep's wall, priced in."""

    def __init__(self, concurrent: int = 1) -> None:
        self.estimate = SweepEstimate()
        self.concurrent = concurrent
        self.started: dict[str, float] = {}
        self.last_end: float | None = None  # when the last Ray trial ended

    def trial_ended(self, job: Job, done: CollectedTrial) -> None:
        now = time.monotonic()
        started = self.started.pop(job.job_id, None)
        if started is not None:
            # One trial at a time: its share of the wall runs from the last one's end (Tune's wait
            # to start it included); several at a time: from its own start.
            since = max(started, self.last_end) if self.concurrent == 1 and self.last_end is not None else started
            self.estimate.add(EndedTrial.of(job.kind, job.cfg, done.result, now - since, done.steps))
        self.last_end = now


def _distance(ended: EndedTrial, cfg: TrialConfig) -> tuple[float, int]:
    """How far an ended trial's configuration is from ``cfg``: micro-batch (by factors of 2) first,
    then checkpoint level."""
    return (abs(math.log2(ended.micro_batch) - math.log2(cfg.micro_batch)),
            abs(Level(ended.level).memory_rank - Level(cfg.checkpoint_level).memory_rank))


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)
