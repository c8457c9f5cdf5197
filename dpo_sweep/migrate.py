"""Every earlier spelling of a space file or a results folder, and how it reads today.

The readers call in here where they meet input written by an earlier version of the tool, so that
the rest of the code knows only the current format:

* space files (space.py, config.py): ``search.mode`` / ``search.num_samples`` belong to
  ``sampler:``, and ``objectives.step_time`` is refused with the fix (a file about to run should
  say what it means);
* a results folder's ``space.yaml`` (commands/report.py, analysis/pareto.py): an
  ``objectives.step_time`` is read as throughput, the other way round, with a note;
* its ``environment.json`` (commands/report.py): the GPU's memory under any of the keys it
  has been written under;
* its ``results.csv`` (analysis/results.py): columns that rows from before them lack;
* its trial ids (space.py, for ``--resume``): a sweep over several models names the model in them.

Standard library only: config.py imports it.
"""
from __future__ import annotations

import math

from dpo_sweep.results_dir import ResultsDir
from typing import Any, Mapping

# --- space files ------------------------------------------------------------------------------

#: Keys of ``search:`` that are the sampler's options (the ``sampler:`` section).
MOVED_TO_SAMPLER = ("mode", "num_samples")


def moved_to_sampler(key: str) -> str:
    """Why ``search.<key>`` (a :data:`MOVED_TO_SAMPLER` key) is refused, and the fix."""
    return (f"{key} is no longer a search dimension: the sampler's options have their own section, "
            "sampler: {mode: grid | random, num_samples: N, seed: S} (search.seed sweeps train.seed)")


#: The time objective's old name: time per optimizer step, which orders the other way round to
#: throughput, and does not compare effective batches that differ.
STEP_TIME = "step_time"
_STEP_TIME_AS_THROUGHPUT = {"min": "max", "max": "min", None: None}
_READ_FROM = "read from the old "


def step_time_refusal(objectives: Any) -> str | None:
    """Why a space file's ``objectives:`` is refused (it names ``step_time``); None when it does not."""
    if not (isinstance(objectives, dict) and STEP_TIME in objectives):
        return None
    return (f"objectives.step_time is no longer an objective (got step_time: {objectives[STEP_TIME]!r}); "
            "the time objective is throughput (tokens/s), so a step that does more work does not "
            "count as slower: write `throughput: max` instead (allowed: memory, throughput, loss_std)")


# --- a results folder's space.yaml --------------------------------------------------------------


def has_step_time(objectives: Any) -> bool:
    """Whether a results folder's ``objectives:`` is the old kind: ``step_time`` and no throughput."""
    return isinstance(objectives, dict) and STEP_TIME in objectives and "throughput" not in objectives


def without_step_time(objectives: Mapping[str, Any]) -> dict[str, Any]:
    """``objectives`` less its ``step_time``: what today's ObjectivesSpec validates."""
    return {k: v for k, v in objectives.items() if k != STEP_TIME}


def objective_as_today(name: str, direction: Any, spec: Mapping[str, Any]) -> tuple[str, Any, str]:
    """(name, direction, note) of one entry of ``spec`` (an ``objectives:`` mapping): an old
    ``step_time: min`` reads as ``throughput: max``, the note saying so; anything else as it is."""
    if name == STEP_TIME and "throughput" not in spec and (direction is None or direction in ("min", "max")):
        return "throughput", _STEP_TIME_AS_THROUGHPUT[direction], f"{_READ_FROM}{STEP_TIME}: {direction}"
    return name, direction, ""


def objective_note_line(note: str, name: str, direction: str) -> str:
    """The line ``report`` and ``recommend`` print for an objective read as ``name: direction``
    (``note``: :func:`objective_as_today`'s)."""
    return (f"note: objectives.{note.removeprefix(_READ_FROM)} of DIR/{ResultsDir.SPACE} read as {name}: {direction} "
            "(the time objective is throughput now)")


# --- a results folder's environment.json ----------------------------------------------------------

#: Keys under which environment.json may hold the GPU's total memory, in GB (1e9 bytes) ...
_GPU_MEMORY_GB_KEYS = ("gpu_memory_gb", "gpu_mem_gb", "gpu_total_memory_gb", "memory_total_gb",
                       "total_memory_gb", "memory_gb")
#: ... or in bytes.
_GPU_MEMORY_BYTES_KEYS = ("gpu_memory_bytes", "memory_total_bytes", "total_memory_bytes", "memory_bytes")


def gpu_memory_gb(env: Mapping[str, Any] | None) -> float | None:
    """The GPU's total memory from environment.json, looking at the top level, ``gpu``, and
    the first of ``gpus`` (today's: ``gpus[0].memory_gb``); None when absent (e.g. a CPU run)."""
    if not env:
        return None
    places: list[Mapping[str, Any]] = [env]
    if isinstance(env.get("gpu"), Mapping):
        places.append(env["gpu"])
    gpus = env.get("gpus")
    if isinstance(gpus, list) and gpus and isinstance(gpus[0], Mapping):
        places.append(gpus[0])
    keys = [(k, 1.0) for k in _GPU_MEMORY_GB_KEYS] + [(k, 1e-9) for k in _GPU_MEMORY_BYTES_KEYS]
    for place in places:
        for key, to_gb in keys:
            value = place.get(key)
            is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if is_number and math.isfinite(value) and value > 0:
                return float(value) * to_gb
    return None


# --- a results folder's trial ids -----------------------------------------------------------------


def positional_trial_ids(index: int, trial_id: str, model_part: str = "", legacy_model_part: str = "") -> list[str]:
    """The ids earlier versions gave the trial that is now ``trial_id``: numbered by its place in
    the expansion (``t003_...``, ``index``) instead of a hash of its knobs, a swept model named
    by its place when two share a label (``legacy_model_part``: ``tiny-llama-0``), and before
    that not named at all (``t003_mb2_...``)."""
    knobs = trial_id.split("_", 1)[1]
    if not model_part:
        return [f"t{index:03d}_{knobs}"]
    rest = knobs.removeprefix(model_part + "_")
    return [f"t{index:03d}_{legacy_model_part}_{rest}", f"t{index:03d}_{rest}"]


# --- a results folder's results.csv ---------------------------------------------------------------

#: Columns that rows written before them lack, and the value every such row had: every trial then
#: trained all weights with torch's AdamW, in the native trainer.
RESULTS_COLUMN_DEFAULTS: dict[str, str] = {"adapter": "full", "optimizer": "adamw", "trainer": "native",
                                           "parallelism": "ddp"}
#: Columns that earlier versions wrote under another name: old -> today's.
RENAMED_RESULTS_COLUMNS: dict[str, str] = {"num_workers": "workers_per_trial"}


def renamed_results_columns(df: Any) -> Any:
    """``df`` (results.csv's rows) with each column of :data:`RENAMED_RESULTS_COLUMNS` under today's
    name; where both are there (a file resumed across the rename), the old fills today's gaps."""
    for old, new in RENAMED_RESULTS_COLUMNS.items():
        if old in df.columns:
            df[new] = df[new].fillna(df[old]) if new in df.columns else df[old]
            df = df.drop(columns=[old])
    return df
