"""What a resumed sweep may keep: the folder's rows matched to the new space by what they measured.

``--resume`` compares the space the folder's rows ran (``DIR/space.yaml``) with the one given now,
configuration by configuration. A row whose configuration the new space has again is kept, under
that configuration's id (trial ids come from the knobs' values, so reordering or inserting values
changes none; a dimension newly swept, or an id of an earlier version, is renamed). A row of a
configuration dropped from the search lists is kept too: what it measured has not changed. A row
whose meaning the new space would change (``train.steps``, the model, the data, ... set
differently) is refused (exit 2), naming the setting, before Ray starts: such rows and new ones
must not sit in one frontier under one ``space.yaml``. Rows whose space is unknown (no
``DIR/space.yaml``, or rows it does not name) are refused too, unless ``--accept-rows``.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from dpo_sweep import space as space_mod
from dpo_sweep.config import TrialConfig
from dpo_sweep.errors import SpaceError, UserError
from dpo_sweep.records import read_csv_rows
from dpo_sweep.results_dir import ResultsDir
from dpo_sweep.text import excerpt

#: TrialConfig fields that say which configuration a trial is, not how it was measured (its id and
#: sweep name), or that change how fast a trial starts, never what it measures.
_NOT_MEANING = {"trial_id", "space_name", "swept_train"}
_NOT_MEANING_PATHS = {"resources.warm_workers"}
_SHOWN = 5


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for k, v in data.items():
            out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: tuple(data) if isinstance(data, list) else data}


def meaning(cfg: TrialConfig) -> dict[str, Any]:
    """Every setting of ``cfg`` that its rows' numbers depend on, by dotted path."""
    flat = _flat(cfg.model_dump(mode="json", exclude=_NOT_MEANING))
    return {p: v for p, v in flat.items() if p not in _NOT_MEANING_PATHS}


def _dimension(path: str) -> str:
    """The search dimension a setting's path belongs to (``train.lr`` -> ``lr``, ``model.dtype`` -> ``model``)."""
    head, _, rest = path.partition(".")
    if head == "model":
        return "model"
    return rest if head == "train" else head


def _swept(sp: space_mod.Space) -> set[str]:
    dims = set(sp.spec.search or {})
    if "effective_batch" in dims:
        dims.add("grad_acc")  # derived from it
    return dims


@dataclass(frozen=True)
class ResumeMatch:
    """The rows' trial ids to rename (old -> new) so that each names its configuration in the new
    space (ids of earlier versions included)."""

    renamed: dict[str, str]


def _recorded_space(out_dir: Path) -> space_mod.Space | None:
    path = ResultsDir(out_dir).space
    if not path.is_file():
        return None
    try:
        return space_mod.parse(space_mod.load_raw(path), source=str(path))
    except SpaceError as err:
        raise UserError(
            f"--resume: {path}, the space the rows in {out_dir} ran, cannot be read ({excerpt(str(err), 300)}), "
            "so what they measured is unknown. Run without --resume (the earlier results move to "
            f"{ResultsDir(out_dir).previous('<time>').name}/) or give another --output") from None


def _shown(value: Any) -> str:
    return excerpt(repr(list(value) if isinstance(value, tuple) else value), 80)


def _unknown_rows_text(out_dir: Path, rows: int, why: str) -> str:
    files = ResultsDir(out_dir)
    return (f"--resume: {files.results} holds {rows} row(s) {why}, so whether they measured what this space "
            f"asks (train.steps, the model, the data, ...) is unknown, and resuming would put them in one "
            f"frontier with the new rows. Put the space file they ran back as {files.space}, or run without "
            f"--resume (the earlier results move to {files.previous('<time>').name}/), or give another "
            "--output; if you know they measured these settings, add --accept-rows")


def match_rows(out_dir: Path, new: space_mod.Space, accept_rows: bool = False) -> ResumeMatch:
    """The renames that make the rows of ``out_dir`` name their configurations in ``new``; raises
    UserError (exit 2) when ``new`` would change what some of them measured (the module doc), or
    when what they measured is unknown: no ``space.yaml``, or rows it does not name (unless
    ``accept_rows``: the user's word that they measured these settings; such rows are kept)."""
    recorded = _recorded_space(out_dir)
    row_ids = [r["trial_id"] for r in read_csv_rows(ResultsDir(out_dir).results) if r.get("trial_id")]
    if not row_ids:
        return ResumeMatch(dict(new.renamed))
    if recorded is None:
        if not accept_rows:
            raise UserError(_unknown_rows_text(out_dir, len(set(row_ids)), f"but no {ResultsDir.SPACE}"))
        return ResumeMatch(dict(new.renamed))
    legacy = dict(recorded.renamed)
    by_id = {t.trial_id: t for t in recorded.trials}
    new_by_meaning: dict[tuple, str] = {}
    new_meanings = []
    for t in new.trials:
        m = meaning(t)
        new_by_meaning[tuple(sorted(m.items()))] = t.trial_id
        new_meanings.append((t.trial_id, m))
    both_swept = _swept(recorded) & _swept(new)
    renamed: dict[str, str] = {}
    conflicts: list[tuple[str, list[tuple[str, Any, Any]]]] = []
    unnamed = [i for i in dict.fromkeys(row_ids) if legacy.get(i, i) not in by_id]
    if unnamed and not accept_rows:
        raise UserError(_unknown_rows_text(
            out_dir, len(unnamed), f"that its {ResultsDir.SPACE} does not name (e.g. {excerpt(unnamed[0], 80)})"))
    for row_id in dict.fromkeys(row_ids):
        rid = legacy.get(row_id, row_id)
        cfg = by_id.get(rid)
        if cfg is None:
            continue  # a row the recorded space does not name (--accept-rows): nothing to compare it with
        m = meaning(cfg)
        target = new_by_meaning.get(tuple(sorted(m.items())))
        if target is not None:
            if target != row_id:
                renamed[row_id] = target
            continue
        # Not in the new space: dropped from the lists (kept), or set differently (refused).
        closest = min(new_meanings, key=lambda tm: sum(tm[1].get(p) != v for p, v in m.items()))[1]
        changed = [(p, v, closest.get(p)) for p, v in m.items()
                   if closest.get(p) != v and _dimension(p) not in both_swept]
        if changed:
            conflicts.append((row_id, changed))
    if conflicts:
        raise UserError(_conflict_text(out_dir, conflicts))
    return ResumeMatch(renamed)


def _conflict_text(out_dir: Path, conflicts: list[tuple[str, list[tuple[str, Any, Any]]]]) -> str:
    settings: dict[str, tuple[Any, Any]] = {}
    for _, changed in conflicts:
        for path, old, new in changed:
            settings.setdefault(path, (old, new))
    lines = [f"  {path}: the rows ran {_shown(old)}, the space now says {_shown(new)}"
             for path, (old, new) in list(settings.items())[:_SHOWN]]
    more = len(settings) - len(lines)
    return (f"--resume: the space changes what {len(conflicts)} row(s) in {ResultsDir(out_dir).results} "
            f"measured (e.g. {conflicts[0][0]}):\n" + "\n".join(lines)
            + (f"\n  ... and {more} more setting(s)" if more else "")
            + f"\nOld and new rows must not share one frontier. Resume with the settings of "
            f"{ResultsDir(out_dir).space}, or start afresh: without --resume the earlier results move to "
            f"{ResultsDir(out_dir).previous('<time>').name}/, or give another --output. Adding values to "
            "the search lists, reordering or dropping them is fine")


def renamed_ids(ids: set[str], renamed: Mapping[str, str]) -> set[str]:
    """``ids`` as they read after ``renamed``."""
    return {renamed.get(i, i) for i in ids}
