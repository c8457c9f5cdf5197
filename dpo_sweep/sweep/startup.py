"""``dpo-sweep run``'s start-up, overlapped: the preflight runs in a thread while the command's
main thread starts Ray and the warm workers.

The two halves have little in common: the preflight (:mod:`dpo_sweep.preflight`: importing torch
and transformers, reading and tokenising the data, then the first build of the planner's memory
model) is Python work in this process; starting Ray and the pool mostly waits on other processes
(Ray's GCS and raylet, the workers' own imports). Side by side, the sweep's start costs the longer
of the two instead of their sum (issue 14: 6.7 s + 5.4 s on the H200).

What the user sees does not change: the preflight's lines, the results directory, then the
dashboard line, in that order; a refusal of the input still exits 2 with nothing written, and the
Ray it started for nothing is shut down (the command's ``finally``). A preflight that answers
within :data:`PREFLIGHT_HEAD_START_S` - a missing file, a bad first row, or any answer in a
process that has imported torch already - never starts Ray at all.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from dpo_sweep import preflight
from dpo_sweep.config import TrialConfig
from dpo_sweep.train.lengths import LengthProfile

#: How long the preflight runs alone before Ray starts beside it: a quick refusal (or a test
#: process's, whose imports are done) answers well within it and so never starts Ray; a fresh
#: process spends seconds in its imports, which is the time Ray's start hides in.
PREFLIGHT_HEAD_START_S = 0.25


@dataclass(frozen=True)
class CheckedInputs:
    """What the preflight gave: the data summaries (printed, data.json) and each trial's lengths
    (the plan's memory model), by trial id."""

    data: tuple[preflight.DataSummary, ...]
    lengths: dict[str, LengthProfile | None]


def warm_memory_model(trials: Sequence[TrialConfig]) -> None:
    """Build each model's shape for the planner's memory model now (``plan.memory.model_shape``
    caches it for this process): the build imports transformers' modelling code, ~3 s here, which
    the planner's first suggestion would otherwise spend inside Tune's start. A failure is left
    to the planner, which meets it again where it is handled."""
    from dpo_sweep.plan.memory import model_shape

    for spec in {t.model.model_dump_json(): t.model for t in trials}.values():
        try:
            model_shape(spec)
        except Exception:  # noqa: BLE001 - see the doc
            return


def check_inputs(trials: Sequence[TrialConfig], out_dir: Path,
                 planned: Sequence[TrialConfig] = ()) -> CheckedInputs:
    """The preflight of ``trials`` (:func:`dpo_sweep.preflight.check_inputs`; a
    :class:`~dpo_sweep.errors.UserError` on bad input), then, when it passed, the memory model of
    ``planned``: the configs as the plan will see them."""
    data = preflight.check_inputs(tuple(trials), out_dir)
    lengths = preflight.lengths_by_trial(trials, data)
    warm_memory_model(planned)
    return CheckedInputs(data, lengths)


class BackgroundPreflight:
    """:func:`check_inputs` in a thread from the ``with`` block's start; :meth:`result` takes its
    answer (its error raised in the caller's thread). Leaving the block waits for the thread: the
    preflight never outlives the command's decision on it."""

    def __init__(self, trials: Sequence[TrialConfig], out_dir: Path, planned: Sequence[TrialConfig] = ()):
        self._args = (tuple(trials), out_dir, tuple(planned))

    def __enter__(self) -> BackgroundPreflight:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="preflight")
        self._future = self._executor.submit(check_inputs, *self._args)
        return self

    def __exit__(self, *exc: object) -> None:
        self._executor.shutdown(wait=True)

    def answered_within(self, timeout_s: float) -> bool:
        """Whether the preflight has its answer (either way) within ``timeout_s``."""
        return bool(wait([self._future], timeout=timeout_s).done)

    def result(self) -> CheckedInputs:
        return self._future.result()
