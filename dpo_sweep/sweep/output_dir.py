"""The results directory of a sweep: where it is, what a resumed sweep skips, the space file's copy,
and environment.json (the layout is the contract in docs/contracts.md#the-results-folder)."""
from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from dpo_sweep.records import (PENDING, RESULTS_COLUMNS, STEPS_COLUMNS, TrialResult, read_csv_rows,
                               rewrite_csv, rows_as, write_environment_json)
from dpo_sweep.csv_table import damaged_text, read_csv_table
from dpo_sweep.files import write_text_atomic
from dpo_sweep.results_dir import ResultsDir


def default_output_dir(space_name: str) -> Path:
    return Path("reports") / space_name


def finished_trial_ids(out_dir: Path) -> set[str]:
    """Trial ids whose row in ``DIR/results.csv`` is final: not waiting for a learning trial, not
    lost to the machine (a dead process, a trial past its limit: ``infrastructure_failure``)."""
    return {r["trial_id"] for r in read_csv_rows(ResultsDir(out_dir).results)
            if r.get("trial_id") and r.get("stability") != PENDING and not _lost(r)}


def _lost(row: dict[str, str]) -> bool:
    return row.get("infrastructure_failure") == "True"


def _drop_lost_rows(out_dir: Path) -> None:
    """Drop the rows lost to the machine (and their trials' steps): their configurations run again."""
    lost = {r["trial_id"] for r in read_csv_rows(ResultsDir(out_dir).results) if _lost(r)}
    if lost:
        drop_rows(out_dir, lost)
        print(f"resume: {len(lost)} trial(s) lost to an infrastructure failure or a timeout run again")


def pending_rows(out_dir: Path) -> list[TrialResult]:
    """The rows of ``DIR/results.csv`` written when measured whose learning trial had not ended."""
    return rows_as(TrialResult, (r for r in read_csv_rows(ResultsDir(out_dir).results)
                                 if r.get("trial_id") and r.get("stability") == PENDING))


def drop_rows(out_dir: Path, trial_ids: set[str]) -> None:
    """Remove the rows of ``trial_ids`` from results.csv and their trials' steps from steps.csv
    (atomic rewrites): configurations a resumed sweep measures again."""
    for path in ResultsDir(out_dir).row_files:
        rows = read_csv_rows(path)
        kept = [r for r in rows if r.get("trial_id") not in trial_ids]
        if len(kept) != len(rows):
            rewrite_csv(path, kept, list(rows[0]))


def referenced_trial_ids(out_dir: Path) -> set[str]:
    """Trials that rows of ``DIR/results.csv`` name as their measurement or learning trial (a
    planner's ``<id>-learning`` trial has steps but no row of its own)."""
    rows = read_csv_rows(ResultsDir(out_dir).results)
    return {r[c] for r in rows for c in ("measured_by", "stability_from") if r.get(c)}


def _drop_orphan_steps(out_dir: Path, keep_ids: set[str]) -> None:
    """A sweep killed between writing a trial's steps and its summary row leaves step rows of a
    trial that will run again: drop them (and a cut-off line) so that steps.csv holds every trial
    exactly once."""
    path = ResultsDir(out_dir).steps
    table = read_csv_table(path)
    kept = [r for r in table.rows if r.get("trial_id") in keep_ids]
    if len(kept) == len(table.rows) and not table.damaged:
        return
    # The file's own columns too: one written by an older version keeps every cell it had.
    rewrite_csv(path, kept, STEPS_COLUMNS + [c for c in table.header if c not in STEPS_COLUMNS])


#: Columns that hold a trial id (a row's own, or the trial whose measurement it carries).
_ID_COLUMNS = ("trial_id", "measured_by", "stability_from", "timed_by")


def _renamed_id(value: str, renamed: Mapping[str, str]) -> str:
    """``value`` under ``renamed``, with a planner suffix kept (``<id>-learning``, ``<id>-runoff``)."""
    for old, new in renamed.items():
        if value == old or value.startswith(old + "-"):
            return new + value[len(old):]
    return value


def rename_trials(out_dir: Path, renamed: Mapping[str, str]) -> int:
    """Rewrite the trial ids of ``DIR/results.csv`` and ``DIR/steps.csv`` that ``renamed`` maps
    (an older version's ids for the same trials; space.Space.renamed); returns the rows renamed."""
    count, files = 0, ResultsDir(out_dir)
    for path, columns in ((files.results, RESULTS_COLUMNS), (files.steps, STEPS_COLUMNS)):
        rows = read_csv_rows(path)
        changed = False
        for row in rows:
            for c in _ID_COLUMNS:
                if row.get(c) and (new := _renamed_id(row[c], renamed)) != row[c]:
                    row[c], changed = new, True
                    count += c == "trial_id"
        if changed:
            rewrite_csv(path, rows, list(columns) + [c for c in rows[0] if c not in columns])
    return count


def _drop_damaged_rows(out_dir: Path) -> set[str]:
    """Rewrite results.csv without its damaged records (a line cut off by a kill or a full disk
    during an append: :func:`~dpo_sweep.csv_table.read_csv_table`), saying which; their trials are
    not finished, so they run again. Returns the trial ids those records name."""
    path = ResultsDir(out_dir).results
    table = read_csv_table(path)
    if not table.damaged:
        return set()
    rewrite_csv(path, table.rows, table.header)
    print(f"resume: {damaged_text(path, table.damaged)}; dropped, {len(table.damaged)} trial(s) run again")
    return {d.trial_id for d in table.damaged}


def prepare_output(space_path: Path, out_dir: Path, resume: bool, renamed: Mapping[str, str] | None = None,
                   space_text: str | None = None) -> set[str]:
    """Create ``out_dir``, copy the space file to ``DIR/space.yaml`` (``space_text``: write that
    instead, the settings ``--set`` changed) and return the trial ids to skip. Without
    ``--resume`` earlier results are moved to ``DIR/previous-<time>/``, not lost; with it, rows
    under an older version's ids or of a configuration the space now names otherwise (``renamed``:
    old -> new, :func:`dpo_sweep.sweep.resume.match_rows`) take the new ones."""
    out_dir.mkdir(parents=True, exist_ok=True)
    done: set[str] = set()
    if resume:
        if renamed and (count := rename_trials(out_dir, renamed)):
            print(f"resume: {count} row(s) in {out_dir} renamed to the ids of their configurations in this space")
        rerun = _drop_damaged_rows(out_dir)
        _drop_lost_rows(out_dir)
        done = finished_trial_ids(out_dir)
        _drop_orphan_steps(out_dir, (done | referenced_trial_ids(out_dir)) - (rerun - done))
    else:
        old = [p for p in ResultsDir(out_dir).row_files if p.exists()]
        if old:
            aside = ResultsDir(out_dir).previous(time.strftime("%Y%m%d-%H%M%S"))
            aside.mkdir(exist_ok=True)
            for p in old:
                shutil.move(str(p), aside / p.name)
            print(f"earlier results moved to {aside} (use --resume to continue a sweep instead)")
    target = ResultsDir(out_dir).space
    if space_text is not None:
        write_text_atomic(target, space_text)
    elif space_path.resolve() != target.resolve():
        write_text_atomic(target, space_path.read_text(encoding="utf-8-sig"))
    return done


def save_environment(out_dir: Path, out: Callable[[str], None],
                     info: dict[str, Any] | None = None) -> None:
    """Write DIR/environment.json (``info``: a machine's, collected elsewhere; None: this
    process's, which imports torch). A failure is a note, never the sweep's end."""
    try:
        if info is None:
            from dpo_sweep.telemetry import environment_info

            info = environment_info()
        write_environment_json(out_dir, info)
    except Exception as err:  # noqa: BLE001 - a missing GPU library must not stop the sweep
        out(f"note: {ResultsDir.ENVIRONMENT} not written ({type(err).__name__}: {err})")
