"""The keys the plan groups configurations by, as values: hashable, compared by content, each of
its own type (a measurement key never equals a learning key).

- :class:`MeasurementKey`: the fields that can change a trial's peak memory or step time
  (``rules.measurement_key``); configurations with one key share a measurement.
- :class:`MemoryFamily`: the same less the knobs along which memory grows (``rules.memory_family``):
  what the memory model's calibration and the OOM pruning compare within.
- :class:`LearningKey`: the fields that set the loss trajectory, and the effective batch
  (``rules.learning_key``); configurations with one key share a learning trial.
- :class:`TimingKey`: what one timing in full serves: a measurement's rows at one grad_acc.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii
from typing import Any, Mapping


def canonical_json(value: Any) -> str:
    """``json.dumps(value, sort_keys=True, default=str)``, with the scalars written directly (the
    plan builds tens of keys per configuration; a space may have 100,000 configurations)."""
    kind = type(value)
    if kind is str:
        return encode_basestring_ascii(value)
    if kind is int:
        return int.__repr__(value)
    if kind is bool:
        return "true" if value else "false"
    if kind is float and math.isfinite(value):
        return float.__repr__(value)
    if value is None:
        return "null"
    return json.dumps(value, sort_keys=True, default=str)


@dataclass(frozen=True)
class Settings:
    """Some fields of one configuration: ``(path, value)`` pairs in path order, the value as
    canonical JSON (so that lists and sections compare by content)."""

    values: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, picked: Mapping[tuple[str, ...], Any]):
        """The settings of ``picked``: field paths into ``model_dump(mode="json")`` and their values."""
        return cls(tuple(sorted(("/".join(path), canonical_json(value)) for path, value in picked.items())))


class MeasurementKey(Settings):
    """Equal for configurations that must have the same peak memory and micro-step time."""


class MemoryFamily(Settings):
    """Equal for configurations that differ at most in micro_batch, checkpoint level, max_length
    and grad_acc."""


class LearningKey(Settings):
    """Equal for configurations whose loss trajectory is the same."""


@dataclass(frozen=True)
class TimingKey:
    """One timing in full: the rows of the measurement taken by ``measured_by`` (the group's
    measuring configuration) at ``grad_acc``, which a runoff or a learning trial times once for all
    of them (betas that share the measurement share the timing too)."""

    measured_by: str
    grad_acc: int
