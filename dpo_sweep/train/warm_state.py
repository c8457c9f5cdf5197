"""What a process that runs trial after trial (a warm worker) keeps between its trials, and how
it lets go of the rest: one :class:`WarmState`, owned by whoever runs the trials
(:class:`~dpo_sweep.sweep.warm_worker.TrialWorker`, a benchmark that runs several in one
process) and passed to each trial (``run_trial(..., warm=...)``). A trial run without one keeps
nothing: its data and reference log-probs are made for it alone.
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import os
import threading
from typing import Any, Callable

import torch

from dpo_sweep.config import TrialConfig
from dpo_sweep.train.data import PairDataset, data_key
from dpo_sweep.train.model import undo_liger
from dpo_sweep.train.reference import ReferenceTables
from dpo_sweep.train.tokenizer import tokenized_pairs


class WarmState:
    """The state a warm worker carries from one trial to the next.

    - The last tokenizer and tokenised pairs, by what made them (:func:`data_stamp`): the sweep's
      later trials take them instead of tokenising again (benchmarks/README.md#trial-costs). Never
      changed after they are made (a frozen dataclass of tuples; the tokenizer is only read).
    - The precomputed reference's log-probs of those pairs (:class:`ReferenceTables`): a later
      trial on the same weights only computes the pairs no earlier trial read.
    - The micro-batch shapes this process has trained on (``shapes_run``): on CUDA the first
      micro-step of a shape also builds kernel plans the process keeps (sdpa's cuDNN attention:
      one per shape), so the step loop leaves such micro-steps out of the steady micro-step time.

    :meth:`release` leaves the process as a fresh one would start the next trial.
    """

    def __init__(self) -> None:
        self._data: dict[tuple, tuple[Any, PairDataset]] = {}
        self._data_lock = threading.Lock()
        self.reference_tables = ReferenceTables()
        self.shapes_run: set[tuple[int, ...]] = set()
        self._malloc_trim: Callable[[int], int] | None = None
        self._trim_looked_up = False

    def tokenized_pairs(self, cfg: TrialConfig) -> tuple[Any, PairDataset]:
        """``cfg``'s tokenizer and its data tokenised at ``train.max_length``; the same objects as the
        last call's when they would be made from the same inputs. A call while :meth:`prefetch`
        tokenises waits for it."""
        key = data_stamp(cfg)
        with self._data_lock:
            if key not in self._data:
                self._data.clear()  # one data set at a time: a sweep has one
                self.reference_tables.clear()
                self._data[key] = tokenized_pairs(cfg)
            return self._data[key]

    def prefetch(self, cfg: TrialConfig) -> threading.Thread:
        """Tokenise ``cfg``'s data in a thread, now: a warm worker does it as it starts, while the
        driver's preflight runs, so that its first trial finds the data made (tens of thousands of
        chat pairs take seconds: benchmarks/README.md#trial-costs). A failure is left to the trial,
        which meets it again (and the preflight says what is wrong before any trial)."""

        def work() -> None:
            with contextlib.suppress(Exception):
                self.tokenized_pairs(cfg)

        thread = threading.Thread(target=work, name="prefetch-data", daemon=True)
        thread.start()
        return thread

    def release(self, device: torch.device) -> None:
        """Leave the process as a fresh one would start the next trial: liger's patches undone, the
        trial's garbage collected, the allocator's cached blocks given back to the driver and
        torch's peak counters reset on CUDA; on the CPU glibc's free lists trimmed back to the OS,
        so that the next trial's RSS starts near a fresh process's. Call it once nothing of the
        trial is referenced any more (its exception included: a traceback holds the frames, and
        the frames the tensors)."""
        undo_liger()
        gc.collect()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            # cuBLAS keeps a workspace per (handle, stream) in the caching allocator: 1 MiB each that
            # an earlier trial's shapes created and a fresh process would not hold.
            clear_workspaces = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)  # CUDA builds only
            if clear_workspaces is not None:
                clear_workspaces()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        if not self._trim_looked_up:
            # Looked up once per worker: find_library asks ldconfig, the same answer every trial.
            self._malloc_trim, self._trim_looked_up = libc_malloc_trim(), True
        if self._malloc_trim is not None:
            self._malloc_trim(0)


def libc_malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` (None on musl, macOS)."""
    name = ctypes.util.find_library("c")
    return getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None


def data_stamp(cfg: TrialConfig) -> tuple:
    """What the tokenised pairs are made from (:func:`~dpo_sweep.train.data.data_key`: the data
    spec, the tokenizer, max_length), and a data file's size and modification time (a file
    rewritten since is read again)."""
    stamp = None
    if cfg.data.path is not None:
        try:
            st = os.stat(cfg.data.path)
            stamp = (st.st_size, st.st_mtime_ns)
        except OSError:
            stamp = None  # load_pairs says what is wrong with it
    return (data_key(cfg), stamp)
