"""Whether a results folder holds the whole sweep: every configuration of DIR/space.yaml has a row,
and no row still waits for its learning trial (``stability`` :data:`~dpo_sweep.records.PENDING`).

A sweep stopped by a timeout or Ctrl-C leaves a folder that analyses like a finished one; this is
what the report's banner and recommendation.json's ``sweep_complete`` / ``still_to_run`` say.
Configurations are matched by their settings, not their ids, so a folder written by an older
version (other id spellings) is matched too.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from dpo_sweep import migrate, space as space_mod
from dpo_sweep.analysis.tables import fmt_setting
from dpo_sweep.config import TrialConfig
from dpo_sweep.core.dimensions import CONFIG_COLUMNS, LEVER_COLUMNS, SkippedPoint
from dpo_sweep.errors import UserError
from dpo_sweep.records import PENDING
from dpo_sweep.results_dir import ResultsDir



@dataclass(frozen=True)
class Completeness:
    """What recommendation.json says of the sweep's completeness."""

    complete: bool | None
    """True: every configuration measured and judged; False: some still to run; None: unknown
    (no readable space.yaml and no pending row)."""
    still_to_run: list[dict[str, Any]] = field(default_factory=list)
    """One entry per configuration still to run: ``{"trial_id", "missing"}``, missing being
    ``measurement`` (no row) or ``stability`` (measured, its learning trial not run)."""
    note: str = ""
    """Why completeness is unknown ("" when it is known)."""
    skipped: tuple[SkippedPoint, ...] = ()
    """The space's points that cannot run, each with its reason (no configuration is missing for them)."""

    def to_json(self) -> dict[str, Any]:
        return {"sweep_complete": self.complete, "still_to_run": list(self.still_to_run)}

    def skipped_markdown(self) -> str:
        """frontier.md's section of the skipped points ("" when none was)."""
        if not self.skipped:
            return ""
        return ("## Points skipped\n\nPoints of the space that cannot run (no trial, no row), each with its reason:\n\n"
                + "\n".join(f"-{p.line().removeprefix('  skipped')}" for p in self.skipped) + "\n")

    def counts(self) -> tuple[int, int]:
        """(configurations without a row, rows waiting for their stability)."""
        missing = sum(1 for e in self.still_to_run if e["missing"] == "measurement")
        return missing, len(self.still_to_run) - missing


def _config_key(cfg: TrialConfig) -> tuple[tuple[str, str], ...]:
    knobs = cfg.knobs()
    values = {k: knobs[k] for k in CONFIG_COLUMNS}  # effective_batch follows from them
    values.update({name: getattr(cfg.train, name) for name in LEVER_COLUMNS})
    values.update(cfg.swept_columns())
    return tuple(sorted((k, fmt_setting(v)) for k, v in values.items()))


#: What an empty lever cell means (rows written before the levers, hand-made rows).
LEVER_DEFAULTS = {"adapter": "full", "optimizer": "adamw"}


def _row_key(row: pd.Series, columns: list[str]) -> tuple[tuple[str, str], ...]:
    values = {c: fmt_setting(row.get(c)) for c in columns}
    values.update({c: d for c, d in LEVER_DEFAULTS.items() if values.get(c) == "-"})
    return tuple(sorted(values.items()))


def _space(path: Path) -> space_mod.Space:
    """The space's configurations and skipped points; an old ``step_time`` objective read as
    today's (it changes no configuration)."""
    raw = space_mod.load_raw(path)
    if migrate.has_step_time(raw.get("objectives")):
        raw = {**raw, "objectives": migrate.without_step_time(raw["objectives"])}
    return space_mod.parse(raw, source=str(path))


def completeness(out_dir: str | Path, results: pd.DataFrame) -> Completeness:
    """Compare DIR/space.yaml's configurations with ``results`` (results.csv's rows)."""
    pending = results[results["stability"].astype(object) == PENDING] if "stability" in results else results[:0]
    waiting = [{"trial_id": str(t), "missing": "stability"} for t in pending["trial_id"]]
    path = ResultsDir(out_dir).space
    try:
        sp = _space(path) if path.is_file() else None
    except (UserError, OSError, ValueError) as err:  # a space this version cannot expand: say so, go on
        sp, note = None, f"{ResultsDir.SPACE} could not be expanded ({str(err).splitlines()[0]})"
    else:
        note = "" if sp is not None else f"no {ResultsDir.SPACE} to compare with"
    if sp is None:
        return Completeness(False if waiting else None, waiting, note)
    trials = sp.trials
    missing, seen = [], {}
    if "infrastructure_failure" in results:  # lost to the machine: --resume measures it again
        results = results[~results["infrastructure_failure"].fillna(False).astype(bool)]
    for cfg in trials:
        key = _config_key(cfg)
        columns = tuple(k for k, _ in key)
        if not all(c in results for c in columns):
            continue  # a results.csv without the column cannot tell; never call it missing
        if columns not in seen:
            seen[columns] = {_row_key(r, list(columns)) for _, r in results.iterrows()}
        if key not in seen[columns]:
            missing.append({"trial_id": cfg.trial_id, "missing": "measurement"})
    return Completeness(not missing and not waiting, missing + waiting, skipped=sp.skipped)
