"""StepTimer: warm-up exclusion, median/p90 (fake clock), device syncs, and a real-clock check."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
import torch

from dpo_sweep.telemetry import StepTimer, percentile


class FakeClock:
    """Advances only when told: step k lasts durations_s[k]."""

    def __init__(self):
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def run_steps(timer: StepTimer, clock: FakeClock, durations_ms: list[float]) -> list[float]:
    returned = []
    for duration_ms in durations_ms:
        timer.start_step()
        clock.now_s += duration_ms / 1e3
        returned.append(timer.end_step())
        clock.now_s += 0.5  # time between steps (logging, data) is not counted
    return returned


def test_warmup_excluded_median_and_p90():
    clock = FakeClock()
    timer = StepTimer(torch.device("cpu"), warmup_steps=2, clock=clock)
    returned = run_steps(timer, clock, [100.0, 50.0, 10.0, 20.0, 30.0, 40.0])
    assert returned == pytest.approx([100.0, 50.0, 10.0, 20.0, 30.0, 40.0])
    assert timer.step_times_ms == pytest.approx(returned)
    assert timer.measured_ms() == pytest.approx([10.0, 20.0, 30.0, 40.0])
    assert timer.median_ms() == pytest.approx(25.0)
    # p90 of [10, 20, 30, 40]: position 0.9 * 3 = 2.7 -> 30 + 0.7 * (40 - 30) = 37
    assert timer.p90_ms() == pytest.approx(37.0)
    # p10: position 0.1 * 3 = 0.3 -> 10 + 0.3 * (20 - 10) = 13
    assert timer.p10_ms() == pytest.approx(13.0)


def test_no_measured_steps_gives_nan():
    clock = FakeClock()
    timer = StepTimer("cpu", warmup_steps=3, clock=clock)
    assert math.isnan(timer.median_ms()) and math.isnan(timer.p90_ms()) and math.isnan(timer.p10_ms())
    run_steps(timer, clock, [5.0, 5.0, 5.0])
    assert timer.measured_ms() == []
    assert math.isnan(timer.median_ms()) and math.isnan(timer.p90_ms()) and math.isnan(timer.p10_ms())
    run_steps(timer, clock, [7.0])
    assert timer.median_ms() == pytest.approx(7.0) and timer.p90_ms() == pytest.approx(7.0)


def test_misuse_is_refused():
    timer = StepTimer("cpu", warmup_steps=0)
    with pytest.raises(RuntimeError, match="without start_step"):
        timer.end_step()
    with pytest.raises(ValueError, match="warmup_steps"):
        StepTimer("cpu", warmup_steps=-1)


def test_cuda_steps_synchronise_at_both_ends(fake_cuda):
    clock = FakeClock()
    timer = StepTimer(torch.device("cuda", 0), warmup_steps=0, clock=clock)
    run_steps(timer, clock, [3.0, 4.0])
    assert fake_cuda.synchronize_calls == [torch.device("cuda", 0)] * 4


def test_real_clock_measures_a_sleep():
    timer = StepTimer("cpu", warmup_steps=1)
    for _ in range(3):
        timer.start_step()
        time.sleep(0.02)
        timer.end_step()
    assert len(timer.measured_ms()) == 2
    # sleep never returns early; the upper bound only guards against a unit error (s vs ms)
    assert all(19.0 <= ms < 1000.0 for ms in timer.step_times_ms)


@pytest.mark.parametrize("q", [0, 10, 50, 90, 99, 100])
def test_percentile_matches_numpy_linear(q):
    values = list(np.random.default_rng(q).normal(50.0, 10.0, size=37))
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_percentile_edge_cases():
    assert math.isnan(percentile([], 90))
    assert percentile([4.0], 90) == 4.0
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_phase_marks_time_the_micro_steps_and_the_optimizer_phase():
    from dpo_sweep.telemetry.timing import PhaseMarks, micro_and_optimizer_ms

    ticks = iter([0.0, 0.100, 0.210, 0.330, 0.360])  # micro-steps of 100, 110, 120 ms, optimizer 30 ms
    marks = PhaseMarks("cpu", clock=lambda: next(ticks))
    for _ in range(5):
        marks.mark()
    durations = marks.durations_ms()
    assert durations == pytest.approx([100.0, 110.0, 120.0, 30.0])
    # The first micro-step (fresh gradient buffers) is left out: the steady ones accumulate.
    assert micro_and_optimizer_ms(durations) == pytest.approx((115.0, 30.0))
    # Under DDP the last one carries the all-reduce and is left out too, where another remains.
    assert micro_and_optimizer_ms(durations, last_syncs=True) == pytest.approx((110.0, 30.0))
    assert micro_and_optimizer_ms([100.0, 110.0, 30.0], last_syncs=True) == (110.0, 30.0)
    assert micro_and_optimizer_ms([80.0, 20.0]) == (80.0, 20.0)  # grad_acc 1: its one micro-step
    assert all(math.isnan(x) for x in micro_and_optimizer_ms([]))


def test_the_trainer_records_where_each_step_went():
    """A CPU trial: micro-steps and the optimizer phase are inside the step and add up to most of it."""
    from dpo_sweep.train.loop import run_trial
    from tests.testkit import make_cfg

    out = run_trial(make_cfg(micro_batch=2, grad_acc=3, steps=2), log=None)
    for s in out.steps:
        assert 0 < s.optimizer_ms and 0 < s.micro_step_ms
        # the accumulating micro-steps, the optimizer phase, and the first micro-step is the rest (the
        # worst-case step runs 2 micro-steps: order.WORST_CASE_MICRO_STEPS)
        assert (s.grad_acc - 1) * s.micro_step_ms + s.optimizer_ms < s.step_time_ms


def test_micro_steps_of_a_shape_the_process_ran_first_are_left_out_while_others_remain():
    from dpo_sweep.telemetry.timing import micro_and_optimizer_ms

    # micro-steps 1 and 3 of their shape's first (CUDA: kernel plans built, ~100 ms more)
    durations = [100.0, 270.0, 170.0, 268.0, 172.0, 30.0]
    assert micro_and_optimizer_ms(durations) == pytest.approx((220.0, 30.0))
    assert micro_and_optimizer_ms(durations, new=[False, True, False, True, False]) == pytest.approx((171.0, 30.0))
    # every accumulating one new: they are what there is
    assert micro_and_optimizer_ms([100.0, 270.0, 268.0, 30.0], new=[False, True, True]) == pytest.approx((269.0, 30.0))
    # flags that do not match the micro-steps are not read
    assert micro_and_optimizer_ms(durations, new=[True]) == micro_and_optimizer_ms(durations)
