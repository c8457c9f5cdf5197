"""The RSS fallback sampler, end to end on this machine, and its /proc parsing."""

from __future__ import annotations

import math
import sys

import pytest
import torch

from dpo_sweep.telemetry import make_memory_sampler
from dpo_sweep.telemetry.host import RssReader, getrusage_max_rss_bytes, read_proc_status_bytes

BUFFER_BYTES = 200_000_000  # 0.2 GB
BUFFER_GB = BUFFER_BYTES / 1e9
# The process's other memory moves a little between readings (allocator, pytest); 30 MB slack.
TOLERANCE_GB = 0.03

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/status")


def _touched_buffer() -> torch.Tensor:
    # ones, not empty: pages count towards RSS only once written
    return torch.ones(BUFFER_BYTES // 4, dtype=torch.float32)


@linux_only
def test_rss_peak_moves_with_a_200mb_buffer_and_resets(wait_for):
    sampler = make_memory_sampler(torch.device("cpu"), interval_s=0.001)
    assert sampler.source == "rss"
    with sampler:
        sampler.reset_peak()
        baseline_gb = sampler.sample_now()
        buffer = _touched_buffer()
        during_gb = sampler.sample_now()
        seen = sampler.samples_taken
        wait_for(lambda: sampler.samples_taken >= seen + 2)  # the thread sees it too
        del buffer
        after_free_gb = sampler.sample_now()
        peak_gb = sampler.peak_gb()

        assert during_gb - baseline_gb == pytest.approx(BUFFER_GB, abs=TOLERANCE_GB)
        assert peak_gb - baseline_gb == pytest.approx(BUFFER_GB, abs=TOLERANCE_GB)
        assert after_free_gb - baseline_gb < TOLERANCE_GB  # 200 MB is mmap'd: freed at once

        sampler.reset_peak()  # new phase: the buffer's peak is gone
        assert sampler.peak_gb() - baseline_gb < TOLERANCE_GB

    # The timeline holds the samples; the peak is also the kernel's high-water mark, which can be a
    # page or so above every sample (a fresh clone's run saw 4,096 bytes): at most the peak, near it.
    highest = max(gb for _, gb in sampler.timeline())
    assert highest <= peak_gb + 1e-9 and peak_gb - highest < TOLERANCE_GB, (highest, peak_gb)
    assert all(math.isnan(x) for x in sampler.torch_peaks_gb())


@linux_only
def test_spike_between_samples_is_caught_by_the_reset_high_water_mark():
    sampler = make_memory_sampler(torch.device("cpu"), interval_s=3600)  # the thread never wakes
    with sampler:
        sampler.reset_peak()
        if not sampler._reader._hwm_reset_ok:
            pytest.skip("/proc/self/clear_refs not writable here; sampled peak only")
        baseline_gb = sampler.sample_now()
        buffer = _touched_buffer()
        del buffer  # allocated and freed with no sample in between
        assert sampler.peak_gb() - baseline_gb == pytest.approx(BUFFER_GB, abs=TOLERANCE_GB)


def test_proc_status_parsing(tmp_path):
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\nThreads:\t3\n")
    assert read_proc_status_bytes("VmRSS", status) == 102400 * 1024
    assert read_proc_status_bytes("VmHWM", status) == 204800 * 1024
    assert read_proc_status_bytes("VmSwap", status) is None
    assert read_proc_status_bytes("VmRSS", tmp_path / "missing") is None

    reader = RssReader(status_path=status, clear_refs_path=tmp_path / "no-dir" / "clear_refs")
    assert reader.used_bytes() == 102400 * 1024
    reader.reset_high_water_mark()  # the write fails: VmHWM must not be trusted
    assert reader.high_water_mark_bytes() is None

    reader = RssReader(status_path=status, clear_refs_path=tmp_path / "clear_refs")
    reader.reset_high_water_mark()
    assert (tmp_path / "clear_refs").read_text() == "5"
    assert reader.high_water_mark_bytes() == 204800 * 1024


def test_without_proc_falls_back_to_getrusage(tmp_path):
    reader = RssReader(status_path=tmp_path / "missing")
    assert reader.used_bytes() == pytest.approx(getrusage_max_rss_bytes(), rel=0.5)
    assert reader.used_bytes() > 0
    reader.reset_high_water_mark()
    assert reader.high_water_mark_bytes() is None
    assert reader.process_used_bytes() is None
