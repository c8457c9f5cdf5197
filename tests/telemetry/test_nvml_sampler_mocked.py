"""The NVML sampler end to end with pynvml and torch.cuda mocked (runs on CPU)."""

from __future__ import annotations

import math
import os
import sys
import time
import warnings
from types import SimpleNamespace

import pynvml
import pytest
import torch

from dpo_sweep.telemetry import MemorySampler, TelemetryFallbackWarning, make_memory_sampler

GB = 10**9
CUDA0 = torch.device("cuda", 0)


def test_maps_torch_index_to_nvml_device_by_pci_bus(fake_nvml, fake_cuda):
    # torch's cuda:0 is the host's second GPU (as under CUDA_VISIBLE_DEVICES=1)
    fake_nvml.used_bytes = [1 * GB, 7 * GB, 2 * GB]
    sampler = make_memory_sampler(CUDA0, interval_s=0.001)
    assert sampler.source == "nvml"
    assert sampler._reader.nvml_index == 1
    assert sampler.sample_now() == pytest.approx(7.0)


def test_maps_by_uuid_when_torch_has_no_pci_fields(fake_nvml, fake_cuda):
    fake_cuda.props = SimpleNamespace(uuid="00000002-aaaa-bbbb-cccc-dddddddddddd")
    fake_nvml.used_bytes = [1 * GB, 7 * GB, 2 * GB]
    sampler = make_memory_sampler(CUDA0)
    assert sampler.source == "nvml"
    assert sampler._reader.nvml_index == 2
    assert sampler.sample_now() == pytest.approx(2.0)


def test_peak_timeline_and_reset_peak(fake_nvml, fake_cuda, wait_for):
    fake_nvml.used_bytes[1] = 1 * GB
    sampler = make_memory_sampler(CUDA0, interval_s=0.001)
    with sampler:
        wait_for(lambda: sampler.samples_taken >= 3)
        fake_nvml.used_bytes[1] = 5 * GB  # a spike only the thread sees ...
        seen = sampler.samples_taken
        wait_for(lambda: sampler.samples_taken >= seen + 3)
        fake_nvml.used_bytes[1] = 2 * GB  # ... gone before peak_gb() takes its own reading
        assert sampler.peak_gb() == pytest.approx(5.0)

        sampler.reset_peak()
        assert fake_cuda.reset_calls == [CUDA0]
        assert sampler.peak_gb() == pytest.approx(2.0)  # peak := current reading

        fake_nvml.used_bytes[1] = 3 * GB
        assert sampler.sample_now() == pytest.approx(3.0)
        assert sampler.peak_gb() == pytest.approx(3.0)

    timeline = sampler.timeline()
    times = [t for t, _ in timeline]
    assert times == sorted(times) and times[0] >= 0.0
    assert {gb for _, gb in timeline} <= {1.0, 2.0, 3.0, 5.0}
    assert max(gb for _, gb in timeline) == pytest.approx(5.0)


def test_stop_joins_the_thread(fake_nvml, fake_cuda, wait_for):
    sampler = make_memory_sampler(CUDA0, interval_s=0.001)
    sampler.start()
    thread = sampler._thread
    assert thread.daemon and thread.is_alive()
    wait_for(lambda: sampler.samples_taken >= 2)
    sampler.stop()
    assert not thread.is_alive() and not sampler.is_running
    calls_after_stop = fake_nvml.memory_info_calls
    # nothing samples any more
    time.sleep(0.02)
    assert fake_nvml.memory_info_calls == calls_after_stop
    sampler.stop()  # idempotent


def test_exception_in_thread_surfaces_from_stop(fake_nvml, fake_cuda, wait_for):
    sampler = make_memory_sampler(CUDA0, interval_s=0.001)
    fake_nvml.fail_memory_info_after = fake_nvml.memory_info_calls + 3
    sampler.start()
    wait_for(lambda: not sampler._thread.is_alive())
    with pytest.raises(RuntimeError, match="boom from the sampling thread"):
        sampler.stop()
    sampler.stop()  # raised once, not again


def _sampler_whose_thread_fails_soon(fake_nvml):
    sampler = make_memory_sampler(CUDA0, interval_s=0.001)
    fake_nvml.fail_memory_info_after = fake_nvml.memory_info_calls + 2
    return sampler


def test_body_exception_wins_over_thread_exception(fake_nvml, fake_cuda, wait_for):
    sampler = _sampler_whose_thread_fails_soon(fake_nvml)
    with pytest.raises(KeyError, match="from the body"):
        with sampler:
            wait_for(lambda: not sampler._thread.is_alive())
            raise KeyError("from the body")


def test_context_manager_reraises_thread_exception(fake_nvml, fake_cuda, wait_for):
    sampler = _sampler_whose_thread_fails_soon(fake_nvml)
    with pytest.raises(RuntimeError, match="boom"):
        with sampler:
            wait_for(lambda: not sampler._thread.is_alive())


def test_start_twice_is_an_error(fake_nvml, fake_cuda):
    sampler = make_memory_sampler(CUDA0, interval_s=0.001)
    with sampler:
        with pytest.raises(RuntimeError, match="already running"):
            sampler.start()


def test_torch_peaks_on_cuda(fake_nvml, fake_cuda):
    sampler = make_memory_sampler(CUDA0)
    assert sampler.torch_peaks_gb() == (pytest.approx(3.0), pytest.approx(4.0))


def test_process_used_gb(fake_nvml, fake_cuda):
    sampler = make_memory_sampler(CUDA0)
    me, other = os.getpid(), os.getpid() + 1
    fake_nvml.processes = [SimpleNamespace(pid=other, usedGpuMemory=9 * GB),
                           SimpleNamespace(pid=me, usedGpuMemory=int(1.5 * GB))]
    assert sampler.process_used_gb() == pytest.approx(1.5)
    fake_nvml.processes = [SimpleNamespace(pid=other, usedGpuMemory=9 * GB)]  # container pid view
    assert math.isnan(sampler.process_used_gb())
    fake_nvml.processes = [SimpleNamespace(pid=me, usedGpuMemory=None)]  # withheld by the driver
    assert math.isnan(sampler.process_used_gb())
    fake_nvml.processes = pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
    assert math.isnan(sampler.process_used_gb())


def test_close_shuts_nvml_down_once(fake_nvml, fake_cuda):
    sampler = make_memory_sampler(CUDA0)
    assert fake_nvml.init_calls == 1
    sampler.close()
    sampler.close()
    assert fake_nvml.shutdown_calls == 1


def _fallbacks(record) -> list:
    return [w for w in record if issubclass(w.category, TelemetryFallbackWarning)]


def test_nvml_init_failure_falls_back_to_rss_with_one_warning(monkeypatch, fake_cuda):
    def no_library():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_library)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        first = make_memory_sampler(CUDA0)
        second = make_memory_sampler(CUDA0)  # a second trial in the same process
    assert first.source == second.source == "rss"
    assert len(_fallbacks(record)) == 1
    assert "host RSS" in str(_fallbacks(record)[0].message)
    assert first.sample_now() > 0
    # torch's own counters still work on the (fallback) CUDA device
    assert first.torch_peaks_gb() == (pytest.approx(3.0), pytest.approx(4.0))


def test_pynvml_not_installed_falls_back_to_rss(monkeypatch, fake_cuda):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    with pytest.warns(TelemetryFallbackWarning, match="pynvml"):
        sampler = make_memory_sampler(CUDA0)
    assert sampler.source == "rss"


def test_unmatched_device_falls_back_to_rss(fake_nvml, fake_cuda):
    fake_cuda.props = SimpleNamespace(pci_domain_id=0, pci_bus_id=0x99, pci_device_id=0, uuid="ffff")
    with pytest.warns(TelemetryFallbackWarning, match="no NVML device matches"):
        sampler = make_memory_sampler(CUDA0)
    assert sampler.source == "rss"
    assert fake_nvml.shutdown_calls == fake_nvml.init_calls == 1  # init balanced on failure


def test_cpu_device_uses_rss_without_warning(fake_nvml):
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        sampler = make_memory_sampler(torch.device("cpu"))
    assert sampler.source == "rss"
    assert not _fallbacks(record)
    assert fake_nvml.init_calls == 0
    assert all(math.isnan(x) for x in sampler.torch_peaks_gb())
    assert math.isnan(sampler.process_used_gb())


def test_interval_must_be_positive(fake_nvml):
    from dpo_sweep.telemetry.host import RssReader

    with pytest.raises(ValueError, match="interval_s"):
        MemorySampler(RssReader(), torch.device("cpu"), interval_s=0)
