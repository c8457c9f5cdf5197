"""A row's step time from a shorter accumulation, and how precisely it is known (plan/rows.py)."""
from __future__ import annotations

import dataclasses
import math
import statistics

import pandas as pd
import pytest

from dpo_sweep.core.noise import throughput_interval
from dpo_sweep.plan.rows import fitted_step, shared_row
from dpo_sweep.plan.runoff import finalists, timed_row
from dpo_sweep.records import StepRecord, TrialResult, failed_result
from tests.testkit import make_cfg


def _step(n: int, micro_ms: list[float], optimizer_ms: float = 20.0, new: str = "") -> StepRecord:
    micro = statistics.median(micro_ms[1:] or micro_ms)
    return StepRecord(trial_id="t", step=n, loss=0.6, grad_norm=1.0, step_time_ms=sum(micro_ms) + optimizer_ms,
                      peak_mem_gb=1.0, reward_accuracy=0.5, reward_margin=0.0, logps_chosen=-1.0, logps_rejected=-1.0,
                      kl=0.0, micro_step_ms=micro, optimizer_ms=optimizer_ms,
                      micro_ms=",".join(f"{t:g}" for t in micro_ms), micro_new=new)


#: Three measured steps of 8 micro-steps whose times scatter as long-tailed lengths make them.
SCATTERED = [[90.0, 100.0, 140.0, 80.0, 120.0, 95.0, 105.0, 130.0],
             [92.0, 85.0, 110.0, 150.0, 100.0, 90.0, 115.0, 100.0],
             [91.0, 125.0, 95.0, 100.0, 70.0, 110.0, 100.0, 135.0]]


def test_the_extrapolation_s_error_is_the_standard_error_of_its_micro_steps_times_grad_acc():
    steps = [_step(n, ms) for n, ms in enumerate(SCATTERED, start=1)]
    fitted = fitted_step(steps, 8, 32)
    sample = [t for ms in SCATTERED for t in ms[1:]]  # the first of a step writes fresh gradients: not steady
    assert len(sample) == 21
    expected = 32 * math.sqrt(math.pi / 2) * statistics.stdev(sample) / math.sqrt(21) / fitted.step_ms
    assert fitted.rel_error == pytest.approx(expected)
    assert 0.02 < fitted.rel_error < 0.2
    # micro-steps all alike tell the steady one exactly
    assert fitted_step([_step(n, [90.0] + [100.0] * 7) for n in (1, 2, 3)], 8, 32).rel_error == 0.0
    # steps that recorded no micro-step times (older steps.csv) give no error
    bare = [dataclasses.replace(s, micro_ms="") for s in steps]
    assert fitted_step(bare, 8, 32).step_ms == fitted.step_ms and math.isnan(fitted_step(bare, 8, 32).rel_error)


def test_a_micro_step_of_a_shape_new_to_the_process_is_no_sample_of_the_steady_one():
    plain = [_step(n, ms) for n, ms in enumerate(SCATTERED, start=1)]
    # the third micro-step of each step built its kernel plans (+300 ms): left out, as the steady median does
    slow = [_step(n, [t + 300.0 if j == 2 else t for j, t in enumerate(ms)], new="00100000")
            for n, ms in enumerate(SCATTERED, start=1)]
    assert fitted_step(slow, 8, 32).rel_error < fitted_step(plain, 8, 32).rel_error


def _measured(steps, grad_acc: int) -> TrialResult:
    ms = [s.step_time_ms for s in steps]
    return dataclasses.replace(failed_result(make_cfg(grad_acc=grad_acc), "ok", ""), status="ok", error="",
                               step_time_ms=statistics.median(ms), step_time_p10_ms=min(ms),
                               step_time_p90_ms=max(ms), tokens_per_s=1000.0, peak_mem_gb=10.0)


def test_an_extrapolated_row_s_interval_holds_its_own_error_and_a_full_timing_drops_it():
    steps = [_step(n, ms) for n, ms in enumerate(SCATTERED, start=1)]
    measured = _measured(steps, 8)
    cfg = make_cfg(grad_acc=32)
    row = shared_row(cfg, measured, steps, ran_grad_acc=8, measured_by="m", predicted_peak_gb=10.0)
    fitted = fitted_step(steps, 8, 32)
    ratio = fitted.step_ms / measured.step_time_ms
    assert row.step_time_source == "extrapolated" and row.extrapolation_error == fitted.rel_error
    assert row.step_time_p10_ms == pytest.approx(measured.step_time_p10_ms * ratio / (1 + fitted.rel_error))
    assert row.step_time_p90_ms == pytest.approx(measured.step_time_p90_ms * ratio * (1 + fitted.rel_error))
    # the row measured at its own grad_acc has no extrapolation and no error
    own = shared_row(make_cfg(grad_acc=8), measured, steps, ran_grad_acc=8, measured_by="m", predicted_peak_gb=10.0)
    assert own.step_time_source == "measured" and math.isnan(own.extrapolation_error)
    # timed in full by a runoff: the runoff's interval, no extrapolation error
    runoff = dataclasses.replace(measured, step_time_ms=3000.0, step_time_p10_ms=2990.0, step_time_p90_ms=3010.0)
    timed = timed_row(row, runoff)
    assert timed.step_time_source == "runoff" and math.isnan(timed.extrapolation_error)
    assert timed.step_time_p90_ms == 3010.0


def test_the_extrapolation_s_error_can_make_a_tie_the_runoff_times():
    # Two configurations extrapolated to grad_acc 32, each short run's steps within +-0.5%: the
    # faster timed its micro-steps all alike, the slower (4% slower) scattered ones. Their
    # spreads alone are apart; the slower's extrapolation error reaches the faster, so the
    # runoff times both.
    def row(steps, tid, tokens_per_s):
        short = dataclasses.replace(_measured(steps, 8), tokens_per_s=tokens_per_s)
        short = dataclasses.replace(short, step_time_p10_ms=short.step_time_ms * 0.995,
                                    step_time_p90_ms=short.step_time_ms * 1.005)
        return shared_row(make_cfg(grad_acc=32), short, steps, ran_grad_acc=8, measured_by=tid, predicted_peak_gb=10.0)

    alike = [_step(n, [90.0] + [100.0] * 7) for n in (1, 2, 3)]
    scattered = [_step(n, ms) for n, ms in enumerate(SCATTERED, start=1)]
    fast = row(alike, "fast", 1000.0)
    probe = row(scattered, "slow", 1000.0)
    slow = row(scattered, "slow", 1000.0 * 0.96 * fast.tokens_per_s / probe.tokens_per_s)
    assert slow.tokens_per_s == pytest.approx(0.96 * fast.tokens_per_s)
    assert fast.extrapolation_error == 0.0 and slow.extrapolation_error > 0.04
    e = slow.extrapolation_error
    without = dataclasses.replace(slow, step_time_p10_ms=slow.step_time_p10_ms * (1 + e),
                                  step_time_p90_ms=slow.step_time_p90_ms / (1 + e))
    low, high = throughput_interval(pd.DataFrame([dataclasses.asdict(r) for r in (fast, without)]))
    assert high[1] < low[0]  # the short runs' spreads alone: apart
    assert [r.measured_by for r in finalists([fast, without], usable_gb=None)] == ["fast"]
    assert [r.measured_by for r in finalists([fast, slow], usable_gb=None)] == ["fast", "slow"]
