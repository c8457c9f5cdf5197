"""GPU memory reader on NVML (package ``nvidia-ml-py``, imported as ``pynvml``).

NVML's device-used number is the headline ``peak_mem_gb``: unlike torch's allocator counters it
includes the CUDA context, cuBLAS/cuDNN workspaces, NCCL buffers and anything else on the card,
which is what decides whether a configuration fits.

Finding the right NVML device. Torch's device index counts only the GPUs in
``CUDA_VISIBLE_DEVICES`` (Ray sets that per worker) and, by default, in CUDA's "fastest first"
order, while NVML counts every GPU on the host in PCI order. So ``torch_index`` is never used as an
NVML index directly: the device is matched by PCI location (domain, bus, device) from
``torch.cuda.get_device_properties(i)`` where torch exposes it, else by UUID. Under MIG the match
is the parent GPU, so the reading covers the whole card.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any

import torch

from dpo_sweep.nvml_session import nvml_init, nvml_shutdown

# NVML reports "not available" per-process memory as ULLONG_MAX; pynvml usually maps it to None.
_NVML_VALUE_NOT_AVAILABLE = 2**64 - 1


def _as_str(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _normalise_uuid(uuid: Any) -> str:
    text = str(uuid).strip().lower()
    for prefix in ("gpu-", "mig-"):
        if text.startswith(prefix):
            text = text[len(prefix):]
    return text


def nvml_handle_for_torch_device(nvml: ModuleType, torch_index: int) -> tuple[Any, int]:
    """(NVML handle, NVML index) of the physical GPU behind torch's ``cuda:torch_index``.

    Raises LookupError when no NVML device matches (the caller falls back to RSS).
    """
    props = torch.cuda.get_device_properties(torch_index)
    count = nvml.nvmlDeviceGetCount()
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]

    pci = tuple(getattr(props, name, None) for name in ("pci_domain_id", "pci_bus_id", "pci_device_id"))
    if None not in pci:
        for nvml_index, handle in enumerate(handles):
            info = nvml.nvmlDeviceGetPciInfo(handle)
            if (info.domain, info.bus, info.device) == pci:
                return handle, nvml_index

    torch_uuid = getattr(props, "uuid", None)
    if torch_uuid is not None:
        wanted = _normalise_uuid(torch_uuid)
        for nvml_index, handle in enumerate(handles):
            if _normalise_uuid(_as_str(nvml.nvmlDeviceGetUUID(handle))) == wanted:
                return handle, nvml_index

    raise LookupError(
        f"no NVML device matches torch cuda:{torch_index} (pci={pci}, uuid={torch_uuid}, "
        f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})"
    )


class NvmlReader:
    """Reads one GPU's memory through NVML. Satisfies the sampler's ``MemoryReader`` protocol."""

    source = "nvml"

    def __init__(self, nvml: ModuleType, handle: Any, nvml_index: int):
        self._nvml = nvml
        self._handle = handle
        self.nvml_index = nvml_index
        self._closed = False

    def used_bytes(self) -> int:
        # One driver query, tens of microseconds; ctypes drops the GIL for its duration.
        return int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used)

    def process_used_bytes(self) -> int | None:
        """Memory NVML attributes to this pid; None where NVML cannot say.

        None when the query is unsupported, when this pid is not listed (inside a container NVML
        sees host pids, so the lookup by ``os.getpid()`` usually fails) or when the driver
        withholds the number.
        """
        try:
            processes = self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle)
        except self._nvml.NVMLError:
            return None
        pid = os.getpid()
        mine = [p.usedGpuMemory for p in processes if p.pid == pid]
        if not mine or any(m is None or m >= _NVML_VALUE_NOT_AVAILABLE for m in mine):
            return None
        return int(sum(mine))

    def reset_high_water_mark(self) -> None:
        pass  # NVML keeps no high-water mark; the sampler's max is the peak

    def high_water_mark_bytes(self) -> int | None:
        return None

    def close(self) -> None:
        """Balance ``nvmlInit`` (NVML reference-counts init/shutdown)."""
        if not self._closed:
            self._closed = True
            nvml_shutdown(self._nvml)


def open_nvml_reader(torch_index: int) -> NvmlReader:
    """Initialise NVML and return a reader for torch's ``cuda:torch_index``.

    Raises (ImportError, pynvml.NVMLError, LookupError, RuntimeError from torch) when NVML or the
    device is unusable; ``make_memory_sampler`` turns that into a warning and the RSS fallback.
    """
    pynvml = nvml_init()
    try:
        handle, nvml_index = nvml_handle_for_torch_device(pynvml, torch_index)
        reader = NvmlReader(pynvml, handle, nvml_index)
        reader.used_bytes()  # fail here, not in the sampling thread, if memory info is unsupported
    except BaseException:
        nvml_shutdown(pynvml)
        raise
    return reader
