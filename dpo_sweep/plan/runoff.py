"""The runoff: the configurations a recommendation would choose between, timed in full.

A memory/time trial runs a few micro-steps per optimizer step and the row's step time at its real
grad_acc is extrapolated (rules.extrapolate_step_ms). That is mostly within 5% of a full
measurement, but three short steps give a p10-p90 interval several times wider than a full
run's, wide enough to tie configurations that a full measurement separates: the same
measurements, a different answer, decided by the width of a guess
(benchmarks/README.md#step-timing-and-extrapolation).

The runoff takes the rows the recommendation would weigh - ok, fitting the budget, their
throughput interval overlapping the fastest fitting row's - and, when any of them is
extrapolated, times each such finalist in full at its real grad_acc (``<id>-runoff`` trials).

The frontier has the same weakness: a row is off it when a leaner row's throughput interval
reaches its own (analysis/pareto.py: a tie goes to less memory), and an extrapolated row's wide
interval can reach a row that a full measurement would leave behind. So the rows
whose place off the frontier rests on such a tie alone, and the leaner rows that tie them, are
timed in full too when extrapolated (:func:`frontier_ties`). A row timed in full has a narrower
interval, which can settle a tie or uncover another (a row still extrapolated can reach past
one just timed), so the plan asks again after each round, until nothing is left to settle or
:func:`runoff_cap` runoffs have run.
Pure: the plan (schedule.py) asks which rows to time and runs them.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import pandas as pd

from dpo_sweep.core import budget, noise
from dpo_sweep.core.status import Status, TimeSource
from dpo_sweep.records import TrialResult

#: At most this many finalists are timed in full (fastest first): each costs a trial at the real
#: grad_acc, the cost the planner exists to avoid; ties wider than this are rare and the rest keep
#: their extrapolated times.
RUNOFF_MAX = 3
#: At most one runoff per this many memory/time measurements, in all rounds together (and at
#: least RUNOFF_MAX): a runoff costs what a full-grid trial does.
RUNOFF_PER_MEASUREMENTS = 2


def runoff_cap(measurements: int) -> int:
    """How many runoffs a sweep of ``measurements`` memory/time measurements may run in all."""
    return max(RUNOFF_MAX, measurements // RUNOFF_PER_MEASUREMENTS)


#: A finalist must fit the budget less this share: the recommendation's default safety margin
#: (``--safety-margin``), so the runoff times what the default recommendation can choose.
RUNOFF_SAFETY_MARGIN = 0.05


def finalists(rows: Sequence[TrialResult], usable_gb: float | None,
              limit: int | None = RUNOFF_MAX) -> list[TrialResult]:
    """The extrapolated rows of ``rows`` to time in full, fastest first, one per configuration
    (rows that share a measurement and a grad_acc - e.g. betas - are one configuration): the ok
    rows peaking within ``usable_gb`` (None: any) whose throughput interval overlaps the fastest
    such row's (:mod:`dpo_sweep.core.noise`, the recommendation's tie rule); at most ``limit`` (None:
    all). Empty when every finalist was already measured at its grad_acc."""
    fitting = sorted((r for r in rows if r.status == Status.OK and math.isfinite(r.tokens_per_s)
                      and budget.fits(r.peak_mem_gb, usable_gb)), key=lambda r: -r.tokens_per_s)
    if not fitting:
        return []
    low, high = noise.throughput_interval(pd.DataFrame([dataclasses.asdict(r) for r in fitting]))
    tied = noise.overlaps(low, high, low[0], high[0])  # fitting[0] is the fastest
    out: list[TrialResult] = []
    seen: set[tuple[str, int]] = set()
    for r, is_tied in zip(fitting, tied):
        key = (r.measured_by, r.grad_acc)
        if is_tied and r.step_time_source == TimeSource.EXTRAPOLATED and key not in seen:
            seen.add(key)
            out.append(r)
    return out[:limit]


def frontier_ties(rows: Sequence[TrialResult], limit: int | None = RUNOFF_MAX) -> list[TrialResult]:
    """The extrapolated rows of ``rows`` whose timing in full can change the memory/throughput
    frontier, one per configuration, fastest first: for every ok row ``j`` that a leaner row
    ``i`` dominates only through a throughput tie (``i`` peaks lower and their intervals overlap;
    no row at most as lean is faster beyond the noise), the extrapolated ones of ``j`` and those
    ``i``; at most ``limit`` (None: all). The dominance is analysis/pareto.py's, on memory and
    throughput only (the plan may not import the analyser): a row dominated beyond the noise stays
    off the frontier whatever its timing, and loss std is left out: what the runoff narrows is
    throughput."""
    ok = [r for r in rows if r.status == Status.OK and math.isfinite(r.tokens_per_s) and math.isfinite(r.peak_mem_gb)]
    if not ok:
        return []
    low, high = noise.throughput_interval(pd.DataFrame([dataclasses.asdict(r) for r in ok]))
    picked: dict[tuple[str, int], TrialResult] = {}
    for j, rj in enumerate(ok):
        lean = [i for i, ri in enumerate(ok) if i != j and ri.peak_mem_gb <= rj.peak_mem_gb]
        if any(low[i] > high[j] for i in lean):
            continue  # dominated beyond the noise
        tied = [i for i in lean if ok[i].peak_mem_gb < rj.peak_mem_gb and noise.overlaps(low[i], high[i], low[j], high[j])]
        if not tied:
            continue  # on the memory/throughput frontier: nothing to settle
        for r in [rj, *(ok[i] for i in tied)]:
            if r.step_time_source == TimeSource.EXTRAPOLATED:
                picked.setdefault((r.measured_by, r.grad_acc), r)
    return sorted(picked.values(), key=lambda r: -r.tokens_per_s)[:limit]


def timed_row(row: TrialResult, runoff: TrialResult) -> TrialResult:
    """``row`` with the step time, its spread, throughput and MFU that its runoff trial measured
    in full at the row's grad_acc (``step_time_source: runoff``, ``timed_by``: that trial)."""
    return dataclasses.replace(
        row, step_time_ms=runoff.step_time_ms, step_time_p10_ms=runoff.step_time_p10_ms,
        step_time_p90_ms=runoff.step_time_p90_ms, tokens_per_s=runoff.tokens_per_s, mfu=runoff.mfu,
        step_time_source=TimeSource.RUNOFF, extrapolation_error=math.nan, timed_by=runoff.trial_id)
