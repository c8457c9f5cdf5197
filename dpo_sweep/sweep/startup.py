"""``dpo-sweep run``'s start-up, in the order that makes its slowest part start first.

The slowest part is a trial worker's start: Ray up, then the worker process's imports (torch,
transformers, the model's classes, CUDA; ~11 s on the H200). So:

1. the checks that only read files (:func:`dpo_sweep.preflight.check_files`: milliseconds, no
   tokenizer): a missing data file, a bad row or an unwritable output folder is refused (exit 2)
   before anything starts;
2. Ray and the warm workers start (the workers import in their own processes from then on);
3. the rest of the preflight - the tokenizers, the data tokenised as the workers will, the
   planner's memory model (:func:`check_inputs`) - in this process while the workers import.
   A refusal here (exit 2) shuts down the Ray started for it.

The preflight used to run in a thread beside Ray's start. In one process the two share the GIL:
the preflight's imports held it while ``ray.init`` needed it in short turns, and on the H200 Ray
was up 12-14 s after the command started, where alone it takes 5.4 s; the workers' imports
started that much later and the first trial waited for them
(benchmarks/results/sweep_overhead_h200/).
"""
from __future__ import annotations

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


def check_inputs(trials: Sequence[TrialConfig], out_dir: Path,
                 planned: Sequence[TrialConfig] = ()) -> CheckedInputs:
    """The preflight of ``trials`` (:func:`dpo_sweep.preflight.check_inputs`; a
    :class:`~dpo_sweep.errors.UserError` on bad input), then, when it passed, the memory model of
    ``planned``: the configs as the plan will see them."""
    data = preflight.check_inputs(tuple(trials), out_dir)
    lengths = preflight.lengths_by_trial(trials, data)
    warm_memory_model(planned)
    return CheckedInputs(data, lengths)
