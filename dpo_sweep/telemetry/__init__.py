"""Measurements the trainer loop takes: memory (NVML or RSS), step time, FLOPs/MFU, environment.

Units everywhere: GB = 1e9 bytes, times in ms unless a name says ``_s``.
"""

from .environment import environment_info, write_environment
from .flops import dpo_step_flops, mfu, model_flops_per_token, peak_bf16_flops
from .sampler import (
    BYTES_PER_GB,
    BoundedTimeline,
    MemoryReader,
    MemorySampler,
    TelemetryFallbackWarning,
    make_memory_sampler,
)
from .timing import StepTimer, TrialClock, percentile

__all__ = [
    "BYTES_PER_GB",
    "BoundedTimeline",
    "MemoryReader",
    "MemorySampler",
    "StepTimer",
    "TrialClock",
    "TelemetryFallbackWarning",
    "dpo_step_flops",
    "environment_info",
    "make_memory_sampler",
    "mfu",
    "model_flops_per_token",
    "peak_bf16_flops",
    "percentile",
    "write_environment",
]
