"""Background memory sampler: a daemon thread reads device (or host) memory every ``interval_s``.

The loop uses it as::

    sampler = make_memory_sampler(device)          # NVML on a GPU, process RSS otherwise
    with sampler:                                  # start() ... stop(); stop() re-raises thread errors
        for step in range(steps):
            sampler.reset_peak()                   # this step's own peak starts here
            ...
            peaks.append(sampler.peaks())          # NVML/RSS and torch's peaks of this step
        trial_peaks = max_peaks(peaks[warmup_steps:])   # the measured steps

Units: GB = 1e9 bytes. The peak is the max over every reading since the last ``reset_peak``
(thread samples, ``sample_now`` calls, and the final reading ``peak_gb`` takes itself); the
timeline is a bounded, max-preserving record of the same readings for the report's curves.
When the body of ``with sampler:`` raises (an OOM), the peak up to the failure travels on the
exception: :func:`failure_peak_gb` reads it, in this process or after Ray has pickled it.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Callable, Iterable, Protocol

import torch

from .host import RssReader
from .nvml import open_nvml_reader

BYTES_PER_GB = 1e9
DEFAULT_INTERVAL_S = 0.02
DEFAULT_MAX_TIMELINE_POINTS = 10_000
#: The exception attribute that carries the peak up to a failure (plain data: it survives pickling).
FAILURE_PEAK_ATTR = "dpo_sweep_peak_mem_gb"

logger = logging.getLogger(__name__)


class MemoryReader(Protocol):
    """One source of memory readings (``NvmlReader``, ``RssReader``)."""

    source: str

    def used_bytes(self) -> int: ...
    def process_used_bytes(self) -> int | None: ...
    def reset_high_water_mark(self) -> None: ...
    def high_water_mark_bytes(self) -> int | None: ...
    def close(self) -> None: ...


class TelemetryFallbackWarning(RuntimeWarning):
    """NVML was wanted (a CUDA device) but could not be used; memory is host RSS instead."""


class BoundedTimeline:
    """(t_s, gb) points, at most ``max_points`` of them however long the run.

    When full, neighbouring points are merged pairwise keeping the higher reading, and from then
    on each stored point is the max of twice as many raw readings. Peaks survive decimation, so
    the memory curve in the report never hides the spike that set ``peak_mem_gb``.
    """

    def __init__(self, max_points: int = DEFAULT_MAX_TIMELINE_POINTS):
        if max_points < 2:
            raise ValueError(f"max_points must be >= 2, got {max_points}")
        self.max_points = max_points
        self.clear()

    def clear(self) -> None:
        self._points: list[tuple[float, float]] = []
        self._stride = 1  # raw readings per stored point
        self._bucket: tuple[float, float] | None = None  # max of the readings not yet stored
        self._bucket_count = 0

    def add(self, t_s: float, gb: float) -> None:
        if self._bucket is None or gb > self._bucket[1]:
            self._bucket = (t_s, gb)
        self._bucket_count += 1
        if self._bucket_count < self._stride:
            return
        self._points.append(self._bucket)
        self._bucket, self._bucket_count = None, 0
        if len(self._points) >= self.max_points:
            pairs = zip(self._points[0::2], self._points[1::2])
            merged = [a if a[1] >= b[1] else b for a, b in pairs]
            if len(self._points) % 2:
                merged.append(self._points[-1])
            self._points = merged
            self._stride *= 2

    def points(self) -> list[tuple[float, float]]:
        pending = [self._bucket] if self._bucket is not None else []
        return self._points + pending

    def __len__(self) -> int:
        return len(self._points) + (self._bucket is not None)


@dataclass(frozen=True)
class MemoryPeaks:
    """Peaks of one phase (an optimizer step), GB: the sampler's (NVML or RSS) and torch's."""

    peak_gb: float
    torch_alloc_gb: float
    torch_reserved_gb: float


def _finite_max(values: Iterable[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return max(finite) if finite else math.nan


def max_peaks(peaks: Iterable[MemoryPeaks]) -> MemoryPeaks:
    """Field-wise max over phases (NaN readings ignored); all NaN when there is none."""
    peaks = list(peaks)
    return MemoryPeaks(_finite_max(p.peak_gb for p in peaks), _finite_max(p.torch_alloc_gb for p in peaks),
                       _finite_max(p.torch_reserved_gb for p in peaks))


def failure_peak_gb(exc: BaseException) -> float:
    """The peak up to the failure that ``exc`` is, GB; NaN when no sampler saw it."""
    return float(getattr(exc, FAILURE_PEAK_ATTR, math.nan))


def _attach_failure_peak(exc: BaseException, peak_gb: float) -> None:
    try:
        setattr(exc, FAILURE_PEAK_ATTR, peak_gb)
    except (AttributeError, TypeError):  # an exception type without a __dict__
        pass


class MemorySampler:
    """Peak memory of one device (NVML device-used) or of this process (RSS).

    Thread-safe: the sampling thread and the caller's ``sample_now``/``reset_peak`` share one
    lock. Build it with ``make_memory_sampler``; the constructor takes any ``MemoryReader``.
    """

    def __init__(
        self,
        reader: MemoryReader,
        device: torch.device,
        interval_s: float = DEFAULT_INTERVAL_S,
        *,
        max_timeline_points: int = DEFAULT_MAX_TIMELINE_POINTS,
        clock: Callable[[], float] = time.perf_counter,
    ):
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.source: str = reader.source
        self.device = torch.device(device)
        self.interval_s = float(interval_s)
        self._reader = reader
        self._clock = clock
        self._lock = threading.Lock()
        self._peak_bytes = 0
        self._generation = 0  # bumped by reset_peak; a reading taken before it is not counted
        self._timeline = BoundedTimeline(max_timeline_points)
        self._t0: float | None = None  # set by the first start(); timeline times are relative to it
        self._samples_taken = 0
        self._thread: threading.Thread | None = None
        self._stop_event = threading.Event()
        self._thread_error: BaseException | None = None

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Take a first reading and start the daemon sampling thread.

        Timeline times are seconds since the first ``start()``; readings taken before it count
        towards the peak but are not in the timeline. A stopped sampler may be started again.
        """
        if self._thread is not None:
            raise RuntimeError("MemorySampler.start(): already running")
        if self._t0 is None:
            self._t0 = self._clock()
        self._thread_error = None
        self._stop_event.clear()
        self.sample_now()
        self._thread = threading.Thread(target=self._run, name="dpo-sweep-memory-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop and join the thread; re-raise the exception that ended it, if any."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stop_event.set()
            thread.join()
        error, self._thread_error = self._thread_error, None
        if error is not None:
            raise error

    def __enter__(self) -> "MemorySampler":
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            self.stop()
            return False
        # The body's exception (say a CUDA OOM the trial reports as a result) wins; a sampler
        # failure at the same time is logged rather than allowed to replace it.
        if exc is not None and not hasattr(exc, FAILURE_PEAK_ATTR):
            try:
                _attach_failure_peak(exc, self.peak_gb())  # the failing phase's peak up to here
            except Exception:
                logger.warning("memory reading at the failure failed", exc_info=True)
        try:
            self.stop()
        except Exception:
            logger.warning("memory sampler thread failed", exc_info=True)
        return False

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def samples_taken(self) -> int:
        return self._samples_taken

    def _run(self) -> None:
        try:
            # Event.wait sleeps without holding the GIL; each wake-up costs one reading.
            while not self._stop_event.wait(self.interval_s):
                self.sample_now()
        except BaseException as exc:  # surfaced by stop()
            self._thread_error = exc

    # -- readings --------------------------------------------------------------------------
    def _record(self, used_bytes: int, generation: int) -> None:
        with self._lock:
            if generation != self._generation:
                return  # read before a reset_peak that has since happened
            self._samples_taken += 1
            self._peak_bytes = max(self._peak_bytes, used_bytes)
            if self._t0 is not None:
                self._timeline.add(self._clock() - self._t0, used_bytes / BYTES_PER_GB)

    def sample_now(self) -> float:
        """Take one reading now (GB), count it towards the peak and return it."""
        generation = self._generation
        used_bytes = self._reader.used_bytes()  # outside the lock: a driver call
        self._record(used_bytes, generation)
        return used_bytes / BYTES_PER_GB

    def reset_peak(self) -> None:
        """Start a new measured phase: peak := the current reading (and torch's peaks reset)."""
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self._reader.reset_high_water_mark()
        used_bytes = self._reader.used_bytes()
        with self._lock:
            self._generation += 1
            self._peak_bytes = 0
        self._record(used_bytes, self._generation)

    def peak_gb(self) -> float:
        """Peak since the last ``reset_peak`` (or since creation), including a reading taken now."""
        self.sample_now()
        high_water_mark = self._reader.high_water_mark_bytes()
        with self._lock:
            if high_water_mark is not None:
                self._peak_bytes = max(self._peak_bytes, high_water_mark)
            return self._peak_bytes / BYTES_PER_GB

    def timeline(self) -> list[tuple[float, float]]:
        """(seconds since start, GB) readings; at most ``max_timeline_points``, peaks kept."""
        with self._lock:
            return list(self._timeline.points())

    def peaks(self) -> MemoryPeaks:
        """This phase's peaks (since the last ``reset_peak``): ``peak_gb`` and torch's two."""
        return MemoryPeaks(self.peak_gb(), *self.torch_peaks_gb())

    def torch_peaks_gb(self) -> tuple[float, float]:
        """(max_memory_allocated, max_memory_reserved) in GB since reset_peak; (nan, nan) off CUDA."""
        if self.device.type != "cuda":
            return (math.nan, math.nan)
        return (
            torch.cuda.max_memory_allocated(self.device) / BYTES_PER_GB,
            torch.cuda.max_memory_reserved(self.device) / BYTES_PER_GB,
        )

    def process_used_gb(self) -> float:
        """GPU memory NVML attributes to this pid, GB; nan where NVML does not give it."""
        used_bytes = self._reader.process_used_bytes()
        return math.nan if used_bytes is None else used_bytes / BYTES_PER_GB

    def close(self) -> None:
        """Stop the thread (if running) and release the reader (NVML shutdown)."""
        try:
            self.stop()
        finally:
            self._reader.close()


class _WarnOnce:
    """The NVML fallback warning is printed once per process, not once per trial.

    This is the module's one piece of state: a sweep builds a sampler per trial, and a hundred
    identical warnings would bury the one line that matters.
    """

    def __init__(self) -> None:
        self._done = threading.Event()

    def __call__(self, message: str) -> None:
        logger.info(message)
        if not self._done.is_set():
            self._done.set()
            warnings.warn(message, TelemetryFallbackWarning, stacklevel=3)

    def reset(self) -> None:  # for tests
        self._done.clear()


warn_nvml_fallback_once = _WarnOnce()


def make_memory_sampler(
    device: torch.device | str,
    interval_s: float = DEFAULT_INTERVAL_S,
    *,
    max_timeline_points: int = DEFAULT_MAX_TIMELINE_POINTS,
) -> MemorySampler:
    """NVML sampler for a CUDA device whose NVML device can be found; RSS sampler otherwise.

    Never raises because NVML is missing or broken: on a CUDA device that falls back to RSS with
    a single ``TelemetryFallbackWarning`` per process. On a CPU device RSS is the intended source
    and nothing is warned.
    """
    device = torch.device(device)
    reader: MemoryReader | None = None
    if device.type == "cuda":
        try:
            torch_index = device.index if device.index is not None else torch.cuda.current_device()
            reader = open_nvml_reader(torch_index)
        except Exception as exc:
            warn_nvml_fallback_once(
                f"NVML unavailable for {device} ({type(exc).__name__}: {exc}); "
                "peak_mem_gb falls back to this process's host RSS, not GPU memory "
                "(torch_peak_alloc_gb / torch_peak_reserved_gb are still measured)"
            )
    if reader is None:
        reader = RssReader()
    return MemorySampler(reader, device, interval_s, max_timeline_points=max_timeline_points)
