"""The stability signals and verdict (dpo_sweep/core/stability.py) on hand-worked series."""
from __future__ import annotations

import math

import pytest

from dpo_sweep.core import stability as st


def test_slope_and_detrended_spread_hand_worked():
    assert st.slope([1.0, 0.9, 0.8, 0.7]) == pytest.approx(-0.1)
    assert st.detrended_std([1.0, 0.9, 0.8, 0.7]) == pytest.approx(0.0, abs=1e-12)
    # [0, 1, 0, 1]: fit 0.2 + 0.2x, residuals (-0.2, 0.6, -0.6, 0.2), ss 0.8 over n - 2 = 2
    assert st.slope([0.0, 1.0, 0.0, 1.0]) == pytest.approx(0.2)
    assert st.detrended_std([0.0, 1.0, 0.0, 1.0]) == pytest.approx(math.sqrt(0.4))
    assert math.isnan(st.slope([1.0])) and math.isnan(st.detrended_std([1.0, 2.0]))


def test_trailing_spike_is_a_jump_against_the_recent_median():
    # step 4 (index 3): 10 / median(1, 2, 3) = 5; from 3 prior values on
    assert st.trailing_spike([1.0, 2.0, 3.0, 10.0]) == pytest.approx(5.0)
    # only the last 5 count: 12 / median(2, 2, 2, 2, 2), not / the run's median
    assert st.trailing_spike([100.0, 2.0, 2.0, 2.0, 2.0, 2.0, 12.0]) == pytest.approx(6.0)
    assert math.isnan(st.trailing_spike([1.0, 2.0, 3.0]))  # no step has 3 before it


def test_a_decaying_grad_norm_is_no_spike():
    # The H200 1B knobs run (seed 0): the grad norm falls 31.7 -> 0.00002 as the loss converges;
    # max over the run's median read 2,581 ("noisy"), against the recent past it never rises.
    decay = [31.66, 31.57, 31.85, 31.59, 2.116, 0.3104, 0.0684, 0.0204, 0.0042, 0.0012, 0.0003, 0.0002,
             0.0001, 0.00004, 0.00002, 0.00002]
    assert st.trailing_spike(decay) < 1.01
    # beta schedule, seed 0: 0.0022 after ~0 at the last step, under 1% of step 1's 45: no spike
    converged = [44.96, 89.23, 122.8, 117.9, 103.2, 92.11, 73.96, 64.34, 6.437, 4.321, 1.061, 0.8939,
                 0.222, 0.0716, 0.0135, 0.0019, 0.00001, 0.00001, 0.00001, 0.0022]
    assert st.trailing_spike(converged) < st.NOISY_GRAD_SPIKE


def test_monotone_fit_and_spread_hand_worked():
    assert st.monotone_fit([3.0, 1.0, 2.0, 0.0]) == [3.0, 1.5, 1.5, 0.0]  # 1, 2 pooled
    assert st.monotone_spread([0.69, 0.69, 0.02, 0.002, 0.0]) == pytest.approx(0.0)  # one drop: no spread
    # residuals (0, -0.5, 0.5, 0): ss 0.5 over n - 1 = 3
    assert st.monotone_spread([3.0, 1.0, 2.0, 0.0]) == pytest.approx(math.sqrt(0.5 / 3))
    assert math.isnan(st.monotone_spread([1.0, 2.0]))


def test_a_loss_that_drops_at_once_is_stable_not_noisy():
    # The H200 1B learning runs: ln 2 for the first pass over the pairs, then ~0 once they
    # repeat. Around a straight line that reads 30% of ln 2 (all 31 such runs were "noisy").
    drop = [LN2, 0.6868, 0.6950, 0.6912, 0.0199, 0.0023, 0.0005, 0.0002] + [0.00001] * 8
    assert st.detrended_std(drop) > st.NOISY_SPREAD_FRACTION * LN2
    assert st.verdict(drop, [31.7, 31.6, 31.8, 31.6, 2.1, 0.31, 0.07, 0.02] + [0.0001] * 8) == "stable"


def test_rollback_fires_after_five_consecutive_steps_above_1_5():
    assert st.rollback_step([1.6, 1.6, 1.6, 1.6, 1.0, 1.6, 1.6, 1.6, 1.6, 1.6, 1.6]) == 10
    assert st.rollback_step([1.6] * 4 + [1.5] + [1.6] * 4) is None  # 1.5 is not above 1.5
    assert st.rollback_step([2.0, math.nan, 2.0, 2.0, 2.0, 2.0]) is None  # NaN breaks the streak


LN2 = math.log(2)


@pytest.mark.parametrize("losses, grads, expected", [
    ([LN2 - 0.03 * k for k in range(10)], [1.0] * 10, "stable"),  # falls on a line
    ([LN2 + (0.1 if k % 2 else -0.1) for k in range(10)], [1.0] * 10, "noisy"),  # saw-tooth, 14% of ln 2
    ([LN2] * 9 + [LN2], [1.0] * 8 + [6.0, 1.0], "noisy"),  # one grad-norm spike of 6x the median
    ([LN2 + 0.02 * k for k in range(10)], [1.0] * 10, "diverging"),  # rises 0.18 = 26% of ln 2
    ([LN2, 0.6, math.nan], [1.0, 1.0, 1.0], "diverging"),  # non-finite
    ([LN2, 0.6, 0.5, 0.4], [1.0] * 4, ""),  # too few steps to judge
])
def test_verdict(losses, grads, expected):
    assert st.verdict(losses, grads) == expected


def test_thresholds_sit_between_the_measured_cases():
    # The H200's same-maths bf16 spread (0.023 at ln 2) is stable; the 10% line is above it.
    wobble = [LN2 - 0.01 * k + (0.023 if k % 2 else -0.023) for k in range(12)]
    assert st.monotone_spread(wobble) < st.NOISY_SPREAD_FRACTION * LN2
    assert st.verdict(wobble, [1.0] * 12) == "stable"


def test_signals_report_the_rollback_and_call_it_diverging():
    n = 8
    sig = st.signals([LN2 - 0.02 * k for k in range(n)], [1.0] * n, [0.1, 0.5, 1.6, 1.7, 1.8, 1.9, 2.0, 2.1],
                     [0.5 + 0.05 * k for k in range(n)], [0.1 * k for k in range(n)])
    assert sig["rollback_step"] == 7 and sig["stability"] == "diverging"
    assert sig["logratio_std_max"] == pytest.approx(2.1)
    assert sig["reward_accuracy_slope"] == pytest.approx(0.05) and sig["reward_margin_slope"] == pytest.approx(0.1)
    assert sig["loss_slope"] == pytest.approx(-0.02) and sig["grad_norm_spike"] == pytest.approx(1.0)
    assert sig["loss_spread"] == pytest.approx(0.0, abs=1e-12)  # falls on a line: no rise
    from dpo_sweep.records import RESULTS_COLUMNS
    assert set(sig) <= set(RESULTS_COLUMNS)  # each signal is a typed results.csv column


FALL_8_CLIMB_8 = [LN2 - 0.01 * k for k in range(9)] + [LN2 - 0.08 + 0.011 * k for k in range(1, 9)]
FALL_6_CLIMB_10 = [LN2 - 0.01 * k for k in range(7)] + [LN2 - 0.06 + 0.007 * k for k in range(1, 11)]


@pytest.mark.parametrize("losses, grads", [
    (FALL_8_CLIMB_8, [1.0] * 17),  # back above its start: a line through it is nearly flat
    (FALL_6_CLIMB_10, [1.0] * 17),
    ([LN2 - 0.002 * k for k in range(16)], [1.7**k for k in range(16)]),  # never 5x its last 5's median
])
def test_a_late_rise_and_a_growing_grad_norm_are_diverging(losses, grads):
    assert FALL_8_CLIMB_8[-1] > LN2 and FALL_6_CLIMB_10[-1] > LN2
    assert st.verdict(losses, grads) == "diverging"


def test_a_late_rise_is_measured_against_the_step_noise():
    rise, noise = st.late_rise(FALL_8_CLIMB_8)  # w = 4: the last 4 steps' mean vs the lowest 4's
    last4 = -0.08 + 0.011 * (5 + 6 + 7 + 8) / 4  # relative to ln 2
    valley = -(0.06 + 0.07 + 0.08 + 0.069) / 4  # steps 7-10: falling 6, 7, 8 below, then 0.011 back
    assert rise == pytest.approx(last4 - valley)
    assert noise == pytest.approx(0.0, abs=1e-12)  # straight segments and one kink: no noise
    # The same climb buried in a saw-tooth of +-0.05 is within its noise: not a late rise.
    wobble = [v + (0.05 if k % 2 else -0.05) for k, v in enumerate(FALL_8_CLIMB_8)]
    assert st.verdict(wobble, [1.0] * 17) != "diverging"
    # A fall that levels off, and a grad norm that rises 3x early on then decays, are stable.
    assert st.verdict([LN2 * max(0.2, 1 - 0.1 * k) for k in range(16)], [45.0, 89.0, 123.0] + [60.0 / (k + 1) for k in range(13)]) == "stable"


def test_fp16_overflow_steps_are_skipped_not_diverging():
    from dpo_sweep.records import StepRecord
    from dpo_sweep.train.loop import divergence

    losses, grads = [LN2 - 0.03 * k for k in range(10)], [1.0, math.inf, 1.0, 1.0, math.nan] + [1.0] * 5
    assert st.verdict(losses, grads, precision="fp16") == "stable"
    assert st.verdict(losses, grads, precision="bf16") == "diverging"
    assert st.signals(losses, grads, [0.1] * 10, [0.5] * 10, [0.0] * 10, precision="fp16")["stability"] == "stable"
    # The trainer's rule is the same: the trial goes on under fp16, stops under bf16.
    step = StepRecord("t", 2, LN2, math.inf, 100.0, 1.0, 0.5, 0.0, -10.0, -11.0, 0.0)
    assert divergence(step, "fp16") == ""
    assert divergence(step, "bf16") == "non-finite grad_norm at step 2"
    # A run whose every step overflowed took no optimizer step: no verdict.
    assert st.verdict(losses, [math.inf] * 10, precision="fp16") == ""
