"""A validated space's ``search:`` expanded into trials, every dimension read from the one table
(:mod:`dpo_sweep.core.dimensions`): each listed value checked, the grid crossed (``paired:``
cases crossed with the rest, their own values together), and each point resolved into a
:class:`~dpo_sweep.config.TrialConfig` with its id. A point that one value makes impossible (an
exclusion of the table, a refused combination of dpo_sweep/refusals.py or core/trial_facts.py,
a settings check of TrainSpec, a grad_acc that effective_batch does not divide into, what TRL
cannot run) is skipped with its reason; a space whose every point is impossible is refused.
"""
from __future__ import annotations

import functools
import hashlib
import itertools
import json
import math
import random
import re
from typing import Any, Callable

from pydantic import BaseModel, TypeAdapter, ValidationError

from dpo_sweep import migrate, trl_export
from dpo_sweep.config import SCHEDULER_KEY, ModelSpec, ResourcesSpec, TrainSpec, TrialConfig
from dpo_sweep.core.dimensions import BY_KEY, DIMENSIONS, RESOURCE_KEYS, Dimension, SkippedPoint, train_dimension
from dpo_sweep.core.trial_facts import refused_attention, refused_cuda_lever
from dpo_sweep.errors import SpaceError
from dpo_sweep.refusals import refused_adaptive_clip, refused_held_out, refused_optimizer_in_backward
from dpo_sweep.text import excerpt, shown

#: A validated space (dpo_sweep.space.SweepSpace, which imports this module: named, not imported).
SweepSpace = Any

#: The ``search:`` key whose list of mappings ties values together (docs/space-file.md#paired-values).
PAIRED = "paired"
#: Hex digits of the content hash that heads a trial id (the tables' short id: ``t3f2a``).
ID_HASH_CHARS = 4


@functools.cache
def dimension(key: str) -> Dimension | None:
    """The table's entry for ``key``: a fixed dimension or a train field (None: not a dimension)."""
    if key in BY_KEY:
        return BY_KEY[key]
    if key in TrainSpec.model_fields:
        declared = TrainSpec.model_fields[key].json_schema_extra["affects"]["memory"]  # field_effects.affects
        return train_dimension(key, declared)
    return None


def dimension_names() -> str:
    """The fixed dimensions' keys, for messages."""
    return ", ".join(d.key for d in DIMENSIONS)


def where(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc if not str(p).startswith("function-")) or "(top level)"


def format_validation(source: str, err: ValidationError, prefix: str = "") -> str:
    lines = [f"{source}: invalid search space"]
    for e in err.errors():
        loc = tuple(x for x in e["loc"] if not (isinstance(x, str) and x in ("literal_error",)))
        key = where(loc)
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


def as_list(key: str, value: Any) -> list[Any]:
    if isinstance(value, list):
        if not value:
            raise SpaceError(f"search.{key}: empty list; give at least one value")
        return value
    return [value]


def refuse_repeats(key: str, values: list[Any], same_as: list[Any] | None = None) -> None:
    """``same_as[i]`` is ``values[i]`` as the trial sees it (``"1e-4"`` and ``0.0001`` are one lr)."""
    same_as = values if same_as is None else same_as
    for i, value in enumerate(same_as):
        if value in same_as[:i]:
            first = values[same_as.index(value)]
            said = shown(values[i]) if first == values[i] else f"{shown(values[i])} (the same as {shown(first)})"
            raise SpaceError(f"search.{key}: {said} is listed twice; every value runs its own trials, "
                             "so a repeat would run the same trials again: list each value once")


def _as_field_value(section: type[BaseModel], key: str, value: Any) -> Any:
    """A swept value as its section stores it; an invalid one is left for the section to report."""
    try:
        return TypeAdapter(section.model_fields[key].annotation).validate_python(value)
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
            raise SpaceError(format_validation(source, err, prefix="search.model")) from None
    return models


def trial_id(parts: list[str]) -> str:
    """``t3f2a_mb2_none_ga1_b0.1_lr-0.0001``: a short hash of the knob part, then the knob part
    itself (each dimension's id part in the table's order: the model's when the model is swept,
    the four knobs always, the other swept dimensions after them). Both come from the
    configuration's values alone, never from where they stand in the space file's lists:
    reordering or inserting a value leaves every other trial's id as it was, which is what
    ``--resume`` matches rows by."""
    knobs = "_".join(p for p in parts if p)
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


def _cases(search: dict[str, Any]) -> list[dict[str, Any]]:
    """The sub-grids of ``search``: one per ``paired:`` case (its values with the rest), or the whole."""
    cases = search.pop(PAIRED, None)
    if cases is None:
        return [search]
    if not isinstance(cases, list) or not cases or not all(isinstance(c, dict) and c for c in cases):
        raise SpaceError(f"search.{PAIRED}: give a list of mappings, each the values that go together, e.g. "
                         f"{PAIRED}: [{{adapter: full}}, {{adapter: lora, lora_r: [8, 16]}}]")
    out = []
    for i, case in enumerate(cases):
        both = sorted(set(case) & set(search))
        if both:
            raise SpaceError(f"search.{PAIRED}[{i}].{both[0]}: also listed outside {PAIRED}; list each dimension "
                             f"in one place (in every case of {PAIRED}, or outside it)")
        out.append({**search, **case})
    return out


def _check_keys(search: dict[str, Any]) -> None:
    for key in search:
        if key in migrate.MOVED_TO_SAMPLER:
            raise SpaceError(f"search.{key}: {migrate.moved_to_sampler(key)}")
        if dimension(key) is None:
            raise SpaceError(
                f"search.{excerpt(str(key), 80)}: unknown dimension; allowed: {dimension_names()}, {PAIRED} or a "
                f"train field ({', '.join(sorted(TrainSpec.model_fields))})"
            )
    if "grad_acc" in search and "effective_batch" in search:
        raise SpaceError("search: give grad_acc or effective_batch, not both")


#: The fixed dimensions' values where a space does not list them.
_DEFAULTS = {"micro_batch": [1], "checkpoint_level": ["none"], "beta": [0.1]}


def _grid(spec: SweepSpace, search: dict[str, Any], source: str) -> tuple[list[str], list[list[Any]], list[Any]]:
    """One sub-grid's dimensions (keys in id order, ``train.`` before a train field's) and their
    checked values; the model entries."""
    _check_keys(search)
    search = dict(search)
    model_values = as_list("model", search.pop("model", [None]))
    dims: dict[str, list[Any]] = {"model": _model_specs(spec, model_values, source)}
    refuse_repeats("model", model_values, dims["model"])
    if "effective_batch" not in search:
        search.setdefault("grad_acc", [1])
    for d in DIMENSIONS[1:]:
        if d.key not in search and d.key not in _DEFAULTS:
            continue
        values = as_list(d.key, search.pop(d.key, _DEFAULTS.get(d.key)))
        problem = d.check(d.key, values) if d.check else None
        if problem:
            raise SpaceError(problem)
        same = [_as_field_value(ResourcesSpec, d.key, v) for v in values] if d.key in RESOURCE_KEYS else None
        refuse_repeats(d.key, values, same)
        dims[d.key] = values
    for key, values in search.items():
        dims[f"train.{key}"] = as_list(key, values)
        refuse_repeats(key, dims[f"train.{key}"], [_as_field_value(TrainSpec, key, v) for v in dims[f"train.{key}"]])
    return list(dims), [dims[n] for n in dims], model_values


class _Point:
    """One point resolved: its trial, or why it cannot run (``refusal``; ``alone``: the message a
    space of this point alone is refused with, when it is not ``source: refusal``)."""

    def __init__(self, values: dict[str, Any], trial: TrialConfig | None = None, refusal: str = "",
                 alone: str = "") -> None:
        self.values, self.trial, self.refusal, self.alone = values, trial, refusal, alone
        self.by_trl = False


class _Resolver:
    """Resolves the points of one space: the train and resources sections a point's overrides
    give are built once per distinct set of overrides (most points differ only in the four knobs,
    which no section holds) and shared, frozen, by the trials; so are their dumps."""

    def __init__(self, spec: SweepSpace, source: str) -> None:
        self.spec, self.source = spec, source
        self._train_base, self._res_base = spec.train.model_dump(), spec.resources.model_dump()
        self._sections: dict[tuple[str, Any], tuple[BaseModel | None, ValidationError | None, dict[str, Any]]] = {}

    def _section(self, cls: type[BaseModel], base: dict[str, Any], over: dict[str, Any]
                 ) -> tuple[BaseModel | None, ValidationError | None, dict[str, Any]]:
        """``cls`` from ``base`` with ``over`` (its error when it fails) and its dump, built once per ``over``."""
        try:
            key = (cls.__name__, tuple((k, type(v), v) for k, v in sorted(over.items())))  # True is not 1 here
            hash(key)
        except TypeError:  # a list or mapping value
            key = (cls.__name__, json.dumps(over, sort_keys=True, default=repr))
        if key not in self._sections:
            try:
                built = cls(**{**base, **over})
                self._sections[key] = (built, None, built.model_dump())
            except ValidationError as err:
                self._sections[key] = (None, err, {})
        return self._sections[key]

    def resolve(self, p: dict[str, Any], model_part: str, listed: set[str]) -> _Point:
        """Point ``p`` (dimension -> value; ``listed``: the dimensions its space lists) as a trial, or why not."""
        spec, source = self.spec, self.source
        train_over = {k.split(".", 1)[1]: v for k, v in p.items() if k.startswith("train.")}
        res_over = {k: p[k] for k in RESOURCE_KEYS if k in p}
        shown_values = {k.removeprefix("train."): (v.label() if k == "model" else v) for k, v in p.items()
                        if k.removeprefix("train.") in listed}
        resources, err, res_dump = self._section(ResourcesSpec, self._res_base, res_over)
        if err is not None:
            raise SpaceError(format_validation(source, err, prefix="search")) from None
        if "effective_batch" in p:
            per_step = p["micro_batch"] * resources.workers_per_trial
            if p["effective_batch"] % per_step:
                return _Point(shown_values, refusal=(
                    f"search.effective_batch: {p['effective_batch']} does not divide into micro_batch "
                    f"{p['micro_batch']} x workers {resources.workers_per_trial}; choose an effective_batch that is "
                    f"a multiple of {per_step}"))
            p = {**p, "grad_acc": p["effective_batch"] // per_step}
        train, err, train_dump = self._section(TrainSpec, self._train_base, train_over)
        if err is not None:
            message = format_validation(source, err, prefix="search").split("\n", 1)[1].strip()
            if any(e["loc"] for e in err.errors()):  # a value wrong on its own, not a combination
                raise SpaceError(format_validation(source, err, prefix="search")) from None
            return _Point(shown_values, refusal=message.removeprefix("search: "),
                          alone=format_validation(source, err, prefix="search"))
        point = {"micro_batch": p["micro_batch"], "checkpoint_level": p["checkpoint_level"],
                 "grad_acc": p["grad_acc"], "beta": float(p["beta"])}
        level = point["checkpoint_level"]
        refused = refused_attention(level, p["model"].attn_implementation)
        if refused:
            return _Point(shown_values, refusal=f"search.checkpoint_level {level!r}: {refused}")
        refused = (refused_adaptive_clip(train, resources) or refused_cuda_lever(train, resources)
                   or refused_optimizer_in_backward(train, point["grad_acc"], resources))
        if refused:
            return _Point(shown_values, refusal=refused)
        settings = {**point, **train_dump, **res_dump}
        for key, d in _EXCLUDING:
            refused = d.exclusion(settings[key], settings) if key in settings else None
            if refused:
                return _Point(shown_values, refusal=refused)
        swept = {k: getattr(train, k) for k in train_over}
        parts = [model_part, *(BY_KEY[k].id_part(point[k]) for k in ("micro_batch", "checkpoint_level", "grad_acc",
                                                                      "beta")),
                 *(BY_KEY[k].id_part(getattr(resources, k)) for k in res_over),
                 *(dimension(k).id_part(v) for k, v in swept.items())]
        trial = TrialConfig(space_name=spec.name, trial_id=trial_id(parts), model=p["model"], data=spec.data,
                            train=train, resources=resources, swept_train=tuple(train_over), **point)
        return _Point(shown_values, trial=trial)


def _excluding() -> tuple[tuple[str, Dimension], ...]:
    """The settings (a point's knobs, train and resources fields) whose dimension excludes some
    combination, in the settings' order: the only ones a point's exclusion check reads."""
    keys = [*("micro_batch", "checkpoint_level", "grad_acc", "beta"), *TrainSpec.model_fields,
            *ResourcesSpec.model_fields]
    return tuple((k, d) for k in dict.fromkeys(keys) if (d := dimension(k)) is not None and d.excludes)


_EXCLUDING = _excluding()


#: Points resolved between two calls of an expansion's ``progress``.
PROGRESS_EVERY = 5_000


def expand_with_renames(spec: SweepSpace, source: str = "space", progress: Callable[[int, int], None] | None = None,
                        ) -> tuple[tuple[TrialConfig, ...], dict[str, str], tuple[SkippedPoint, ...]]:
    """The trials of ``spec`` (grid, or a random sample of the points that can run), the ids
    earlier versions gave them (:attr:`Space.renamed`) and the points skipped, with their reasons.
    ``progress(done, total)``: called every :data:`PROGRESS_EVERY` points of the grid resolved."""
    points: list[_Point] = []
    model_parts: dict[str, str] = {}
    legacy_model_parts: dict[str, str] = {}
    if refused := refused_held_out(spec.data, spec.objectives, spec.search):
        raise SpaceError(f"{source}: {refused}")
    search = {k: v for k, v in (spec.search or {}).items() if k != SCHEDULER_KEY}  # not a dimension: scheduler_of
    resolver = _Resolver(spec, source)
    grids = [(case, _grid(spec, case, source)) for case in _cases(search)]
    total, done = sum(math.prod(map(len, values)) for _, (_, values, _) in grids), 0
    for case, (names, values, model_values) in grids:
        models = values[0]
        parts, legacy = _model_id_parts(models, model_values)
        keys = [m.model_dump_json() for m in models]
        model_parts.update(zip(keys, parts))
        legacy_model_parts.update(zip(keys, legacy))
        part_of = {id(m): model_parts[k] for m, k in zip(models, keys)}
        listed = set(case)
        for combo in itertools.product(*values):
            p = dict(zip(names, combo))
            points.append(resolver.resolve(p, part_of[id(p["model"])], listed))
            done += 1
            if progress is not None and done % PROGRESS_EVERY == 0:
                progress(done, total)
    trl = trl_export.SpaceCheck(source)
    for pt in points:
        reasons = trl.check(pt.trial) if pt.trial is not None else []
        if reasons:
            pt.trial, pt.refusal, pt.by_trl = None, "; ".join(reasons), True
    runnable = [pt for pt in points if pt.trial is not None]
    if not runnable:
        if all(pt.by_trl for pt in points):
            trl.raise_if_refused()
        reasons = list(dict.fromkeys(pt.refusal for pt in points))
        if len(reasons) == 1:
            raise SpaceError(points[0].alone or f"{source}: {reasons[0]}")
        raise SpaceError(f"{source}: no point of the search can run:\n" + "\n".join(f"  {r}" for r in reasons))
    _refuse_repeated_points(runnable)
    sampler = spec.sampler
    if sampler.mode == "random" and sampler.num_samples is not None:
        rng = random.Random(sampler.seed)
        runnable = rng.sample(runnable, min(sampler.num_samples, len(runnable)))
    renamed = {}
    key_of: dict[int, str] = {}  # by model object: the trials share their grid's few ModelSpecs
    for index, pt in enumerate(runnable):
        model = pt.trial.model
        if (model_key := key_of.get(id(model))) is None:
            model_key = key_of[id(model)] = model.model_dump_json()
        for old in migrate.positional_trial_ids(index, pt.trial.trial_id, model_parts[model_key],
                                                legacy_model_parts[model_key]):
            renamed[old] = pt.trial.trial_id
    skipped = tuple(SkippedPoint(pt.values, pt.refusal) for pt in points if pt.trial is None)
    return tuple(pt.trial for pt in runnable), renamed, skipped


def _refuse_repeated_points(points: list[_Point]) -> None:
    seen: set[str] = set()
    for pt in points:
        if pt.trial.trial_id in seen:
            raise SpaceError(f"search.{PAIRED}: the point {pt.trial.trial_id} is listed by two cases; every "
                             "point runs once: list it in one case")
        seen.add(pt.trial.trial_id)
