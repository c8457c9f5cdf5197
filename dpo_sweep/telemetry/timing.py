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

from dpo_sweep.records import steady_micro_ms


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


#: Where a trial's start-up goes, in order (:meth:`TrialClock.mark`).
STARTUP_PHASES = ("ray", "import", "data", "model")


class TrialClock:
    """The one definition of a trial's ``startup_s`` and ``measure_s`` (results.csv), for every
    row whoever runs the trial (``dpo-sweep trial`` or a sweep's Ray Train worker):

    - ``startup_s``: the trial's start -> the start of its first optimizer step;
    - ``measure_s``: the start of the first optimizer step -> the end of the latest one, warm-up
      steps included (the medians leave warm-up out; this is the time the steps took).

    The start-up's split (results.csv ``startup_<phase>_s``, :data:`STARTUP_PHASES`): each
    :meth:`mark` ends a phase that began at the previous mark (the first at the trial's start):
    ``ray`` (the Tune trial's start -> the trainer's process running this trial), ``import`` (the
    trainer imported: 0 in a warm worker), ``data`` (read and tokenised), ``model`` (models,
    reference, checkpointing and optimizer built). What follows the last mark until the first
    step is in ``startup_s`` only.

    The trial's start is what the caller passes: a sweep passes the Tune trial's start, so Ray's
    worker start-up counts as start-up; ``dpo-sweep trial`` passes ``run_trial``'s entry. Wall
    clock (``time.time()``): on a multi-node cluster the Tune trial and rank 0 may sit on
    different hosts (NTP-synchronised clocks assumed: milliseconds against seconds of start-up).
    """

    def __init__(self, started_at: float | None = None, *, clock: Callable[[], float] = time.time):
        self._clock = clock
        self.started_at = clock() if started_at is None else float(started_at)
        self.first_step_at: float | None = None
        self.last_step_end: float | None = None
        self._phases: dict[str, float] = {}
        self._last_mark = self.started_at

    def mark(self, phase: str, at: float | None = None) -> None:
        """End ``phase`` (one of :data:`STARTUP_PHASES`) now, or at the clock reading ``at``."""
        if phase not in STARTUP_PHASES:
            raise ValueError(f"unknown start-up phase {phase!r}; one of {STARTUP_PHASES}")
        now = self._clock() if at is None else float(at)
        self._phases[phase] = self._phases.get(phase, 0.0) + now - self._last_mark
        self._last_mark = now

    def startup_split(self) -> dict[str, float]:
        """``{"startup_ray_s": ..., ...}`` for results.csv: NaN for a phase never marked."""
        return {f"startup_{p}_s": self._phases.get(p, math.nan) for p in STARTUP_PHASES}

    def step_started(self) -> None:
        if self.first_step_at is None:
            self.first_step_at = self._clock()

    def step_ended(self) -> None:
        self.last_step_end = self._clock()

    def startup_s(self) -> float:
        return math.nan if self.first_step_at is None else self.first_step_at - self.started_at

    def measure_s(self) -> float:
        if self.first_step_at is None or self.last_step_end is None:
            return math.nan
        return self.last_step_end - self.first_step_at


class PhaseMarks:
    """Time between marks inside one optimizer step, without adding a CPU-GPU sync point.

    On CUDA each mark records an event on the current stream (no host wait); the durations are
    read after the step's own end-of-step synchronise (:meth:`StepTimer.end_step`), when every
    event has completed. On the CPU the work is synchronous and ``perf_counter`` is enough.
    """

    def __init__(self, device: torch.device | str, *, clock: Callable[[], float] = time.perf_counter):
        self.device = torch.device(device)
        self._clock = clock
        self._marks: list = []

    def mark(self) -> None:
        if self.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._marks.append(event)
        else:
            self._marks.append(self._clock())

    def durations_ms(self) -> list[float]:
        """Milliseconds between consecutive marks; call after the step synchronised."""
        if self.device.type == "cuda":
            return [a.elapsed_time(b) for a, b in zip(self._marks, self._marks[1:])]
        return [(b - a) * 1e3 for a, b in zip(self._marks, self._marks[1:])]


def micro_and_optimizer_ms(durations_ms: Sequence[float], last_syncs: bool = False,
                           new: Sequence[bool] = ()) -> tuple[float, float]:
    """``(micro_step_ms, optimizer_ms)`` of one step from :class:`PhaseMarks` durations (one per
    micro-step, then the optimizer phase). The micro-step time is the steady one that every
    micro-step but the first repeats: the median of the micro-steps that add into gradients
    already there. The first after ``zero_grad`` writes fresh gradient buffers and is faster, so
    timing it alone puts an extrapolation to a large grad_acc a few percent low
    (benchmarks/README.md#step-timing-and-extrapolation). ``last_syncs``: the last micro-step
    carries the gradient all-reduce (DDP syncs only there, once per step like the optimizer
    phase) and is left out when another accumulating one is there. With one micro-step, that one.
    ``new``: per micro-step, whether its shape ran first in the process; those are left out while
    another is there. On CUDA such a micro-step also builds the kernel plans a long run builds
    once (sdpa's cuDNN attention, per shape), which can cost half a micro-step more
    (benchmarks/README.md#step-timing-and-extrapolation)."""
    if len(durations_ms) < 2:
        return math.nan, math.nan
    return statistics.median(steady_micro_ms(durations_ms, last_syncs, new)), durations_ms[-1]

