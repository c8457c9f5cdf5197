"""NVML's init and shutdown, paired: NVML counts them, so every reader that initialises it shuts
it down once, whatever happens in between. The readers: the memory sampler (telemetry/nvml.py,
for a trial's life), environment.json (telemetry/environment.py) and the card budget of the
sweep's driver (sweep/planner.py). Standard library only: the driver reads the card without torch.
"""
from __future__ import annotations

import contextlib
from types import ModuleType
from typing import Iterator


def nvml_init() -> ModuleType:
    """``pynvml``, initialised. Raises ImportError (no ``nvidia-ml-py``) or ``pynvml.NVMLError``
    (no driver, no GPU). Balance it with :func:`nvml_shutdown`."""
    import pynvml  # imported here so that a missing nvidia-ml-py costs only the GPU reading

    pynvml.nvmlInit()
    return pynvml


def nvml_shutdown(nvml: ModuleType) -> None:
    """Balance one :func:`nvml_init` (an error on the way out changes nothing for the caller)."""
    try:
        nvml.nvmlShutdown()
    except nvml.NVMLError:
        pass


@contextlib.contextmanager
def nvml_session() -> Iterator[ModuleType]:
    """``with nvml_session() as nvml:`` NVML initialised for the block (raises as :func:`nvml_init`)."""
    nvml = nvml_init()
    try:
        yield nvml
    finally:
        nvml_shutdown(nvml)
