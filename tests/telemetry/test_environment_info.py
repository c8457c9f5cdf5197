"""environment_info / write_environment: keys present, JSON-able, never crash on absent packages."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json

import pynvml
import pytest
import torch

from dpo_sweep.telemetry import environment_info, write_environment
from dpo_sweep.telemetry import environment as environment_module

REQUIRED_KEYS = {
    "gpu_name", "gpu_memory_gb", "gpu_count", "driver_version", "cuda_version", "torch",
    "transformers", "ray", "flash_attn", "liger_kernel", "python", "cpu_count", "hostname",
    "platform",
}


def test_keys_present_and_json_serialisable():
    info = environment_info()
    assert REQUIRED_KEYS <= info.keys()
    assert info["torch"] and info["python"] and info["cpu_count"] >= 1 and info["hostname"]
    json.dumps(info)


def test_absent_packages_and_nvml_give_nulls(monkeypatch):
    real_version = importlib.metadata.version

    def version(distribution):
        if distribution in {"ray", "transformers", "flash-attn", "flash_attn", "liger-kernel", "liger_kernel"}:
            raise importlib.metadata.PackageNotFoundError(distribution)
        return real_version(distribution)

    def no_library():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(importlib.metadata, "version", version)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(pynvml, "nvmlInit", no_library)
    info = environment_info()
    assert info["ray"] is None and info["transformers"] is None
    assert info["flash_attn"] is None and info["liger_kernel"] is None
    assert info["driver_version"] is None


def test_driver_and_gpus_from_nvml_without_touching_torch_cuda(fake_nvml, monkeypatch):
    def no_torch_cuda(*args, **kwargs):
        raise AssertionError("environment_info must not create a CUDA context when NVML works")

    monkeypatch.setattr(torch.cuda, "get_device_properties", no_torch_cuda)
    monkeypatch.setattr(pynvml, "nvmlSystemGetDriverVersion", lambda: "570.86.15")
    monkeypatch.setattr(pynvml, "nvmlSystemGetCudaDriverVersion", lambda: 12080)
    info = environment_module.environment_info()
    assert info["driver_version"] == "570.86.15"
    assert info["cuda_driver_version"] == "12.8"
    assert info["gpu_name"] == "NVIDIA H200"
    assert info["gpu_memory_gb"] == 141.0 and info["gpu_count"] == 3
    assert [g["uuid"] for g in info["gpus"]] == [fake_nvml.uuid(i) for i in range(3)]
    assert fake_nvml.shutdown_calls == fake_nvml.init_calls == 1
    json.dumps(info)


def test_write_environment(tmp_path):
    path = write_environment(tmp_path / "results" / "trial")
    assert path.name == "environment.json" and path.exists()
    assert REQUIRED_KEYS <= json.loads(path.read_text()).keys()
    path = write_environment(tmp_path, info={"gpu_name": "X"})
    assert json.loads(path.read_text()) == {"gpu_name": "X"}


@pytest.mark.parametrize("error", [ValueError("bad spec"), ImportError("broken parent")])
def test_find_spec_errors_are_absent_packages(monkeypatch, error):
    def find_spec(name):
        raise error

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    assert environment_module._importable_version("flash_attn", "flash-attn") is None


def test_the_environment_is_plain_data_that_unpickles_without_torch():
    # The sweep's driver takes it from its preflight's process: torch's TorchVersion (a str
    # subclass) made the driver import torch to unpickle it.
    import json

    info = environment_info()
    assert type(info["torch"]) is str
    assert json.loads(json.dumps(info)) == info
