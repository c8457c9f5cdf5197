"""The result schema: the row types and columns of a results directory, and their CSV writers.

A neutral module (contract: docs/contracts.md#resultscsv): the producers (``train/``, ``sweep/``) build
and write these rows, the consumers (``analysis/``, ``report/``) read them; neither side imports
the other. ``results.csv`` holds one :class:`TrialResult` per trial, ``steps.csv`` one
:class:`StepRecord` per trial per optimizer step. Results are data: an OOM or an error is a
``status`` and an ``error`` string, never an exception that escapes. Units: GB = 1e9 bytes, ms,
tokens/s, s.
"""
from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from dpo_sweep.csv_table import read_csv_table
from dpo_sweep.core.held_out import FIELD_OF_COLUMN, HELD_OUT_COLUMNS
from dpo_sweep.core.status import Status
from dpo_sweep.files import append_text, read_text, write_text_atomic
from dpo_sweep.results_dir import ResultsDir
from dpo_sweep.text import excerpt

if TYPE_CHECKING:
    from dpo_sweep.config import TrialConfig

#: The longest ``error`` text a failed row carries from a trainer exception's first line.
MAX_TRAINER_ERROR_CHARS = 500

#: ``stability`` of a row written when its memory/time measurement ended, before the learning
#: trial its stability columns come from: they arrive later, by an atomic rewrite of results.csv.
PENDING = "pending"


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
    max_seq_len: int = 0  # the longest sequence in this step's micro-batches
    padding_frac: float = math.nan  # share of this step's token positions that are padding
    worst_case: bool = False  # the step on the longest pairs (train.worst_case_step)
    # Stability signals (dpo_sweep/core/stability.py) and the knobs' per-step values.
    logratio_mean: float = math.nan
    logratio_std: float = math.nan
    beta: float = math.nan
    grad_acc: int = 0
    # Where the step's time went (for the planner's t_opt + grad_acc x t_micro extrapolation):
    micro_step_ms: float = math.nan  # median forward+backward of the accumulating micro-steps (timing.micro_and_optimizer_ms)
    optimizer_ms: float = math.nan   # unscale, clip, AdamW step, zero_grad, schedule
    micro_ms: str = ""  # each micro-step's forward+backward in order, "183.1,184.0" (plan/extrapolate.py)
    micro_new: str = ""  # per micro-step "1" where its shape ran first in the process (CUDA), else "0": "100"
    # The held-out split at an eval point (train.eval_steps), else NaN (core/held_out.py).
    eval_reward_accuracy: float = math.nan
    eval_reward_margin: float = math.nan
    eval_rewards_chosen: float = math.nan
    eval_logps_chosen: float = math.nan
    eval_chosen_drift: float = math.nan
    eval_loss: float = math.nan

    def steady_micro_steps(self, last_syncs: bool = False) -> list[float]:
        """The times of this step's micro-steps that its ``micro_step_ms`` is the median of
        (:func:`steady_micro_ms`); empty when it recorded none (``micro_ms``)."""
        if not self.micro_ms:
            return []
        ms = [float(x) for x in self.micro_ms.split(",")]
        return steady_micro_ms([*ms, self.optimizer_ms], last_syncs, [flag == "1" for flag in self.micro_new])


def steady_micro_ms(durations_ms: Sequence[float], last_syncs: bool = False,
                    new: Sequence[bool] = ()) -> list[float]:
    """The micro-steps of one step whose median is its steady micro-step
    (``telemetry.timing.micro_and_optimizer_ms`` says which and why): of ``durations_ms``, one
    per micro-step then the optimizer phase, every micro-step but the first, and with
    ``last_syncs`` but the last; those of a shape new in the process (``new``) left out while
    another remains. Empty without a micro-step."""
    micro = list(durations_ms[:-1])
    if not micro:
        return []
    known = [not n for n in new] if len(new) == len(micro) else [True] * len(micro)
    indices = list(range(1, len(micro)))
    steady = (indices[:-1] if last_syncs else indices) or indices or [0]
    repeated = [i for i in steady if known[i]]
    return [micro[i] for i in (repeated or steady)]


@dataclass(frozen=True)
class TrialResult:
    """One trial's summary row."""

    trial_id: str
    status: str  # a Status (core/status.py), read back from results.csv as its text
    model: str
    seq_len: int
    micro_batch: int
    checkpoint_level: str
    grad_acc: int
    beta: float
    workers_per_trial: int
    effective_batch: int
    parallelism: str = "ddp"  # how the trial's workers share it (resources.parallelism)
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
    # Lost to the machine, not the configuration (a process died, a time limit passed): --resume reruns it.
    infrastructure_failure: bool = False
    # Beyond the contract's minimum: how the numbers were obtained.
    peak_mem_typical_gb: float = math.nan  # the highest peak of the typical measured steps (peak_mem_gb: worst case)
    padding_frac: float = math.nan  # mean share of padding in the typical measured steps
    step_time_p10_ms: float = math.nan  # with step_time_p90_ms: the throughput noise (dpo_sweep/core/noise.py)
    mem_source: str = ""
    loss_type: str = ""
    precision: str = ""
    reference: str = ""
    attn_implementation: str = ""
    liger_kernel: bool = False
    lean_ops: bool = False
    pad_multiple: int = 0  # rows padded to a width multiple of (train.pad_to_multiple_of as resolved; 0: not recorded)
    logp_parity: float = math.nan  # nats: the trainer's log-probs against the model's own forward (train/parity.py)
    # Memory levers (train.adapter, train.optimizer): what was trained and how.
    adapter: str = ""                  # full | lora | qlora
    optimizer: str = ""                # adamw | adamw_8bit | adamw_4bit
    trainable_params: int | None = None  # parameters the optimizer steps (LoRA: the adapters only)
    trainer: str = ""                  # native | trl (train.trainer; "": rows of before the column, native)
    ranks_simulated: bool = False  # rank 0 of workers_per_trial alone (resources.simulate_ranks; train/parallel.py)
    comm_ms: float = math.nan      # simulated: the modelled communication per step (core/comms.py)
    device: str = ""
    steps: int = 0
    measured_steps: int = 0
    pairs_used: int = 0
    pairs_dropped: int = 0
    startup_s: float = math.nan
    measure_s: float = math.nan
    # startup_s split (telemetry.timing.STARTUP_PHASES): Ray, trainer import, data, model build.
    startup_ray_s: float = math.nan
    startup_import_s: float = math.nan
    startup_data_s: float = math.nan
    startup_model_s: float = math.nan
    # Stability (dpo_sweep/core/stability.py: signals over every step, verdict, rollback trigger).
    stability: str = ""
    loss_slope: float = math.nan
    loss_spread: float = math.nan
    grad_norm_spike: float = math.nan
    logratio_std_max: float = math.nan
    reward_accuracy_slope: float = math.nan
    reward_margin_slope: float = math.nan
    rollback_step: int | None = None
    eval_loss: float = math.nan  # with data.eval_pairs: the held-out split's DPO loss at the final weights
    # The held-out split at the last eval point (core/held_out.py).
    eval_reward_accuracy: float = math.nan
    eval_reward_margin: float = math.nan
    eval_rewards_chosen: float = math.nan
    eval_logps_chosen: float = math.nan
    eval_chosen_drift: float = math.nan
    eval_pairs: int = 0  # pairs in the held-out split (0: none)
    stopped_step: int | None = None  # status stopped: the step its learning trial was stopped at
    # The planner (dpo_sweep/plan/schedule.py): where this row's numbers come from.
    predicted_peak_gb: float = math.nan  # the memory model's prediction when the measurement started
    measured_by: str = ""          # the trial whose memory/time measurement this row carries (own id: itself)
    step_time_source: str = ""     # a TimeSource (core/status.py): measured | extrapolated | runoff
    extrapolation_error: float = math.nan  # extrapolated: the step time's relative standard error, which widens its p10-p90
    timed_by: str = ""             # runoff: the <id>-runoff trial that timed this row in full at its grad_acc
    stability_from: str = ""       # the trial whose loss trajectory gives loss_mean, loss_std, ...
    stability_steps: int | None = None  # that trial's optimizer steps (train.learning_steps, or the row's own)
    stability_precision: str = ""  # that trial's precision (train.learning_precision, or the row's own)
    stability_note: str = ""       # why that trial ran in the space's precision, not the learning one (it did not fit)
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


def _columns(cls: type) -> list[str]:
    return [HELD_OUT_COLUMNS.get(f.name, f.name) for f in fields(cls) if f.name != "extra"]


RESULTS_COLUMNS: list[str] = _columns(TrialResult)
#: What running a trial cost (a row measured by another trial has none of its own).
TIMING_COLUMNS: tuple[str, ...] = tuple(c for c in RESULTS_COLUMNS if c == "measure_s" or c.startswith("startup_"))
STEPS_COLUMNS: list[str] = _columns(StepRecord)


def _row(obj: Any, columns: list[str]) -> dict[str, Any]:
    d = {HELD_OUT_COLUMNS.get(k, k): v for k, v in asdict(obj).items()}
    d.update(d.pop("extra", None) or {})
    return {c: d.get(c, "") for c in columns}


#: The longest cell text a row's ``error`` is written with (the whole text of a failure is in
#: DIR/logs/); Python's csv reader refuses cells over 131,072 characters.
MAX_ERROR_CELL_CHARS = 4000


def _header(path: Path) -> list[str]:
    return next(csv.reader(io.StringIO(read_text(path), newline="")), [])


def write_csv(path: str | Path, rows: Iterable[Any], columns: list[str], append: bool = False) -> list[str]:
    """Write dataclass rows as CSV (header written when the file is new or not appending).

    Appending to a file whose header lacks some of ``columns`` (written before a column existed,
    or by a space with other swept fields: ``--resume``) rewrites it with the union of both
    headers - ``columns`` first, then the file's own others - the old rows' cells under their
    own names and empty in the new columns, so no cell lands under another column's name.
    Returns the columns added to an existing file's header ([] when none were)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not (append and path.is_file() and path.stat().st_size > 0):
        rewrite_csv(path, [_row(r, columns) for r in rows], columns)
        return []
    header = _header(path)
    added = [c for c in columns if c not in header]
    if not added:  # new rows fit the header (a column only the file has stays empty in them)
        append_text(path, _csv_text([_row(r, header) for r in rows], header, with_header=False))
        return []
    union = columns + [c for c in header if c not in columns]
    rewrite_csv(path, read_csv_rows(path) + [_row(r, union) for r in rows], union)
    return added


def rewrite_csv(path: str | Path, rows: list[dict[str, Any]], columns: list[str]) -> None:
    """Replace ``path`` with these plain-dict rows under ``columns`` (a missing cell is empty),
    atomically: written beside it, then moved over it, so a kill during the rewrite leaves the
    old file whole."""
    write_text_atomic(path, _csv_text(rows, columns, with_header=True))


def _csv_text(rows: list[dict[str, Any]], columns: list[str], *, with_header: bool) -> str:
    buf = io.StringIO(newline="")
    w = csv.DictWriter(buf, fieldnames=columns, restval="")
    if with_header:
        w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def read_csv_rows(path: str | Path) -> list[dict[str, str]]:
    """The whole rows of a CSV file as dicts of strings (:func:`read_csv_table`: a damaged record
    is no row); [] when the file is missing or empty."""
    return read_csv_table(path).rows


def write_environment_json(out_dir: str | Path, info: dict[str, Any]) -> Path:
    """Write ``info`` as ``out_dir``/environment.json (no torch here: the sweep's driver writes the
    one its preflight's process collected)."""
    path = ResultsDir(out_dir).environment
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(info, indent=2, sort_keys=True, default=str) + "\n")
    return path


def write_results(out_dir: str | Path, results: Iterable[TrialResult], append: bool = False) -> list[str]:
    """The contract columns, then each row's ``extra`` ones (the swept train fields, the same for
    every trial of a sweep: ``TrialConfig.swept_columns``). Returns the columns that appending
    added to an existing results.csv's header (:func:`write_csv`)."""
    results = [r if len(r.error) <= MAX_ERROR_CELL_CHARS else replace(r, error=excerpt(r.error, MAX_ERROR_CELL_CHARS))
               for r in results]
    extra = [c for c in dict.fromkeys(k for r in results for k in r.extra) if c not in RESULTS_COLUMNS]
    return write_csv(ResultsDir(out_dir).results, results, RESULTS_COLUMNS + extra, append=append)


def replace_results(out_dir: str | Path, rows: Iterable[TrialResult]) -> None:
    """Rewrite results.csv with ``rows`` in place of the rows of the same trial ids (the planner's
    runoff re-times rows already written), atomically (:func:`rewrite_csv`); other rows stay."""
    path = ResultsDir(out_dir).results
    header = _header(path)
    new = {r.trial_id: _row(r, header) for r in rows}
    rewrite_csv(path, [new.get(old["trial_id"], old) for old in read_csv_rows(path)], header)


def write_steps(out_dir: str | Path, steps: Iterable[StepRecord], append: bool = False) -> list[str]:
    """steps.csv; returns the columns appending added to its header (:func:`write_csv`)."""
    return write_csv(ResultsDir(out_dir).steps, steps, STEPS_COLUMNS, append=append)


def error_text(err: BaseException) -> str:
    """A failed row's ``error`` from an exception: its type and the first line of its message."""
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0] if lines else ''}"[:MAX_TRAINER_ERROR_CHARS]


def peak_up_to_failure_gb(step_peaks_gb: Iterable[float], failing_peak_gb: float) -> float:
    """A failed trial's ``peak_mem_gb``: the max of the peaks of the steps that ran and of the
    failing step up to the failure (NaN when none is known)."""
    finite = [p for p in (*step_peaks_gb, failing_peak_gb) if math.isfinite(p)]
    return max(finite) if finite else math.nan


def config_columns(cfg: "TrialConfig") -> dict[str, Any]:
    """The columns that say which configuration a row is: its trial id, its knobs and its swept
    train fields (``extra``: each its own results.csv column). Every row made for ``cfg`` - the
    trainer's, a failure's, a pruned one, one shared from another trial's measurement - takes them
    from here."""
    return {"trial_id": cfg.trial_id, **cfg.knobs(), "extra": cfg.swept_columns()}


def failed_result(cfg: "TrialConfig", status: Status, error: str, steps: Iterable[StepRecord] = (),
                  failing_peak_gb: float = math.nan, **timing: float) -> TrialResult:
    """The summary row of a trial that did not finish its steps (``oom``, ``error``): its knobs,
    how it was set up, the ``error`` text, and what the steps that did run tell (their count and
    the peak up to the failure: the highest finite peak of those steps and ``failing_peak_gb``, the
    failing step's so far). ``timing``: ``startup_s`` / ``measure_s`` when known."""
    steps = tuple(steps)
    return TrialResult(
        **config_columns(cfg), status=status, error=error,
        peak_mem_gb=peak_up_to_failure_gb((s.peak_mem_gb for s in steps), failing_peak_gb),
        loss_type=cfg.train.loss, precision=cfg.train.precision, reference=cfg.train.reference,
        adapter=cfg.train.adapter, optimizer=cfg.train.optimizer, trainer=cfg.train.trainer,
        attn_implementation=cfg.model.attn_implementation, steps=len(steps), **timing,
    )


def _cell(value: str, kind: str) -> Any:
    """A CSV cell back in its dataclass field's type (``kind``: the annotation)."""
    if kind == "str":
        return value
    if kind == "bool":
        return value == "True"
    if kind == "int":
        return int(float(value)) if value else 0
    if kind == "int | None":
        return int(float(value)) if value else None
    return float(value) if value not in ("", "nan") else math.nan


def rows_as(cls: type, rows: Iterable[dict[str, str]]) -> list[Any]:
    """CSV rows (:func:`read_csv_rows`) as ``cls`` (:class:`TrialResult` or :class:`StepRecord`);
    cells of columns that are not fields (a results row's swept train fields) go to its ``extra``
    as written."""
    kinds = {f.name: str(f.type) for f in fields(cls) if f.name != "extra"}
    has_extra = any(f.name == "extra" for f in fields(cls))
    out = []
    for row in rows:
        row = {FIELD_OF_COLUMN.get(k, k): v for k, v in row.items()}
        known = {k: _cell(v, kinds[k]) for k, v in row.items() if k in kinds}
        if has_extra:
            known["extra"] = {k: v for k, v in row.items() if k not in kinds and k}
        out.append(cls(**known))
    return out
