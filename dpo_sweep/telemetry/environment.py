"""The machine a sweep ran on, for ``environment.json`` and the report.

Every field is best effort: a missing package or GPU gives null, never an exception. Package
versions come from installed metadata (``importlib.metadata``) rather than importing the package,
so that collecting them costs milliseconds instead of the seconds ``import ray`` takes.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import importlib.util
import os
import platform
import socket
import sys
from pathlib import Path
from typing import Any

import torch

from dpo_sweep.nvml_session import nvml_session
from dpo_sweep.records import write_environment_json

from .nvml import _as_str
from .sampler import BYTES_PER_GB


def _cudnn_version() -> int | None:
    try:
        return torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    except Exception:
        return None


def _package_version(*distributions: str) -> str | None:
    for distribution in distributions:
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _importable_version(module: str, *distributions: str) -> str | None:
    """Version of a package whose module can be found; None when it cannot.

    ``find_spec`` locates the module without importing it: flash-attn's import loads a large
    CUDA extension, and a mismatched build may fail on import anyway (the trainer handles that).
    """
    try:
        if importlib.util.find_spec(module) is None:
            return None
    except (ImportError, ValueError):
        return None
    return _package_version(*distributions) or "unknown"


def _nvml_info() -> dict[str, Any]:
    """Driver, supported CUDA version and the host's GPUs from NVML; empty when NVML is absent.

    NVML rather than torch.cuda for the GPU list: it needs no CUDA context, so writing
    environment.json from the sweep's driver process leaves no context (hundreds of MB) on a GPU
    that a trial is measuring.
    """
    info: dict[str, Any] = {}
    try:
        with nvml_session() as pynvml:
            _fill_nvml_info(pynvml, info)
    except Exception:  # no library, no driver: what was read so far
        pass
    return info


def _fill_nvml_info(pynvml: Any, info: dict[str, Any]) -> None:
    """``info``'s NVML entries, each as soon as it is read."""
    info["driver_version"] = _as_str(pynvml.nvmlSystemGetDriverVersion())
    cuda = int(pynvml.nvmlSystemGetCudaDriverVersion())  # e.g. 12040 -> "12.4"
    info["cuda_driver_version"] = f"{cuda // 1000}.{cuda % 1000 // 10}"
    gpus = []
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        gpus.append({
            "nvml_index": index,
            "name": _as_str(pynvml.nvmlDeviceGetName(handle)),
            "memory_gb": round(pynvml.nvmlDeviceGetMemoryInfo(handle).total / BYTES_PER_GB, 3),
            "uuid": _as_str(pynvml.nvmlDeviceGetUUID(handle)),
        })
    info["gpus"] = gpus


def _torch_gpus() -> list[dict[str, Any]]:
    """The visible GPUs through torch.cuda, for when NVML cannot say."""
    try:
        if not torch.cuda.is_available():
            return []
        gpus = []
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            gpus.append({
                "torch_index": index,
                "name": props.name,
                "memory_gb": round(props.total_memory / BYTES_PER_GB, 3),
                "compute_capability": f"{props.major}.{props.minor}",
            })
        return gpus
    except Exception:
        return []


def environment_info() -> dict[str, Any]:
    """GPU(s), driver, CUDA, library versions, Python and host. Never raises.

    ``gpus`` lists every GPU on the host (NVML's view, whatever CUDA_VISIBLE_DEVICES says);
    ``gpu_name`` / ``gpu_memory_gb`` are the first one's.
    """
    nvml = _nvml_info()
    gpus = nvml.get("gpus") or _torch_gpus()
    first_gpu = gpus[0] if gpus else {}
    return {
        "gpu_name": first_gpu.get("name"),
        "gpu_memory_gb": first_gpu.get("memory_gb"),
        "gpu_count": len(gpus),
        "gpus": gpus,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "driver_version": nvml.get("driver_version"),
        "cuda_driver_version": nvml.get("cuda_driver_version"),  # newest CUDA the driver supports
        "cuda_version": torch.version.cuda,  # the CUDA runtime torch was built with
        "cudnn_version": _cudnn_version(),
        "torch": str(torch.__version__),  # a plain str: TorchVersion would need torch to unpickle
        "transformers": _package_version("transformers"),
        "ray": _package_version("ray"),
        "flash_attn": _importable_version("flash_attn", "flash-attn", "flash_attn"),
        "liger_kernel": _importable_version("liger_kernel", "liger-kernel", "liger_kernel"),
        "nvidia_ml_py": _package_version("nvidia-ml-py"),
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "cpu_count": os.cpu_count(),
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "collected_at_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def write_environment(out_dir: str | os.PathLike, info: dict[str, Any] | None = None) -> Path:
    """Write ``environment.json`` (``info`` or a fresh ``environment_info()``) into ``out_dir``."""
    return write_environment_json(out_dir, environment_info() if info is None else info)
