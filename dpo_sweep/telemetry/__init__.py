"""Measurements the trainer loop takes: memory (NVML or RSS), step time, FLOPs/MFU, environment.

Units everywhere: GB = 1e9 bytes, times in ms unless a name says ``_s``.
"""

from .environment import environment_info, write_environment
from dpo_sweep.core.flops import (
    DecoderShape,
    ForwardFlops,
    TokenCounts,
    dpo_step_flops,
    forward_flops,
    mfu,
    peak_bf16_flops,
    policy_training_flops,
    recompute_flops,
)
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
    "DecoderShape",
    "ForwardFlops",
    "MemoryPeaks",
    "MemoryReader",
    "MemorySampler",
    "StepTimer",
    "TrialClock",
    "TelemetryFallbackWarning",
    "TokenCounts",
    "dpo_step_flops",
    "environment_info",
    "failure_peak_gb",
    "forward_flops",
    "make_memory_sampler",
    "max_peaks",
    "mfu",
    "peak_bf16_flops",
    "percentile",
    "policy_training_flops",
    "recompute_flops",
    "write_environment",
]
