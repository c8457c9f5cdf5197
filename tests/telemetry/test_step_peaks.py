"""Per-step memory peaks through the trainer: each steps.csv row has its own step's peak, the
trial's is the max over the measured steps, and a failed trial's is the peak up to the failure."""
from __future__ import annotations

import math
import pickle

import pytest
import torch

import dpo_sweep.train.loop as loop
from dpo_sweep.telemetry import MemoryPeaks, MemorySampler, failure_peak_gb, max_peaks
from dpo_sweep.train.faults import InjectedFault

GB = 10**9


class PhasedReader:
    """A memory reader whose reading is one level per phase: the sampler's ``reset_peak`` (which
    resets the high-water mark) starts the next phase. Phase 0 is the model build."""

    source = "rss"

    def __init__(self, levels_gb: list[float]):
        self.levels_gb = levels_gb
        self.phase = 0

    def used_bytes(self) -> int:
        return int(self.levels_gb[min(self.phase, len(self.levels_gb) - 1)] * GB)

    def process_used_bytes(self) -> int | None:
        return None

    def reset_high_water_mark(self) -> None:
        self.phase += 1

    def high_water_mark_bytes(self) -> int | None:
        return None

    def close(self) -> None:
        pass


@pytest.fixture
def phased(monkeypatch):
    """``phased([build, step1, step2, ...])``: the trainer's sampler reads these levels (GB)."""

    def install(levels_gb: list[float]) -> None:
        monkeypatch.setattr(loop, "make_memory_sampler",
                            lambda device: MemorySampler(PhasedReader(levels_gb), device, interval_s=0.005))

    return install


def test_each_step_row_has_its_own_peak(phased, cfg_factory):
    # The build (model and reference copy) peaks at 9 GB; steps peak at 3, 5 and 2 GB.
    phased([9.0, 3.0, 5.0, 2.0])
    out = loop.run_trial(cfg_factory(steps=3, warmup_steps=1, worst_case_step=False), log=None)
    assert out.result.status == "ok"
    assert [s.peak_mem_gb for s in out.steps] == pytest.approx([3.0, 5.0, 2.0])
    assert out.result.peak_mem_gb == pytest.approx(5.0)  # max over the measured steps 2 and 3


def test_trial_peak_leaves_out_the_warm_up_steps(phased, cfg_factory):
    phased([9.0, 6.0, 2.0, 3.0])
    out = loop.run_trial(cfg_factory(steps=3, warmup_steps=1, worst_case_step=False), log=None)
    assert out.result.peak_mem_gb == pytest.approx(3.0)


def test_oom_row_has_the_peak_up_to_the_failure(phased, cfg_factory):
    # Steps 1 and 2 peak at 3 and 4 GB; step 3 reaches 7 GB before it runs out.
    phased([9.0, 3.0, 4.0, 7.0])
    out = loop.run_trial(cfg_factory(steps=4, warmup_steps=1, worst_case_step=False), log=None,
                         fault=InjectedFault(3, "oom"))
    assert out.result.status == "oom"
    assert out.result.peak_mem_gb == pytest.approx(7.0)
    assert [s.step for s in out.steps] == [1, 2]  # the steps before the failure are kept
    assert [s.peak_mem_gb for s in out.steps] == pytest.approx([3.0, 4.0])


def test_oom_that_propagates_carries_its_peak_through_pickling(phased, cfg_factory):
    # Ray Train path (catch_failures=False): the worker's exception is pickled to the trial process.
    phased([9.0, 3.0, 6.5])
    with pytest.raises(torch.OutOfMemoryError) as info:
        loop.run_trial(cfg_factory(steps=3, worst_case_step=False), log=None, catch_failures=False,
                       fault=InjectedFault(2, "oom"))
    assert failure_peak_gb(info.value) == pytest.approx(6.5)
    assert failure_peak_gb(pickle.loads(pickle.dumps(info.value))) == pytest.approx(6.5)


def test_max_peaks_is_field_wise_and_ignores_nan():
    got = max_peaks([MemoryPeaks(2.0, math.nan, 1.0), MemoryPeaks(1.0, 0.5, math.nan)])
    assert (got.peak_gb, got.torch_alloc_gb, got.torch_reserved_gb) == (2.0, 0.5, 1.0)
    assert all(math.isnan(v) for v in vars(max_peaks([])).values())
