"""The recommended configuration, ready to leave the tool: a space file with every setting pinned
(``DIR/recommended.yaml``, one trial for ``dpo-sweep validate`` and ``dpo-sweep trial``) and the
same setting as TRL ``DPOConfig`` arguments (analysis/trl_export.py), with what TRL cannot express named.

The winner's full configuration is the sweep's own: DIR/space.yaml (the runner's copy) expanded
again, the trial found by id (or, for ids of another version, by its swept values). Settings that
a trial resolves at run time (``auto`` attention and liger-kernel) are pinned to what the winner's
row says it used.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from dpo_sweep import space as space_mod, trl_fields
from dpo_sweep import trl_export as trl_export_mod
from dpo_sweep.trl_export import TrlExport
from dpo_sweep.config import TrialConfig
from dpo_sweep.errors import SpaceError
from dpo_sweep.files import write_text_atomic
from dpo_sweep.results_dir import ResultsDir
from dpo_sweep.trl_fields import TrlFields


@dataclass(frozen=True)
class Winner:
    """The recommended trial's configuration and how to use it elsewhere."""

    trial: TrialConfig | None
    """The winner as a trial of DIR/space.yaml; None when it cannot be rebuilt (see ``note``)."""
    space_yaml: str = ""
    """recommended.yaml's text ("" without a trial)."""
    trl: TrlExport | None = None
    """The winner in TRL's terms (recommendation.json's ``"trl"``); None without a trial."""
    switch: str = ""
    """The winner's trainer and what the other one costs or saves (analysis/trainer_switch.py)."""
    switch_data: dict[str, Any] | None = None
    """The same as data (recommendation.json's ``"trl"."switch"``)."""
    note: str = ""
    """Why a recommended trial has no ``trial`` (no space.yaml, an unreadable one, no matching
    trial); empty when nothing was recommended."""

    def trl_code(self) -> str:
        """The TRL export as Python to paste, after the trainer line ("" without a trial)."""
        if self.trl is None:
            return ""
        return (f"# {self.switch}\n" if self.switch else "") + trl_export_mod.text(self.trl)

    def trl_json(self) -> dict[str, Any] | None:
        """recommendation.json's ``"trl"``: the export and the trainer switch (None without a trial)."""
        if self.trl is None:
            return None
        return {**self.trl.to_json(), "switch": self.switch_data}


def _row_value(row: pd.Series, column: str) -> Any:
    value = row.get(column)
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return None
    return value


def _ran_pad_multiple(row: pd.Series) -> int:
    """The width multiple the row's trial padded to (``pad_multiple``). Rows from before the
    column (0 or none) padded to their longest row: 1."""
    value = _row_value(row, "pad_multiple")
    return max(1, int(float(value))) if value is not None else 1


def _same(a: Any, b: Any) -> bool:
    """A results.csv cell (text, numpy) against a config value."""
    if isinstance(b, bool) or isinstance(a, bool):
        return str(a).lower() == str(b).lower()
    if isinstance(b, (int, float)) and not isinstance(b, bool):
        try:
            return math.isclose(float(a), float(b), rel_tol=1e-9)
        except (TypeError, ValueError):
            return False
    return str(a) == str(b)


def find_trial(trials: tuple[TrialConfig, ...], row: pd.Series,
               renamed: dict[str, str] | None = None) -> TrialConfig | None:
    """The trial of ``row``: by id (``renamed``: an earlier version's ids of these trials, see
    space.Space.renamed), else the one whose knobs and swept train values it holds."""
    trial_id = str(row.get("trial_id"))
    trial_id = (renamed or {}).get(trial_id, trial_id)
    for t in trials:
        if t.trial_id == trial_id:
            return t
    matches = []
    for t in trials:
        values = {**t.knobs(), **t.swept_columns()}
        values.pop("model", None)  # a label, which other versions may spell differently
        if all(_row_value(row, k) is not None and _same(_row_value(row, k), v) for k, v in values.items()):
            matches.append(t)
    same_model = [t for t in matches if t.model.label() == str(row.get("model"))]
    return (same_model or matches or [None])[0]


def _resolved_model(trial: TrialConfig, row: pd.Series) -> dict[str, Any]:
    """The model section with ``auto`` replaced by what the winner ran with."""
    model = trial.model.model_dump(mode="json", exclude_none=True)
    attention = _row_value(row, "attn_implementation")
    if model.get("attn_implementation") == "auto" and attention in ("sdpa", "flash_attention_2", "eager"):
        model["attn_implementation"] = attention
    liger = _row_value(row, "liger_kernel")
    if model.get("liger_kernel") == "auto" and str(liger).lower() in ("true", "false"):
        model["liger_kernel"] = str(liger).lower() == "true"
    return model


def _resolved_train(trial: TrialConfig, row: pd.Series) -> dict[str, Any]:
    """The train section with ``pad_to_multiple_of: auto`` replaced by the multiple the winner ran with."""
    train = trial.train.model_dump(mode="json")
    if train["pad_to_multiple_of"] == "auto":
        train["pad_to_multiple_of"] = _ran_pad_multiple(row)
    return train


def pinned_space(trial: TrialConfig, row: pd.Series, objectives: dict[str, Any] | None = None) -> dict[str, Any]:
    """A space mapping whose one trial is ``trial``, every section written out in full."""
    raw = {
        "name": f"{trial.space_name}-recommended",
        "model": _resolved_model(trial, row),
        "data": trial.data.model_dump(mode="json", exclude_none=True),
        "train": _resolved_train(trial, row),
        "resources": trial.resources.model_dump(mode="json"),
        "search": {"micro_batch": [trial.micro_batch], "checkpoint_level": [trial.checkpoint_level],
                   "grad_acc": [trial.grad_acc], "beta": [trial.beta]},
    }
    if objectives:
        raw["objectives"] = objectives
    return raw


def space_text(raw: dict[str, Any], trial: TrialConfig, results_dir: Path) -> str:
    """recommended.yaml: a header with the commands, then the mapping."""
    path = ResultsDir(results_dir).recommended
    header = (f"# The recommended configuration of the sweep in {results_dir}: trial {trial.trial_id},\n"
              "# every setting pinned (one trial). Written by `dpo-sweep report`; the runtime choices\n"
              "# (attention, liger-kernel) are pinned to what the trial ran with.\n"
              f"# Check it only:      dpo-sweep validate {path}\n"
              f"# Run it once:        dpo-sweep trial {path}\n")
    return header + yaml.safe_dump(raw, sort_keys=False, default_flow_style=None, width=100)


def trl_export(trial: TrialConfig, row: pd.Series, trl: TrlFields | None = None) -> TrlExport:
    """The winner in the TRL terms of ``trl`` (None: the installed TRL's, else the recorded list's)."""
    return trl_export_mod.build(trial, _resolved_model(trial, row), _ran_pad_multiple(row),
                                trl if trl is not None else trl_fields.load())


def without_step_time(raw: dict[str, Any]) -> dict[str, Any]:
    """A results dir's space copy without ``objectives.step_time``, an objective of older versions
    that the analysis reads as throughput (and a space file to run refuses)."""
    objectives = raw.get("objectives")
    if isinstance(objectives, dict) and "step_time" in objectives:
        return {**raw, "objectives": {k: v for k, v in objectives.items() if k != "step_time"}}
    return raw


def winner_of(results_dir: Path, row: pd.Series | None, objectives: dict[str, Any] | None = None,
              trl: TrlFields | None = None) -> Winner:
    """The winner of ``results_dir`` (``row``: its results row; None: nothing was recommended;
    ``trl``: the TRL fields to export to, None: the installed TRL's, else the recorded list's)."""
    if row is None:
        return Winner(None)
    path = ResultsDir(results_dir).space
    if not path.is_file():
        return Winner(None, note=f"{path} is absent ({ResultsDir.RESULTS} only), so the winner's other "
                      "settings are unknown")
    try:
        space = space_mod.parse(without_step_time(space_mod.load_raw(path)), str(path))
    except SpaceError as err:
        return Winner(None, note=f"{path} no longer validates, so the winner cannot be pinned: "
                      + str(err).splitlines()[-1].strip())
    trial = find_trial(space.trials, row, space.renamed)
    if trial is None:
        return Winner(None, note=f"no trial of {path} matches {row.get('trial_id')}: the space file changed")
    # Named as its row is (a folder of an earlier version numbered its ids by list position).
    trial = trial.model_copy(update={"trial_id": str(row.get("trial_id"))})
    if objectives and "step_time" in objectives:  # the older time objective, as the analysis read it
        objectives = {**without_step_time({"objectives": objectives})["objectives"], "throughput": "max"}
    text = space_text(pinned_space(trial, row, objectives), trial, results_dir)
    return Winner(trial, text, trl_export(trial, row, trl))


def write_winner(results_dir: Path, winner: Winner) -> Path | None:
    """Write (or, with no winner, remove a stale) DIR/recommended.yaml; its path when written."""
    path = ResultsDir(results_dir).recommended
    if winner.trial is None:
        path.unlink(missing_ok=True)
        return None
    write_text_atomic(path, winner.space_yaml)
    return path

