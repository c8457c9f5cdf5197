"""Telemetry on a real GPU: NVML peaks against known allocations, device mapping, synced timing.

Run: python3 -m pytest tests/gpu/test_telemetry_gpu.py   (skipped without CUDA)

Assumes nothing else allocates on the GPU while it runs (the NVML number is device-wide).
Allocations are ``torch.empty`` of uint8: cudaMalloc commits the memory at once, so NVML sees it
without the tensor being written.
"""

from __future__ import annotations

import math
import time

import pytest
import torch

from dpo_sweep.telemetry import StepTimer, environment_info, make_memory_sampler
from dpo_sweep.telemetry.nvml import _as_str, _normalise_uuid

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

GB = 1e9
# NVML vs expectation: the allocator rounds to 2 MB blocks and the driver may move a few MB of
# its own; 0.3 GB is generous for that and still far below the 2 GB / 6 GB being checked.
MARGIN_GB = 0.3


@pytest.fixture
def device():
    device = torch.device("cuda", torch.cuda.current_device())
    torch.zeros(1, device=device)  # create the CUDA context before any baseline is taken
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    yield device
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()


def _allocate_gb(gb: float, device: torch.device) -> torch.Tensor:
    tensor = torch.empty(int(gb * GB), dtype=torch.uint8, device=device)
    torch.cuda.synchronize(device)
    return tensor


def _reserved_gb(device: torch.device) -> float:
    return torch.cuda.memory_reserved(device) / GB


def test_peak_rises_by_the_allocated_size_and_matches_torch_reserved_plus_context(device):
    sampler = make_memory_sampler(device)
    assert sampler.source == "nvml", "NVML should load on a CUDA machine with nvidia-ml-py"
    with sampler:
        sampler.reset_peak()
        baseline_gb = sampler.sample_now()
        # what NVML sees beyond torch's pool: CUDA context, cuBLAS workspace, other libraries
        context_gb = baseline_gb - _reserved_gb(device)
        allocated0_gb = torch.cuda.memory_allocated(device) / GB

        two = _allocate_gb(2.0, device)
        peak_gb = sampler.peak_gb()
        assert peak_gb - baseline_gb == pytest.approx(2.0, abs=MARGIN_GB)
        assert peak_gb == pytest.approx(_reserved_gb(device) + context_gb, abs=MARGIN_GB)

        six = _allocate_gb(6.0, device)
        peak_gb = sampler.peak_gb()
        assert peak_gb - baseline_gb == pytest.approx(8.0, abs=MARGIN_GB)
        assert peak_gb == pytest.approx(_reserved_gb(device) + context_gb, abs=MARGIN_GB)

        alloc_peak_gb, reserved_peak_gb = sampler.torch_peaks_gb()
        assert alloc_peak_gb - allocated0_gb == pytest.approx(8.0, abs=0.01)
        assert reserved_peak_gb + context_gb == pytest.approx(peak_gb, abs=MARGIN_GB)

        del two, six
        torch.cuda.empty_cache()
        sampler.reset_peak()  # new phase: the 8 GB are gone from the peak
        assert sampler.peak_gb() == pytest.approx(baseline_gb, abs=MARGIN_GB)
    assert len(sampler.timeline()) >= 2


def test_background_thread_catches_a_spike_that_is_gone_by_peak_time(device):
    sampler = make_memory_sampler(device, interval_s=0.02)
    with sampler:
        sampler.reset_peak()
        baseline_gb = sampler.sample_now()
        spike = _allocate_gb(4.0, device)
        seen = sampler.samples_taken
        deadline = time.monotonic() + 5.0
        while sampler.samples_taken < seen + 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        del spike
        torch.cuda.empty_cache()
        assert sampler.sample_now() - baseline_gb < MARGIN_GB  # freed before peak_gb() is asked
        assert sampler.peak_gb() - baseline_gb == pytest.approx(4.0, abs=MARGIN_GB)
    assert max(gb for _, gb in sampler.timeline()) - baseline_gb == pytest.approx(4.0, abs=MARGIN_GB)


def test_nvml_device_is_torchs_device(device):
    import pynvml

    sampler = make_memory_sampler(device)
    reader = sampler._reader
    props = torch.cuda.get_device_properties(device)
    nvml_uuid = _normalise_uuid(_as_str(pynvml.nvmlDeviceGetUUID(reader._handle)))
    assert nvml_uuid == _normalise_uuid(props.uuid)
    if hasattr(props, "pci_bus_id"):
        assert pynvml.nvmlDeviceGetPciInfo(reader._handle).bus == props.pci_bus_id
    sampler.close()


def test_process_used_is_nan_or_plausible(device):
    sampler = make_memory_sampler(device)
    keep = _allocate_gb(1.0, device)
    process_gb = sampler.process_used_gb()  # nan inside containers (NVML sees host pids)
    if not math.isnan(process_gb):
        assert 1.0 - MARGIN_GB <= process_gb <= sampler.sample_now() + 0.01
    del keep
    sampler.close()


def test_step_timer_waits_for_the_gpu(device):
    a = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
    timer = StepTimer(device, warmup_steps=1)
    for _ in range(4):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        timer.start_step()
        start.record()
        for _ in range(50):
            a = (a @ a).clamp_(-1, 1)
        end.record()
        step_ms = timer.end_step()
        # without the sync, the timer would see only the launch time (well under 1 ms)
        assert step_ms >= 0.95 * start.elapsed_time(end)
    assert timer.median_ms() > 1.0


def test_environment_info_on_gpu():
    info = environment_info()
    assert info["gpu_count"] >= 1 and info["gpu_name"]
    assert info["gpu_memory_gb"] > 1
    assert info["driver_version"] and info["cuda_version"]
