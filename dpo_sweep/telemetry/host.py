"""CPU fallback memory reader: this process's resident set size (RSS).

Used when the trial runs on CPU, or on a GPU whose NVML library cannot be loaded. psutil is not a
dependency: on Linux the numbers come from ``/proc/self/status`` (``VmRSS`` now, ``VmHWM`` the
high-water mark), elsewhere from ``resource.getrusage`` (a lifetime maximum only).

Peak per phase. The sampler's peak is the max of the sampled ``VmRSS`` values since
``reset_peak``. Sampling every 20 ms can miss a spike shorter than that, so where the kernel
allows it (Linux >= 4.0) ``reset_high_water_mark`` writes ``5`` to ``/proc/self/clear_refs``,
which resets ``VmHWM`` to the current RSS without touching anything else; ``VmHWM`` is then an
exact peak for the phase and the sampler folds it in. Where that write is refused (some
sandboxes), ``VmHWM`` is not used at all: it would carry the previous phase's (or trial's)
peak into this one.
"""

from __future__ import annotations

import resource
import sys
from pathlib import Path

_PROC_STATUS = Path("/proc/self/status")
_PROC_CLEAR_REFS = Path("/proc/self/clear_refs")
_RESET_HWM_ONLY = "5"  # see proc(5), /proc/pid/clear_refs: "5" resets only the RSS high-water mark


def read_proc_status_bytes(field: str, status_path: Path = _PROC_STATUS) -> int | None:
    """One ``kB`` field of /proc/self/status (``VmRSS``, ``VmHWM``) in bytes; None if absent."""
    try:
        text = status_path.read_text()
    except OSError:
        return None
    prefix = field + ":"
    for line in text.splitlines():
        if line.startswith(prefix):
            value_kb = line[len(prefix):].split()[0]
            return int(value_kb) * 1024
    return None


def getrusage_max_rss_bytes() -> int:
    """Lifetime peak RSS from getrusage: kilobytes on Linux, bytes on macOS."""
    max_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(max_rss) if sys.platform == "darwin" else int(max_rss) * 1024


class RssReader:
    """Reads this process's RSS. Satisfies the sampler's ``MemoryReader`` protocol."""

    source = "rss"

    def __init__(self, status_path: Path = _PROC_STATUS, clear_refs_path: Path = _PROC_CLEAR_REFS):
        self._status_path = status_path
        self._clear_refs_path = clear_refs_path
        self._has_proc = read_proc_status_bytes("VmRSS", status_path) is not None
        self._hwm_reset_ok = False

    def used_bytes(self) -> int:
        if self._has_proc:
            rss = read_proc_status_bytes("VmRSS", self._status_path)
            if rss is not None:
                return rss
        # Without /proc only the lifetime maximum exists; document it as the reading.
        return getrusage_max_rss_bytes()

    def process_used_bytes(self) -> int | None:
        return None  # per-process GPU memory: not applicable to host RSS

    def reset_high_water_mark(self) -> None:
        if not self._has_proc:
            return
        try:
            self._clear_refs_path.write_text(_RESET_HWM_ONLY)
            self._hwm_reset_ok = True
        except OSError:
            self._hwm_reset_ok = False

    def high_water_mark_bytes(self) -> int | None:
        """VmHWM, only once it has been reset at the start of this phase; else None."""
        if not self._hwm_reset_ok:
            return None
        return read_proc_status_bytes("VmHWM", self._status_path)

    def close(self) -> None:
        pass
