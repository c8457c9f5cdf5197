"""Measurements the trainer loop takes: memory (NVML or RSS), step time, environment (a step's
FLOPs and MFU are maths, not measurements: :mod:`dpo_sweep.core.flops`).

Units everywhere: GB = 1e9 bytes, times in ms unless a name says ``_s``.
"""

from .environment import environment_info, write_environment
from .sampler import (
    BYTES_PER_GB,
    BoundedTimeline,
    MemoryPeaks,
    MemoryReader,
    MemorySampler,
    TelemetryFallbackWarning,
    failure_peak_gb,
    make_memory_sampler,
    max_peaks,
)
from .timing import StepTimer, TrialClock, percentile

__all__ = [
    "BYTES_PER_GB",
    "BoundedTimeline",
    "MemoryPeaks",
    "MemoryReader",
    "MemorySampler",
    "StepTimer",
    "TrialClock",
    "TelemetryFallbackWarning",
    "environment_info",
    "failure_peak_gb",
    "make_memory_sampler",
    "max_peaks",
    "percentile",
    "write_environment",
]
