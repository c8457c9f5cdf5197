"""Fixtures for the telemetry tests: a fake NVML (pynvml monkeypatched) and fake torch.cuda."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pynvml
import pytest
import torch

from dpo_sweep.telemetry import sampler as sampler_module

GB = 10**9


def wait_until(predicate, timeout_s: float = 5.0, poll_s: float = 0.001) -> None:
    """Poll instead of sleeping a fixed time: fast when the thread is quick, no flakiness when slow."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached within timeout")
        time.sleep(poll_s)


class FakeNvml:
    """Three GPUs on buses 0x1A, 0x3B, 0x5C; memory per device set by the test."""

    def __init__(self):
        self.buses = [0x1A, 0x3B, 0x5C]
        self.used_bytes = [0, 0, 0]
        self.memory_info_calls = 0
        self.fail_memory_info_after: int | None = None  # raise from the N+1-th call on
        self.processes: list | Exception = []
        self.init_calls = 0
        self.shutdown_calls = 0
        self.lock = threading.Lock()

    def uuid(self, index: int) -> str:
        return f"GPU-0000000{index}-aaaa-bbbb-cccc-dddddddddddd"

    # the pynvml functions the telemetry code calls
    def nvmlInit(self):
        self.init_calls += 1

    def nvmlShutdown(self):
        self.shutdown_calls += 1

    def nvmlDeviceGetCount(self):
        return len(self.buses)

    def nvmlDeviceGetHandleByIndex(self, index):
        return ("handle", index)

    def nvmlDeviceGetPciInfo(self, handle):
        return SimpleNamespace(domain=0, bus=self.buses[handle[1]], device=0)

    def nvmlDeviceGetUUID(self, handle):
        return self.uuid(handle[1])

    def nvmlDeviceGetName(self, handle):
        return b"NVIDIA H200"  # older pynvml returns bytes

    def nvmlDeviceGetMemoryInfo(self, handle):
        with self.lock:
            self.memory_info_calls += 1
            calls = self.memory_info_calls
        if self.fail_memory_info_after is not None and calls > self.fail_memory_info_after:
            raise RuntimeError("boom from the sampling thread")
        return SimpleNamespace(used=self.used_bytes[handle[1]], total=141 * GB, free=0)

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        if isinstance(self.processes, Exception):
            raise self.processes
        return self.processes


@pytest.fixture
def fake_nvml(monkeypatch):
    fake = FakeNvml()
    for name in ("nvmlInit", "nvmlShutdown", "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex",
                 "nvmlDeviceGetPciInfo", "nvmlDeviceGetUUID", "nvmlDeviceGetName", "nvmlDeviceGetMemoryInfo",
                 "nvmlDeviceGetComputeRunningProcesses"):
        monkeypatch.setattr(pynvml, name, getattr(fake, name))
    return fake


class FakeCuda:
    """torch.cuda as seen by the sampler, on a CPU-only torch. cuda:0 is the host's GPU 1 (bus 0x3B)."""

    def __init__(self, fake_nvml: FakeNvml):
        self.props = SimpleNamespace(pci_domain_id=0, pci_bus_id=0x3B, pci_device_id=0,
                                     uuid="00000001-aaaa-bbbb-cccc-dddddddddddd", name="NVIDIA H200")
        self.reset_calls: list = []
        self.synchronize_calls: list = []
        self.max_allocated = 3 * GB
        self.max_reserved = 4 * GB

    def get_device_properties(self, index):
        return self.props

    def reset_peak_memory_stats(self, device=None):
        self.reset_calls.append(device)

    def max_memory_allocated(self, device=None):
        return self.max_allocated

    def max_memory_reserved(self, device=None):
        return self.max_reserved

    def synchronize(self, device=None):
        self.synchronize_calls.append(device)

    def current_device(self):
        return 0


@pytest.fixture
def fake_cuda(monkeypatch, fake_nvml):
    fake = FakeCuda(fake_nvml)
    for name in ("get_device_properties", "reset_peak_memory_stats", "max_memory_allocated",
                 "max_memory_reserved", "synchronize", "current_device"):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    return fake


@pytest.fixture(autouse=True)
def fresh_fallback_warning():
    """Each test sees the once-per-process NVML fallback warning as not yet given."""
    sampler_module.warn_nvml_fallback_once.reset()
    yield
    sampler_module.warn_nvml_fallback_once.reset()


@pytest.fixture
def wait_for():
    return wait_until
