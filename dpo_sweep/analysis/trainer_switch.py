"""What switching the winner's trainer costs or saves: the winner's configuration under the other
trainer (``native`` <-> ``trl``), measured where the sweep has that row, else its predicted peak.

recommendation.json's ``"trl"`` holds it as ``"switch"``; the console and the report print it as one
line under the TRL export, so a native winner says what its TRL export will need, and a TRL winner
what the native trainer would give.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Mapping

import pandas as pd

from dpo_sweep.core import trial_facts
from dpo_sweep.analysis.tables import fmt_beta, fmt_float, fmt_int, fmt_sig, is_finite, swept_train_columns, to_markdown
from dpo_sweep.config import ModelSpec, TrialConfig
from dpo_sweep.core.dimensions import CARRIED_TRAIN_FIELDS, CONFIG_COLUMNS, TRAIN_COLUMNS
from dpo_sweep.core.levels import Level
from dpo_sweep.core.status import Status

if TYPE_CHECKING:
    from dpo_sweep.plan.shape import ModelShape

#: Columns that say which configuration a row is, besides the trainer.
_SAME = (*CONFIG_COLUMNS, *(TRAIN_COLUMNS[f] for f in CARRIED_TRAIN_FIELDS if f != "trainer"))


def trainer_of(row: pd.Series) -> str:
    """``native`` or ``trl`` (rows of before the column: native)."""
    return str(row.get("trainer") or "native")


def twin(analysed: pd.DataFrame, row: pd.Series, level: str | None = None) -> pd.Series | None:
    """The row of ``row``'s configuration under the other trainer (at checkpoint ``level`` where
    given, else ``row``'s); None when the sweep has none."""
    if "trainer" not in analysed:
        return None
    other = "trl" if trainer_of(row) == "native" else "native"
    same = analysed["trainer"].fillna("").replace("", "native") == other
    wanted = {"checkpoint_level": level} if level is not None else {}
    for column in (*_SAME, *(c for c in swept_train_columns(analysed) if c != "trainer")):
        if column in analysed:
            same &= analysed[column].astype(str) == str(wanted.get(column, row.get(column)))
    found = analysed[same]
    return found.iloc[0] if len(found) else None


def nearest_other(trial: TrialConfig) -> TrialConfig:
    """``trial`` under the other trainer; into TRL, a selective checkpoint level becomes ``full``
    (TRL checkpoints whole layers or nothing: the nearest setting, more recompute, less memory)."""
    other = "trl" if trial.train.trainer == "native" else "native"
    level = nearest_level(trial.checkpoint_level, other)
    return trial.model_copy(update={"train": trial.train.model_copy(update={"trainer": other}),
                                    "checkpoint_level": level})


def predicted_other_gb(trial: TrialConfig, row: pd.Series,
                       shapes: Mapping[ModelSpec, ModelShape] | None = None) -> float | None:
    """The other trainer's peak for ``trial``: its measured peak plus the memory model's difference
    between the two (plan/memory.py; a difference, so what the model misses of both cancels). None
    when the model's shape cannot be read here or the row has no measured peak. ``shapes``: model
    shapes built elsewhere (``dpo-sweep run``'s preflight), so this process need not build one."""
    from dpo_sweep.plan.memory import predict_peak_gb
    from dpo_sweep.plan.shape import model_shape

    if not is_finite(row.get("peak_mem_gb")):
        return None
    device = trial_facts.planned_device(trial)
    try:
        shape = model_shape(trial.model, shapes)
        own = predict_peak_gb(trial, device=device, shape=shape).total_gb
        other = predict_peak_gb(nearest_other(trial), device=device, shape=shape).total_gb
    except (OSError, ValueError, KeyError):
        return None
    return float(row["peak_mem_gb"]) + other - own


def switch(analysed: pd.DataFrame, row: pd.Series, predicted_other_gb: float | None = None) -> dict[str, Any]:
    """The winner's configuration under the other trainer: ``{"trainer", "trial_id", "status",
    "peak_mem_gb", "tokens_per_s", "source"}`` with ``source`` ``measured`` (the sweep's row) or
    ``predicted`` (``predicted_other_gb``, the memory model's; no throughput) or ``none``."""
    other = "trl" if trainer_of(row) == "native" else "native"
    own_level = str(row.get("checkpoint_level"))
    level = nearest_level(own_level, other)
    found = twin(analysed, row)
    if found is None and level != own_level:  # a level TRL cannot run: its nearest, where measured
        found = twin(analysed, row, level)
    at = {"checkpoint_level": str(found["checkpoint_level"])} if found is not None and str(
        found.get("checkpoint_level")) != own_level else {}
    if found is not None and str(found.get("status")) == Status.OK:
        return {"trainer": other, "trial_id": str(found["trial_id"]), "status": Status.OK, "source": "measured",
                "peak_mem_gb": float(found["peak_mem_gb"]), "tokens_per_s": float(found["tokens_per_s"]), **at}
    if found is not None:
        return {"trainer": other, "trial_id": str(found["trial_id"]), "status": str(found.get("status")),
                "source": "measured", "peak_mem_gb": _float(found.get("peak_mem_gb")), "tokens_per_s": None, **at}
    if predicted_other_gb is not None and math.isfinite(predicted_other_gb):
        return {"trainer": other, "trial_id": None, "status": None, "source": "predicted",
                "peak_mem_gb": predicted_other_gb, "tokens_per_s": None,
                "checkpoint_level": level}
    return {"trainer": other, "trial_id": None, "status": None, "source": "none", "peak_mem_gb": None,
            "tokens_per_s": None}


def nearest_level(level: str, trainer: str) -> str:
    """The checkpoint level ``trainer`` runs for ``level`` (:func:`nearest_other`)."""
    if trainer != "trl":
        return level
    known = Level.of(level)
    return known.trl_level.value if known else Level.FULL.value


def _float(value: Any) -> float | None:
    return float(value) if is_finite(value) else None


def switch_text(row: pd.Series, moved: dict[str, Any]) -> str:
    """One sentence: the winner's trainer, and the same configuration under the other one."""
    own, other = trainer_of(row), moved["trainer"]
    head = f"Measured with the {own} trainer"
    mem, rate = float(row["peak_mem_gb"]), float(row["tokens_per_s"])
    if moved["source"] == "none":
        return f"{head}; the sweep has no {other} row of this configuration (search: {{trainer: [native, trl]}} adds one)."
    level = moved.get("checkpoint_level")
    at = f" at checkpoint level {level}, its nearest," if level and level != str(row.get("checkpoint_level")) else ""
    if moved["source"] == "predicted":
        return (f"{head}; with the {other} trainer{at} it is predicted to peak at {moved['peak_mem_gb']:.2f} GB "
                f"({moved['peak_mem_gb'] - mem:+.2f} GB; predicted by the memory model, not measured: "
                "search: {trainer: [native, trl]} measures it).")
    near = f", at checkpoint level {level}, its nearest" if at else ""
    if moved["status"] != Status.OK:
        return f"{head}; with the {other} trainer ({moved['trial_id']}{near}) it ended {moved['status']}."
    return (f"{head}; with the {other} trainer ({moved['trial_id']}, measured{near}) it peaks at "
            f"{moved['peak_mem_gb']:.2f} GB ({moved['peak_mem_gb'] - mem:+.2f} GB) at {fmt_sig(moved['tokens_per_s'], 4)} "
            f"tokens/s ({moved['tokens_per_s'] / rate:.2f}x).")


def pairs_markdown(analysed: pd.DataFrame) -> str:
    """frontier.md's section of each configuration measured by both trainers, side by side:
    peaks, tokens/s and what TRL costs against the native trainer; "" when no configuration has
    both."""
    if "trainer" not in analysed:
        return ""
    rows = []
    natives = analysed[analysed["trainer"].fillna("").replace("", "native") == "native"]
    for _, native in natives.iterrows():
        found = twin(analysed, native)
        if found is None:
            continue
        both_ok = str(native["status"]) == Status.OK and str(found["status"]) == Status.OK
        rows.append([fmt_int(native["micro_batch"]), str(native["checkpoint_level"]), fmt_int(native["grad_acc"]),
                     fmt_beta(native["beta"]), _cell(native, "peak_mem_gb"), _cell(found, "peak_mem_gb"),
                     f"{float(found['peak_mem_gb']) - float(native['peak_mem_gb']):+.2f}" if both_ok else "-",
                     _cell(native, "tokens_per_s"), _cell(found, "tokens_per_s"),
                     f"{float(found['tokens_per_s']) / float(native['tokens_per_s']):.2f}x" if both_ok else "-"])
    if not rows:
        return ""
    header = ("micro_batch", "checkpoint", "grad_acc", "beta", "native peak (GB)", "trl peak (GB)", "trl - native (GB)",
              "native tokens/s", "trl tokens/s", "trl / native")
    return ("## Native and TRL trainers\n\nEach configuration measured by both trainers (`train.trainer`), "
            "side by side; OOM where a trainer ran out of memory.\n\n" + to_markdown(header, rows))


def _cell(row: pd.Series, column: str) -> str:
    status = str(row.get("status"))
    if status != Status.OK:
        return "OOM" if status == Status.OOM else status or "-"
    return fmt_float(row[column], 2) if column == "peak_mem_gb" else fmt_sig(row[column], 4)
