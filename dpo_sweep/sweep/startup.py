"""``dpo-sweep run``'s start-up: the slowest part - Ray up, then each warm worker's imports in its
own process (torch, transformers, the model's classes, CUDA: 11-16.5 s on the H200) - starts first.

1. The checks that only read files (:func:`dpo_sweep.preflight.check_files`: milliseconds, no
   tokenizer): a missing data file, a bad row or an unwritable output folder is refused (exit 2)
   before anything starts.
2. The rest of the preflight - the tokenizers, the data tokenised as the workers will, the
   planner's memory model (:func:`check_inputs`) - in a thread (:class:`BackgroundPreflight`),
   while the command's main thread starts Ray and the warm workers. A refusal there (exit 2)
   shuts down the Ray started for it.

Measured on the H200 (benchmarks/results/sweep_overhead_h200/): that preflight imports what a
worker does and took 14.5-19.4 s beside Ray's start; run after Ray was up instead (75aded7), it
took 15.5 s on its own, and Tune's start waited for it until 28.5 s. Beside each other the two
share this process's GIL, which costs Ray's start 1-2 s on the 2-core machine (ray.init 4.0-4.3 s
alone, 4.9-6.3 s beside the imports), less than the preflight it hides.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from dpo_sweep import preflight
from dpo_sweep.config import TrialConfig
from dpo_sweep.train.lengths import LengthProfile


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


def check_inputs(trials: Sequence[TrialConfig], out_dir: Path, planned: Sequence[TrialConfig] = (),
                 files: preflight.CheckedFiles | None = None) -> CheckedInputs:
    """The preflight of ``trials`` (:func:`dpo_sweep.preflight.check_inputs`, after the file checks
    that gave ``files``; a :class:`~dpo_sweep.errors.UserError` on bad input), then, when it
    passed, the memory model of ``planned``: the configs as the plan will see them."""
    data = preflight.check_inputs(tuple(trials), out_dir, files)
    lengths = preflight.lengths_by_trial(trials, data)
    warm_memory_model(planned)
    return CheckedInputs(data, lengths)


class BackgroundPreflight:
    """:func:`check_inputs` in a thread from the ``with`` block's start; :meth:`result` takes its
    answer (its error raised in the caller's thread). Leaving the block waits for the thread: the
    preflight never outlives the command's decision on it."""

    def __init__(self, trials: Sequence[TrialConfig], out_dir: Path, planned: Sequence[TrialConfig] = (),
                 files: preflight.CheckedFiles | None = None):
        self._args = (tuple(trials), out_dir, tuple(planned), files)

    def __enter__(self) -> BackgroundPreflight:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="preflight")
        self._future = self._executor.submit(check_inputs, *self._args)
        return self

    def __exit__(self, *exc: object) -> None:
        self._executor.shutdown(wait=True)

    def result(self) -> CheckedInputs:
        return self._future.result()
