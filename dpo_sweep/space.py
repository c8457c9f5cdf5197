"""Search-space files: load, validate with messages that name the key, expand into trials.

A space file (YAML) has the sections of :class:`SweepSpace`. ``search:`` holds the swept
dimensions, each an entry of the one table (dpo_sweep/core/dimensions.py: ``micro_batch``,
``checkpoint_level``, ``grad_acc`` or ``effective_batch``, ``beta``, ``model``,
``workers_per_trial``, ``parallelism``, and any ``train`` field by its name), and ``paired:``, values
that go together; dpo_sweep/space_expand.py crosses them into trials and skips the points that
cannot run. Which points of the grid run is the ``sampler:`` section's business (every point, or a
random sample). A value listed twice in one dimension is refused: it would run the same trials twice.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from dpo_sweep.config import DataSpec, ModelSpec, ObjectivesSpec, ResourcesSpec, SamplerSpec, TrainSpec, TrialConfig
from dpo_sweep.core.dimensions import BY_KEY, SkippedPoint
from dpo_sweep import migrate, space_expand, space_yaml
from dpo_sweep.errors import SpaceError
from dpo_sweep.space_expand import ID_HASH_CHARS, as_list, format_validation  # noqa: F401 (the id's hash length)
from dpo_sweep.text import excerpt, shown


def _is_dimension(key: str) -> bool:
    """A name ``search:`` (or ``--set``) accepts: a dimension of the table or a TrainSpec field."""
    return space_expand.dimension(key) is not None


class SweepSpace(BaseModel):
    """A whole space file after validation."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(..., description="Name of the sweep; the default output dir is reports/<name>/.")
    model: ModelSpec
    data: DataSpec
    train: TrainSpec = TrainSpec()
    resources: ResourcesSpec = ResourcesSpec()
    search: dict[str, Any] = Field(default_factory=dict)
    sampler: SamplerSpec = SamplerSpec()
    objectives: ObjectivesSpec = ObjectivesSpec()

    @field_validator("name")
    @classmethod
    def _one_folder_name(cls, name: str) -> str:
        """The name is the default results folder's last part (reports/<name>/) and is written
        into recommended.yaml and the report: one printable path segment, so that a sweep never
        writes outside reports/ and no file or console line carries a control character."""
        problem = name_problem(name)
        if problem:
            raise ValueError(f"{problem}; give one folder name of letters, digits, '-', '_', '.' "
                             f"(at most {MAX_NAME_CHARS} characters), e.g. name: my-sweep")
        return name


#: The longest sweep name (a folder name, with room for reports/ and a timestamp).
MAX_NAME_CHARS = 100


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a sweep's name (a folder under reports/), or None."""
    if not name.strip():
        return "is empty"
    if len(name) > MAX_NAME_CHARS:
        return f"is {len(name)} characters long"
    if not name.isprintable():
        return "holds a control character (a line break, tab or terminal escape)"
    if "/" in name or "\\" in name:
        return "holds a path separator: the results would be written outside reports/"
    if name in (".", "..") or name != name.strip():
        return "is not a folder name of its own ('.', '..' or with spaces at either end)"
    return None


@dataclass(frozen=True)
class Space:
    """A validated space and its expanded trials."""

    spec: SweepSpace
    trials: tuple[TrialConfig, ...]
    source: str
    renamed: dict[str, str] = field(default_factory=dict)
    """Trial ids that earlier versions gave these trials (numbered by list position; a swept model
    not named) -> this version's: ``--resume`` renames the rows of an older results dir (with the
    ids of its own recorded space, whose list order they were numbered in)."""
    #: The mapping it was parsed from, ``--set`` overrides applied (what DIR/space.yaml records).
    raw: dict[str, Any] = field(default_factory=dict, compare=False)
    #: The points of the grid that cannot run, each with its reason (``validate`` and the report list them).
    skipped: tuple[SkippedPoint, ...] = ()

    @property
    def name(self) -> str:
        return self.spec.name


def _set_dotted(raw: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = raw
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise SpaceError(f"--set {excerpt(dotted, 80)}: {excerpt(p, 80)} is not a section")
    node[parts[-1]] = value


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``KEY=VALUE`` overrides. A bare search dimension (``micro_batch=4``) pins that
    dimension to one value, or a YAML list of them (``micro_batch=[2,4]``) sweeps those; a dotted
    key (``train.steps=3``) sets that field."""
    raw = copy.deepcopy(raw)
    for item in overrides:
        if "=" not in item:
            raise SpaceError(f"--set {shown(item)}: expected KEY=VALUE, e.g. --set micro_batch=4")
        key, text = item.split("=", 1)
        key = key.strip()
        value = space_yaml.safe_yaml(text, f"--set {excerpt(key, 80)}") if text.strip() else None
        if "." in key and not key.startswith("search."):
            _set_dotted(raw, key, value)
        else:
            dim = key.removeprefix("search.")
            if dim in migrate.MOVED_TO_SAMPLER:
                raise SpaceError(f"--set {key}: {migrate.moved_to_sampler(dim)} (--set sampler.{dim}=...)")
            if not _is_dimension(dim):
                raise SpaceError(
                    f"--set {excerpt(key, 80)}: unknown dimension; use one of {space_expand.dimension_names()}, a train "
                    "field (e.g. max_length, loss, precision) or a dotted key (train.steps=3)"
                )
            search = raw.setdefault("search", {}) or {}
            raw["search"] = search
            search[dim] = as_list(dim, value)
            if dim == "grad_acc":
                search.pop("effective_batch", None)
            if dim == "effective_batch":
                search.pop("grad_acc", None)
    return raw


def _check_levels(levels: list[Any]) -> None:
    problem = BY_KEY["checkpoint_level"].check("checkpoint_level", levels)
    if problem:
        raise SpaceError(problem)


def expand(spec: SweepSpace, source: str = "space") -> tuple[TrialConfig, ...]:
    """Expand the search dimensions into trial configurations (grid, or a random sample)."""
    return space_expand.expand_with_renames(spec, source)[0]


def parse(raw: dict[str, Any], source: str = "space", progress: Callable[[int, int], None] | None = None) -> Space:
    """Validate a raw mapping (as read from YAML) and expand it (``progress``: see
    :func:`~dpo_sweep.space_expand.expand_with_renames`)."""
    raw = dict(raw)
    space_yaml.check_values(raw, source)  # NaN, infinities, integers past 64 bits: before pydantic
    search = raw.get("search") or {}
    if not isinstance(search, dict):
        raise SpaceError(f"{source}: search: must be a mapping of dimension -> list of values")
    if "checkpoint_level" in search:
        _check_levels(as_list("checkpoint_level", search["checkpoint_level"]))
    try:
        spec = SweepSpace(**raw)
    except ValidationError as err:
        raise SpaceError(format_validation(source, err)) from None
    except TypeError as err:  # e.g. a section given as a list instead of a mapping
        raise SpaceError(f"{source}: {excerpt(str(err))}") from None
    trials, renamed, skipped = space_expand.expand_with_renames(spec, source, progress)
    return Space(spec=spec, trials=trials, source=source, renamed=renamed, raw=raw, skipped=skipped)


def parse_section(cls: type[BaseModel], raw: dict[str, Any], key: str, source: str = "space") -> Any:
    """One section of a raw space mapping validated by its own model (None when absent or null):
    for readers that need only that section, e.g. the analysis of a results directory's copy."""
    value = raw.get(key)
    if value is None:
        return None
    try:
        return cls.model_validate(value)
    except ValidationError as err:
        raise SpaceError(format_validation(source, err, prefix=key)) from None


load_raw = space_yaml.load_raw  # the file's mapping, read with limits


def load(path: str | Path, overrides: list[str] | None = None,
         progress: Callable[[int, int], None] | None = None) -> Space:
    """Load, apply ``--set`` overrides, validate and expand a space file (``progress``: see :func:`parse`)."""
    raw = load_raw(path)
    if overrides:
        raw = apply_overrides(raw, overrides)
    return parse(raw, source=str(path), progress=progress)
