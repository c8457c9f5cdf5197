"""The results directory's row types and columns (contract: ../shared/DESIGN.md).

``results.csv`` holds one :class:`TrialResult` per trial, ``steps.csv`` one :class:`StepRecord`
per trial per optimizer step. Results are data: an OOM or an error is a ``status`` and an
``error`` string, never an exception that escapes. Units: GB = 1e9 bytes, ms, tokens/s.
"""
from __future__ import annotations

import csv
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable

STATUSES = ("ok", "oom", "diverged", "error", "pruned")


@dataclass(frozen=True)
class StepRecord:
    """One optimizer step of one trial."""

    trial_id: str
    step: int
    loss: float
    grad_norm: float
    step_time_ms: float
    peak_mem_gb: float
    reward_accuracy: float
    reward_margin: float
    logps_chosen: float
    logps_rejected: float
    kl: float
    rewards_chosen: float = math.nan
    rewards_rejected: float = math.nan
    tokens_per_s: float = math.nan
    lr: float = math.nan
    measured: bool = True


@dataclass(frozen=True)
class TrialResult:
    """One trial's summary row."""

    trial_id: str
    status: str
    model: str
    seq_len: int
    micro_batch: int
    checkpoint_level: str
    grad_acc: int
    beta: float
    num_workers: int
    effective_batch: int
    peak_mem_gb: float = math.nan
    torch_peak_alloc_gb: float = math.nan
    torch_peak_reserved_gb: float = math.nan
    step_time_ms: float = math.nan
    step_time_p90_ms: float = math.nan
    tokens_per_s: float = math.nan
    mfu: float = math.nan
    loss_mean: float = math.nan
    loss_std: float = math.nan
    grad_norm_mean: float = math.nan
    reward_accuracy: float = math.nan
    reward_margin: float = math.nan
    error: str = ""
    # Beyond the contract's minimum: how the numbers were obtained.
    mem_source: str = ""
    loss_type: str = ""
    precision: str = ""
    reference: str = ""
    attn_implementation: str = ""
    device: str = ""
    steps: int = 0
    measured_steps: int = 0
    pairs_used: int = 0
    pairs_dropped: int = 0
    startup_s: float = math.nan
    measure_s: float = math.nan
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


def _columns(cls: type) -> list[str]:
    return [f.name for f in fields(cls) if f.name != "extra"]


RESULTS_COLUMNS: list[str] = _columns(TrialResult)
STEPS_COLUMNS: list[str] = _columns(StepRecord)


def _row(obj: Any, columns: list[str]) -> dict[str, Any]:
    d = asdict(obj)
    return {c: d.get(c, "") for c in columns}


def write_csv(path: str | Path, rows: Iterable[Any], columns: list[str], append: bool = False) -> None:
    """Write dataclass rows as CSV (header written when the file is new or not appending)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not (append and path.exists() and path.stat().st_size > 0)
    with path.open("a" if append else "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=columns)
        if new:
            w.writeheader()
        for r in rows:
            w.writerow(_row(r, columns))


def write_results(out_dir: str | Path, results: Iterable[TrialResult], append: bool = False) -> Path:
    path = Path(out_dir) / "results.csv"
    write_csv(path, results, RESULTS_COLUMNS, append=append)
    return path


def write_steps(out_dir: str | Path, steps: Iterable[StepRecord], append: bool = False) -> Path:
    path = Path(out_dir) / "steps.csv"
    write_csv(path, steps, STEPS_COLUMNS, append=append)
    return path
