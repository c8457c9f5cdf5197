"""Search-space files: load, validate with messages that name the key, expand into trials.

A space file (YAML) has the sections of :class:`SweepSpace`. ``search:`` holds the
swept dimensions: ``micro_batch``, ``checkpoint_level``, ``grad_acc`` (or ``effective_batch``,
from which grad_acc is derived), ``beta``, ``model`` (a list of model specs or preset names), and
any ``train`` field by its name (``loss``, ``lr``, ``seed``, ``max_length``, ...). Which points of
the grid run is the ``sampler:`` section's business (every point, or a random sample). A value
listed twice in one dimension is refused: it would run the same trials twice.
"""
from __future__ import annotations

import copy
import hashlib
import itertools
import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from dpo_sweep.config import (
    CHECKPOINT_LEVELS,
    REFUSED_LEVELS,
    DataSpec,
    ModelSpec,
    ObjectivesSpec,
    ResourcesSpec,
    SamplerSpec,
    TrainSpec,
    TrialConfig,
)
from dpo_sweep.refusals import refused_adaptive_clip, refused_optimizer_in_backward
from dpo_sweep.core.trial_facts import refused_attention, refused_cuda_lever
from dpo_sweep import migrate, space_yaml, trl_export
from dpo_sweep.errors import SpaceError
from dpo_sweep.text import excerpt, shown

#: Search dimensions with their own handling; any TrainSpec field may be swept as well.
CORE_DIMS = ("micro_batch", "checkpoint_level", "grad_acc", "effective_batch", "beta", "model")


def _is_dimension(key: str) -> bool:
    """A name ``search:`` (or ``--set``) accepts: a core dimension or a TrainSpec field."""
    return key in CORE_DIMS or key in TrainSpec.model_fields


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

    @property
    def name(self) -> str:
        return self.spec.name


def _where(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc if not str(p).startswith("function-")) or "(top level)"


def _format_validation(source: str, err: ValidationError, prefix: str = "") -> str:
    lines = [f"{source}: invalid search space"]
    for e in err.errors():
        loc = tuple(x for x in e["loc"] if not (isinstance(x, str) and x in ("literal_error",)))
        key = _where(loc)
        if prefix:
            key = f"{prefix}.{key}" if key != "(top level)" else prefix
        value = e.get("input")
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key (check its spelling against the space-file reference, docs/space-file.md)"
        elif e["type"] == "missing":
            msg = "is required"
        quoted = "" if e["type"] in ("missing",) or isinstance(value, dict) else f" (got {shown(value)})"
        lines.append(f"  {key}: {excerpt(msg)}{quoted}")
    return "\n".join(lines)


def _as_list(key: str, value: Any) -> list[Any]:
    if isinstance(value, list):
        if not value:
            raise SpaceError(f"search.{key}: empty list; give at least one value")
        return value
    return [value]


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
                    f"--set {excerpt(key, 80)}: unknown dimension; use one of {', '.join(CORE_DIMS)}, a train "
                    "field (e.g. max_length, loss, precision) or a dotted key (train.steps=3)"
                )
            search = raw.setdefault("search", {}) or {}
            raw["search"] = search
            search[dim] = _as_list(dim, value)
            if dim == "grad_acc":
                search.pop("effective_batch", None)
            if dim == "effective_batch":
                search.pop("grad_acc", None)
    return raw


def _check_levels(levels: list[Any]) -> None:
    for lv in levels:
        if lv in REFUSED_LEVELS:
            raise SpaceError(f"search.checkpoint_level: {shown(lv)}: {REFUSED_LEVELS[lv]}")
        if lv not in CHECKPOINT_LEVELS:
            raise SpaceError(
                f"search.checkpoint_level: {shown(lv)} is not a checkpoint level; allowed: "
                f"{', '.join(CHECKPOINT_LEVELS)}"
            )


def _positive_ints(key: str, values: list[Any]) -> list[int]:
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise SpaceError(f"search.{key}: {shown(v)} is not allowed; give positive integers")
    return values


def _refuse_repeats(key: str, values: list[Any], same_as: list[Any] | None = None) -> None:
    """``same_as[i]`` is ``values[i]`` as the trial sees it (``"1e-4"`` and ``0.0001`` are one lr)."""
    same_as = values if same_as is None else same_as
    for i, value in enumerate(same_as):
        if value in same_as[:i]:
            first = values[same_as.index(value)]
            said = shown(values[i]) if first == values[i] else f"{shown(values[i])} (the same as {shown(first)})"
            raise SpaceError(f"search.{key}: {said} is listed twice; every value runs its own trials, "
                             "so a repeat would run the same trials again: list each value once")


def _as_train_value(key: str, value: Any) -> Any:
    """A swept train value as TrainSpec stores it; an invalid one is left for TrainSpec to report."""
    try:
        return TypeAdapter(TrainSpec.model_fields[key].annotation).validate_python(value)
    except ValidationError:
        return value


def _model_specs(spec: SweepSpace, values: list[Any], source: str) -> list[ModelSpec]:
    """``search.model`` entries (preset names or mappings over the space's model) as ModelSpecs."""
    models = []
    for m in values:
        if m is None:
            models.append(spec.model)
            continue
        m = {"preset": m} if isinstance(m, str) else m
        try:
            models.append(ModelSpec(**{**spec.model.model_dump(exclude={"preset", "name_or_path"}), **m}))
        except ValidationError as err:
            raise SpaceError(_format_validation(source, err, prefix="search.model")) from None
    return models


def _id_part(name: str, value: Any) -> str:
    """``seed-1``, ``lr-0.0001``, ``loss-ipo``: a swept train field in a trial id (path-safe)."""
    text = f"{value:g}" if isinstance(value, float) else str(value)
    return f"{name}-{re.sub(r'[^A-Za-z0-9.+]+', '-', text).strip('-')}"


#: Hex digits of the content hash that heads a trial id (the tables' short id: ``t3f2a``).
ID_HASH_CHARS = 4


def _trial_id(point: dict[str, Any], train_over: dict[str, Any], model: str = "") -> str:
    """``t3f2a_mb2_none_ga1_b0.1_lr-0.0001``: a short hash of the knob part, then the knob part
    itself (every swept dimension's value; ``model``: the model's part when the model is swept,
    ``t91c0_tiny-llama_mb2_...``). Both come from the configuration's values alone, never from
    where they stand in the space file's lists: reordering or inserting a value leaves every
    other trial's id as it was, which is what ``--resume`` matches rows by."""
    beta = f"{point['beta']:g}"
    swept = "".join(f"_{_id_part(k, v)}" for k, v in train_over.items())
    knobs = (f"{model + '_' if model else ''}mb{point['micro_batch']}_{point['checkpoint_level']}"
             f"_ga{point['grad_acc']}_b{beta}{swept}")
    return f"t{hashlib.sha256(knobs.encode()).hexdigest()[:ID_HASH_CHARS]}_{knobs}"


def _model_id_parts(models: list[ModelSpec], values: list[Any]) -> tuple[list[str], list[str]]:
    """Each swept model's part of the trial ids: its label made path-safe (``tiny-llama``,
    ``meta-llama-Llama-3.2-1B``), with a hash of its ``search.model`` entry when two share a label
    (``tiny-llama-5d1e``: the entry's content, not its place in the list); none when one model.
    Also the parts earlier versions numbered by list position (``tiny-llama-0``)."""
    if len(models) < 2:
        return [""] * len(models), [""] * len(models)
    labels = [re.sub(r"[^A-Za-z0-9.+]+", "-", m.label()).strip("-") for m in models]
    if len(set(labels)) == len(labels):
        return labels, labels
    digests = [hashlib.sha256(json.dumps(v, sort_keys=True, default=str).encode()).hexdigest()[:4] for v in values]
    return ([f"{label}-{d}" for label, d in zip(labels, digests)],
            [f"{label}-{i}" for i, label in enumerate(labels)])


def expand(spec: SweepSpace, source: str = "space") -> tuple[TrialConfig, ...]:
    """Expand the search dimensions into trial configurations (grid, or a random sample)."""
    return expand_with_renames(spec, source)[0]


def expand_with_renames(spec: SweepSpace, source: str = "space") -> tuple[tuple[TrialConfig, ...], dict[str, str]]:
    """:func:`expand`, and :attr:`Space.renamed` for its trials."""
    search = dict(spec.search or {})
    for key in search:
        if key in migrate.MOVED_TO_SAMPLER:
            raise SpaceError(f"search.{key}: {migrate.moved_to_sampler(key)}")
        if not _is_dimension(key):
            raise SpaceError(
                f"search.{excerpt(str(key), 80)}: unknown dimension; allowed: {', '.join(CORE_DIMS)} or a train "
                f"field ({', '.join(sorted(TrainSpec.model_fields))})"
            )
    if "grad_acc" in search and "effective_batch" in search:
        raise SpaceError("search: give grad_acc or effective_batch, not both")

    dims: dict[str, list[Any]] = {}
    model_values = _as_list("model", search.pop("model", [None]))
    dims["model"] = _model_specs(spec, model_values, source)
    _refuse_repeats("model", model_values, dims["model"])
    dims["micro_batch"] = _positive_ints("micro_batch", _as_list("micro_batch", search.pop("micro_batch", [1])))
    levels = _as_list("checkpoint_level", search.pop("checkpoint_level", ["none"]))
    _check_levels(levels)
    dims["checkpoint_level"] = levels
    eff = search.pop("effective_batch", None)
    if eff is not None:
        dims["effective_batch"] = _positive_ints("effective_batch", _as_list("effective_batch", eff))
    else:
        dims["grad_acc"] = _positive_ints("grad_acc", _as_list("grad_acc", search.pop("grad_acc", [1])))
    betas = _as_list("beta", search.pop("beta", [0.1]))
    for b in betas:
        if isinstance(b, bool) or not isinstance(b, (int, float)) or b <= 0:
            raise SpaceError(f"search.beta: {shown(b)} is not allowed; give positive numbers, e.g. [0.1]")
    dims["beta"] = betas
    for key in ("micro_batch", "checkpoint_level", "grad_acc", "effective_batch", "beta"):
        if key in dims:
            _refuse_repeats(key, dims[key])
    for key, values in search.items():
        dims[f"train.{key}"] = _as_list(key, values)
        _refuse_repeats(key, dims[f"train.{key}"], [_as_train_value(key, v) for v in dims[f"train.{key}"]])

    names = list(dims)
    points = list(itertools.product(*(dims[n] for n in names)))
    sampler = spec.sampler
    if sampler.mode == "random" and sampler.num_samples is not None:
        rng = random.Random(sampler.seed)
        points = rng.sample(points, min(sampler.num_samples, len(points)))

    workers = spec.resources.workers_per_trial
    parts, legacy_parts = _model_id_parts(dims["model"], model_values)
    keys = [m.model_dump_json() for m in dims["model"]]
    model_parts, legacy_model_parts = dict(zip(keys, parts)), dict(zip(keys, legacy_parts))
    trials, renamed = [], {}
    trl = trl_export.SpaceCheck(source)
    for index, values in enumerate(points):
        p = dict(zip(names, values))
        if "effective_batch" in p:
            per_step = p["micro_batch"] * workers
            if p["effective_batch"] % per_step:
                raise SpaceError(
                    f"search.effective_batch: {p['effective_batch']} does not divide into "
                    f"micro_batch {p['micro_batch']} x workers {workers}; choose an effective_batch "
                    f"that is a multiple of {per_step}"
                )
            p["grad_acc"] = p["effective_batch"] // per_step
        train_over = {k.split(".", 1)[1]: v for k, v in p.items() if k.startswith("train.")}
        try:
            train = TrainSpec(**{**spec.train.model_dump(), **train_over})
        except ValidationError as err:
            raise SpaceError(_format_validation(source, err, prefix="search")) from None
        point = {"micro_batch": p["micro_batch"], "checkpoint_level": p["checkpoint_level"],
                 "grad_acc": p["grad_acc"], "beta": float(p["beta"])}
        refused = refused_attention(point["checkpoint_level"], p["model"].attn_implementation)
        if refused:
            raise SpaceError(f"{source}: search.checkpoint_level {point['checkpoint_level']!r}: {refused}")
        refused = refused_adaptive_clip(train, spec.resources)
        if refused:
            raise SpaceError(f"{source}: {refused}")
        refused = refused_cuda_lever(train, spec.resources)
        if refused:
            raise SpaceError(f"{source}: {refused}")
        refused = refused_optimizer_in_backward(train, point["grad_acc"], spec.resources)
        if refused:
            raise SpaceError(f"{source}: {refused}")
        swept_values = {k: getattr(train, k) for k in train_over}
        model_key = p["model"].model_dump_json()
        model_part = model_parts[model_key]
        trial_id = _trial_id(point, swept_values, model_part)
        for legacy in migrate.positional_trial_ids(index, trial_id, model_part, legacy_model_parts[model_key]):
            renamed[legacy] = trial_id
        trial = TrialConfig(space_name=spec.name, trial_id=trial_id, model=p["model"], data=spec.data, train=train,
                            resources=spec.resources, swept_train=tuple(train_over), **point)
        trl.check(trial)
        trials.append(trial)
    trl.raise_if_refused()
    return tuple(trials), renamed


def parse(raw: dict[str, Any], source: str = "space") -> Space:
    """Validate a raw mapping (as read from YAML) and expand it."""
    raw = dict(raw)
    search = raw.get("search") or {}
    if not isinstance(search, dict):
        raise SpaceError(f"{source}: search: must be a mapping of dimension -> list of values")
    if "checkpoint_level" in search:
        _check_levels(_as_list("checkpoint_level", search["checkpoint_level"]))
    try:
        spec = SweepSpace(**raw)
    except ValidationError as err:
        raise SpaceError(_format_validation(source, err)) from None
    except TypeError as err:  # e.g. a section given as a list instead of a mapping
        raise SpaceError(f"{source}: {excerpt(str(err))}") from None
    trials, renamed = expand_with_renames(spec, source)
    return Space(spec=spec, trials=trials, source=source, renamed=renamed, raw=raw)


def parse_section(cls: type[BaseModel], raw: dict[str, Any], key: str, source: str = "space") -> Any:
    """One section of a raw space mapping validated by its own model (None when absent or null):
    for readers that need only that section, e.g. the analysis of a results directory's copy."""
    value = raw.get(key)
    if value is None:
        return None
    try:
        return cls.model_validate(value)
    except ValidationError as err:
        raise SpaceError(_format_validation(source, err, prefix=key)) from None


load_raw = space_yaml.load_raw  # the file's mapping, read with limits


def load(path: str | Path, overrides: list[str] | None = None) -> Space:
    """Load, apply ``--set`` overrides, validate and expand a space file."""
    raw = load_raw(path)
    if overrides:
        raw = apply_overrides(raw, overrides)
    return parse(raw, source=str(path))
