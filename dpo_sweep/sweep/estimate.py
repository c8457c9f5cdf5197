"""The sweep's estimate of what is left (the progress lines' ``~3 min 10 s left``), trial by trial.

Each trial still to run, and each running one, is priced as the plan knows it now
(:class:`~dpo_sweep.plan.jobs.Due`): a fixed cost per trial - what the trials that ended spent
outside their optimizer steps (Ray's start of the trial, the model build, the reference pass of
new pairs, the teardown, the wait for the next trial) - plus its steps:

- a trial of a configuration already measured (a learning trial, a runoff) runs its steps at
  that configuration's step time (its row's: a runoff's, else the extrapolation), and a learning
  trial on a precomputed reference first computes the reference of the pairs it reads, most of
  them new (:data:`REFERENCE_SHARE` of a step each step's pairs);
- a measure trial, whose configuration is not measured yet, at the pace of the measure trials
  that ended: their steps' seconds per token (:func:`trial_tokens`);
- a learning trial or runoff whose configuration is not measured yet at the fastest of those
  paces: the plan runs them on the fastest rows. (On the H200 user case the median pace of the
  first two measurements, mb 1 and mb 2 at level full, priced the learning trial and the runoffs
  at 7-12 s a step where they ran at 6.4-7.3 s: the ETA was 50% high in minutes 1-2.)

Why not one pace per token for everything: on the H200 user case a learning trial of 16 steps at
grad_acc 32 cost 136 s where the measure trials' token pace said 75, and the first trial's start
(a cold worker: imports, tokenising, the weights from disk) put the first minute's estimate 2-3x
over the truth. A warm worker pays those once, so the first trial's ``import`` and ``data``
phases are left out of the fixed cost (:meth:`SweepEstimate.fixed_s`).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Sequence

from dpo_sweep.config import TrialConfig
from dpo_sweep.plan.jobs import Due, JobKind
from dpo_sweep.records import TrialResult

#: A reference pass (one forward, no gradients, batched by tokens) of one step's pairs, as a share
#: of a training step's time (forward and backward, and the level's recompute).
REFERENCE_SHARE = 0.25


def trial_tokens(cfg: TrialConfig) -> int:
    """What a configuration's trial costs, as a proxy: the tokens its optimizer steps go through at
    most (steps x grad_acc x micro_batch x max_length); a step's time grows with them."""
    return cfg.train.steps * cfg.grad_acc * cfg.micro_batch * cfg.train.max_length


@dataclass(frozen=True)
class EndedTrial:
    """What one ended trial tells about the next ones."""

    kind: JobKind
    cost_s: float     # its share of the sweep's wall: from the previous trial's end (or its own start) to its end
    measure_s: float  # its optimizer steps (results.csv measure_s; NaN when it took none)
    once_s: float     # what a warm worker pays once: its start-up's import and data phases
    tokens: int       # trial_tokens of what it ran

    @classmethod
    def of(cls, kind: JobKind, cfg: TrialConfig, result: TrialResult, cost_s: float) -> EndedTrial:
        once = sum(v for v in (result.startup_import_s, result.startup_data_s) if _finite(v))
        return cls(kind, cost_s, result.measure_s if _finite(result.measure_s) else math.nan, once, trial_tokens(cfg))


class SweepEstimate:
    """The ended trials so far, and from them the price of the ones left."""

    def __init__(self) -> None:
        self.ended: list[EndedTrial] = []

    def add(self, trial: EndedTrial) -> None:
        self.ended.append(trial)

    def fixed_s(self) -> float:
        """A trial's cost outside its steps: the median over the ended trials after the first; from
        the first alone, its cost less its import and data phases (a warm worker's later trials
        skip them). 0 while no ended trial ran a step (:meth:`pace_s_per_token` then prices the
        whole trial); NaN before a trial has ended."""
        if not self.ended:
            return math.nan
        if not any(_finite(e.measure_s) for e in self.ended):
            return 0.0
        outside = [e.cost_s - (e.measure_s if _finite(e.measure_s) else 0.0) for e in self.ended]
        if len(outside) > 1:
            return max(0.0, statistics.median(outside[1:]))
        return max(0.0, outside[0] - self.ended[0].once_s)

    def pace_s_per_token(self, fastest: bool = False) -> float:
        """The median (``fastest``: the least) seconds per token of the ended measure trials' steps
        (of any kind's when no measure trial ran a step); of the ended trials' whole cost while none
        ran a step (a failure before the first step). NaN before a trial has ended."""
        timed = [e for e in self.ended if _finite(e.measure_s) and e.tokens > 0]
        if timed:
            measured = [e for e in timed if e.kind is JobKind.MEASURE] or timed
            paces = [e.measure_s / e.tokens for e in measured]
            return min(paces) if fastest else statistics.median(paces)
        whole = [e.cost_s / e.tokens for e in self.ended if e.tokens > 0]
        return statistics.median(whole) if whole else math.nan

    def trial_s(self, due: Due) -> float:
        """What ``due`` costs from its start to its end (NaN before a trial has ended)."""
        t = due.cfg.train
        if _finite(due.step_ms):
            steps = (t.steps + t.worst_case_step) * due.step_ms / 1e3
            if due.kind is JobKind.LEARN and t.reference == "precomputed":
                steps += REFERENCE_SHARE * t.steps * due.step_ms / 1e3
        else:
            steps = self.pace_s_per_token(fastest=due.kind is not JobKind.MEASURE) * trial_tokens(due.cfg)
        return self.fixed_s() + steps

    def left_s(self, due: Sequence[Due], running: Sequence[tuple[Due, float]], concurrent: int = 1) -> float:
        """What is left: the trials ``due`` whole, the ``running`` ones (each with the seconds it has
        run) less what they ran (never below 0), ``concurrent`` at a time. 0 when nothing is left,
        NaN before a trial has ended."""
        if not due and not running:
            return 0.0
        total = sum(self.trial_s(d) for d in due) + sum(max(0.0, self.trial_s(d) - ran) for d, ran in running)
        return total / max(1, concurrent)


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)
