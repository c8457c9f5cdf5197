"""Wall time of optimizer steps, with the device synchronised at each step boundary.

CUDA kernels run asynchronously: without a synchronise, ``perf_counter`` around a step measures
how fast Python queued the kernels, not how long the GPU took. Both ends of a step therefore
synchronise (a CPU-GPU sync point: it drains the queue, which is what a step's wall time means).
Warm-up steps (allocator growth, cuBLAS heuristics, autotuning) are recorded but left out of the
median and the p10/p90 spread.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Callable, Sequence

import torch


def percentile(values: Sequence[float], q: float) -> float:
    """q-th percentile with linear interpolation between order statistics (numpy's default).

    nan for an empty sequence.
    """
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in [0, 100], got {q}")
    if not values:
        return math.nan
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    lower = math.floor(position)
    upper = min(lower + 1, len(ordered) - 1)
    fraction = position - lower
    return ordered[lower] + (ordered[upper] - ordered[lower]) * fraction


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work; a no-op on CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


class StepTimer:
    """Times each optimizer step; statistics cover the steps after ``warmup_steps``."""

    def __init__(
        self,
        device: torch.device | str,
        warmup_steps: int,
        *,
        clock: Callable[[], float] = time.perf_counter,
    ):
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        self.device = torch.device(device)
        self.warmup_steps = int(warmup_steps)
        self.step_times_ms: list[float] = []
        self._clock = clock
        self._step_started_at: float | None = None

    def start_step(self) -> None:
        synchronize(self.device)  # the previous step's kernels must not leak into this step
        self._step_started_at = self._clock()

    def end_step(self, counted: bool = True) -> float:
        """Synchronise and return this step's wall time in ms; recorded unless not ``counted``
        (a step outside the statistics, such as the worst-case step)."""
        if self._step_started_at is None:
            raise RuntimeError("StepTimer.end_step() called without start_step()")
        synchronize(self.device)
        step_time_ms = (self._clock() - self._step_started_at) * 1e3
        self._step_started_at = None
        if counted:
            self.step_times_ms.append(step_time_ms)
        return step_time_ms

    def measured_ms(self) -> list[float]:
        """Step times after warm-up."""
        return self.step_times_ms[self.warmup_steps:]

    def median_ms(self) -> float:
        measured = self.measured_ms()
        return statistics.median(measured) if measured else math.nan

    def p10_ms(self) -> float:
        return percentile(self.measured_ms(), 10)

    def p90_ms(self) -> float:
        return percentile(self.measured_ms(), 90)
