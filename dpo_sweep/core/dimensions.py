"""The search dimensions: one entry per knob a space file can sweep under ``search:``.

Each :class:`Dimension` says, in one place, what every layer needs of it: the key a space file and
``--set`` name it by, where its value lives in a trial's configuration (``path`` into
``TrialConfig.model_dump()``), its results.csv column and the label the tables and plots give it,
how its listed values are checked, its part of a trial id, how peak memory moves along it (what
the planner's dominance pruning and same-maths grouping read), its role in the report, and the
values of it that make values of another dimension impossible (a point holding both is skipped,
with the reason). The fixed knobs are :data:`DIMENSIONS`; any ``train`` field is a dimension too,
its entry made by :func:`train_dimension` from the field's own declaration. Standard library only:
the space file's parser, the planner, the trainer's records and the analysis all read this table
(docs/extending.md: adding a dimension).
"""
from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from dpo_sweep.core.levels import REFUSED_LEVELS, Level


class Memory(enum.StrEnum):
    """What a field can do to a trial's peak memory and step time (declared on every config field:
    dpo_sweep/field_effects.py)."""

    NONE = "none"        # nothing: configurations that differ only in it share a measurement
    CHANGES = "changes"  # it can: configurations that differ in it are measured apart
    GROWS = "grows"      # it can, and memory only grows with it: an OOM prunes what is larger in it
    ACCUMULATES = "accumulates"  # grad_acc: only 1 against >= 2 changes the peak (rules.short_grad_acc)


class Role(enum.StrEnum):
    """Where the report shows a dimension."""

    KNOB = "knob"          # a column of frontier.md's contract table, always shown
    SETTING = "setting"    # shown (tables, panels, recommendation) where the trials differ in it
    DERIVED = "derived"    # follows from others (effective_batch: micro_batch x grad_acc x workers)


@dataclass(frozen=True)
class Exclusion:
    """Values of one dimension that make values of another impossible: a point with ``value`` here
    and one of ``values`` in ``other`` cannot run, for ``reason``, and is skipped."""

    value: Any
    other: str
    values: tuple[Any, ...]
    reason: str


def _positive_ints(key: str, values: list[Any]) -> str | None:
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            return f"search.{key}: {_shown(v)} is not allowed; give positive integers"
    return None


def _positive_numbers(key: str, values: list[Any]) -> str | None:
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
            return f"search.{key}: {_shown(v)} is not allowed; give positive numbers, e.g. [0.1]"
    return None


def _levels(key: str, values: list[Any]) -> str | None:
    allowed = [lv.value for lv in Level]
    for lv in values:
        if lv in REFUSED_LEVELS:
            return f"search.{key}: {_shown(lv)}: {REFUSED_LEVELS[lv]}"
        if lv not in allowed:
            return f"search.{key}: {_shown(lv)} is not a checkpoint level; allowed: {', '.join(allowed)}"
    return None


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def named_part(name: str, value: Any) -> str:
    """``seed-1``, ``lr-0.0001``, ``loss-ipo``: a dimension's part of a trial id by its name (path-safe)."""
    text = f"{value:g}" if isinstance(value, float) else str(value)
    return f"{name}-{re.sub(r'[^A-Za-z0-9.+]+', '-', text).strip('-')}"


def _identity(value: Any) -> float:
    return float(value)


@dataclass(frozen=True)
class Dimension:
    """One search dimension (see the module doc)."""

    key: str
    path: tuple[str, ...]
    """Where the value lives in ``TrialConfig.model_dump()``; () for one that sets another
    (effective_batch sets grad_acc)."""
    column: str
    label: str
    role: Role
    memory: Memory
    id_part: Callable[[Any], str]
    """Its part of a trial id (after the hash): ``mb2``, ``L1``, ``lr-0.0001``."""
    in_every_id: bool = False
    """The four knobs are in every trial's id; the other dimensions only where the space sweeps them."""
    check: Callable[[str, list[Any]], str | None] | None = None
    """The listed values' problem, one line (None: fine); None: the config field's type checks them."""
    memory_order: Callable[[Any], float] = _identity
    """For ``Memory.GROWS``: larger is at least as much memory (the dominance pruning's order)."""
    excludes: tuple[Exclusion, ...] = ()
    doc: str = ""

    def exclusion(self, value: Any, others: dict[str, Any]) -> str | None:
        """Why ``value`` of this dimension cannot run with ``others`` (key -> value); None when it can."""
        for ex in self.excludes:
            if value == ex.value and others.get(ex.other) in ex.values:
                return f"{self.key} {value} with {ex.other} {others[ex.other]}: {ex.reason}"
        return None


#: Columns of a swept train field in results.csv where it is not the field's own name: a contract
#: column already holds the setting (loss_type, seq_len, precision, reference), or a column with
#: another meaning has the name (steps: the steps that ran; device: the torch device used).
TRAIN_COLUMNS: dict[str, str] = {
    "loss": "loss_type", "max_length": "seq_len", "precision": "precision", "reference": "reference",
    "adapter": "adapter", "optimizer": "optimizer", "trainer": "trainer",
    "steps": "train_steps", "device": "train_device",
}
#: Swept train fields whose value the result row carries in a fixed column of its own.
CARRIED_TRAIN_FIELDS = ("loss", "max_length", "precision", "reference", "adapter", "optimizer", "trainer")

#: Levels that TRL's DPOTrainer cannot run: its gradient_checkpointing wraps whole decoder layers.
_TRL_LEVELS = tuple(lv.value for lv in Level if lv.trl_level is not lv)
_TRL_EXCLUDES = (Exclusion("trl", "checkpoint_level", _TRL_LEVELS,
                           "TRL's DPOTrainer checkpoints whole decoder layers or none "
                           "(gradient_checkpointing), not selected sub-blocks; use checkpoint_level none or "
                           "full with trainer trl"),)
#: Train fields whose entry says more than the generic one.
_TRAIN_REFINED: dict[str, dict[str, Any]] = {
    "max_length": {"label": "seq_len"},
    "trainer": {"excludes": _TRL_EXCLUDES},
}


def train_dimension(name: str, memory: Memory) -> Dimension:
    """The entry of the train field ``name`` (``memory``: the field's declared effect)."""
    column = TRAIN_COLUMNS.get(name, name)
    refined = _TRAIN_REFINED.get(name, {})
    return Dimension(key=name, path=("train", name), column=column, label=refined.get("label", column),
                     role=Role.SETTING, memory=memory, id_part=lambda v, n=name: named_part(n, v),
                     excludes=refined.get("excludes", ()), doc=f"train.{name} (docs/space-file.md)")


DIMENSIONS: tuple[Dimension, ...] = (
    Dimension("model", ("model",), "model", "model", Role.SETTING, Memory.CHANGES,
              id_part=str, doc="A list of model specs or preset names; its id part is the model's label."),
    Dimension("micro_batch", ("micro_batch",), "micro_batch", "micro_batch", Role.KNOB, Memory.GROWS,
              id_part=lambda v: f"mb{v}", in_every_id=True, check=_positive_ints,
              doc="Pairs per forward/backward on one worker."),
    Dimension("checkpoint_level", ("checkpoint_level",), "checkpoint_level", "checkpoint", Role.KNOB,
              Memory.GROWS, id_part=str, in_every_id=True, check=_levels,
              memory_order=lambda v: -Level(v).memory_rank, doc="none | L1 | L2 | L3 | full."),
    Dimension("grad_acc", ("grad_acc",), "grad_acc", "grad_acc", Role.KNOB, Memory.ACCUMULATES,
              id_part=lambda v: f"ga{v}", in_every_id=True, check=_positive_ints,
              doc="Micro-batches accumulated per optimizer step."),
    Dimension("effective_batch", (), "effective_batch", "effective batch", Role.DERIVED, Memory.ACCUMULATES,
              id_part=lambda v: "", check=_positive_ints,
              doc="Pairs per optimizer step over all workers; sets grad_acc (its part of the id)."),
    Dimension("beta", ("beta",), "beta", "beta", Role.KNOB, Memory.NONE,
              id_part=lambda v: f"b{float(v):g}", in_every_id=True, check=_positive_numbers,
              doc="DPO beta."),
    Dimension("workers_per_trial", ("resources", "workers_per_trial"), "workers_per_trial", "GPUs per trial",
              Role.SETTING, Memory.CHANGES, id_part=lambda v: f"w{v}", check=_positive_ints,
              doc="Ray Train workers (one GPU each) per trial: resources.workers_per_trial."),
    Dimension("parallelism", ("resources", "parallelism"), "parallelism", "parallelism", Role.SETTING,
              Memory.CHANGES, id_part=str,
              doc="How a trial's workers share it: resources.parallelism (ddp | fsdp | fsdp_grad_op)."),
)
BY_KEY: dict[str, Dimension] = {d.key: d for d in DIMENSIONS}
#: The fixed dimensions by their config path (effective_batch, which sets grad_acc, has none).
BY_PATH: dict[tuple[str, ...], Dimension] = {d.path: d for d in DIMENSIONS if d.path}
#: The frontier table's four knobs, in its column order.
KNOBS: tuple[Dimension, ...] = tuple(d for d in DIMENSIONS if d.role is Role.KNOB)
#: Keys of the dimensions that live in the resources section.
RESOURCE_KEYS: tuple[str, ...] = tuple(d.key for d in DIMENSIONS if d.path[:1] == ("resources",))


@dataclass(frozen=True)
class SkippedPoint:
    """A point of the grid that cannot run: its values (key -> value) and why."""

    values: dict[str, Any] = field(hash=False)
    reason: str

    def line(self) -> str:
        shown = ", ".join(f"{k} {v}" for k, v in self.values.items())
        return f"  skipped {shown}: {self.reason}"


def value_at(tree: dict[str, Any], path: tuple[str, ...]) -> Any:
    """The value at ``path`` in a configuration's ``model_dump()``."""
    for key in path:
        tree = tree[key]
    return tree


#: The frontier table's knob columns, in its order (micro_batch, checkpoint_level, grad_acc, beta).
KNOB_COLUMNS: tuple[str, ...] = tuple(d.column for d in KNOBS)
#: The resource dimensions' columns (workers_per_trial, parallelism).
RESOURCE_COLUMNS: tuple[str, ...] = tuple(BY_KEY[k].column for k in RESOURCE_KEYS)
#: The memory levers: train fields in fixed columns that the tables show beside the model.
LEVER_COLUMNS: tuple[str, ...] = ("adapter", "optimizer")
#: The fixed results.csv columns that say which configuration a row is (the swept train fields'
#: own columns come on top): the model, seq_len (max_length's column), the knobs, the resources.
CONFIG_COLUMNS: tuple[str, ...] = ("model", TRAIN_COLUMNS["max_length"], *KNOB_COLUMNS, *RESOURCE_COLUMNS)


def label_of(column: str) -> str:
    """The tables' and plots' label of a results column (the column itself where no entry names it)."""
    return next((d.label for d in DIMENSIONS if d.column == column), column)
