"""A rule over a configuration remembered by content: by the configuration's section objects
(ModelSpec, DataSpec, TrainSpec, ResourcesSpec), by identity, and by the values of its own fields
the rule reads. A space's configurations share their few frozen section objects (space_expand
builds one per distinct set of overrides) and differ in the knobs, so a rule that reads no beta
(a measurement's key, a predicted peak) is computed once per distinct set-up of a
100,000-configuration space, not once per configuration. What a rule may read is what the fields
declare (dpo_sweep/field_effects.py): ``memory_read`` the fields that can change memory or time,
``learning_read`` the learning ones and the effective batch. Pure."""
from __future__ import annotations

import functools
from typing import Any, Callable

from pydantic import BaseModel

from dpo_sweep.config import TrialConfig
from dpo_sweep.core.dimensions import Memory
from dpo_sweep.field_effects import declared_effects

#: The configuration's sections: shared objects, compared by identity.
SECTIONS = tuple(name for name, info in TrialConfig.model_fields.items()
                 if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel))
_EFFECTS = declared_effects(TrialConfig)
#: The configuration's own fields (not its sections) that can change memory or time, and learning.
MEMORY_FIELDS = tuple(p[0] for p, e in _EFFECTS.items()
                      if len(p) == 1 and p[0] not in SECTIONS and e.memory is not Memory.NONE)
LEARNING_FIELDS = tuple(p[0] for p, e in _EFFECTS.items() if len(p) == 1 and p[0] not in SECTIONS and e.learning)
#: Entries a memo holds before it starts over.
MEMO_ENTRIES = 65_536


def memory_read(cfg: TrialConfig) -> tuple:
    return tuple(getattr(cfg, name) for name in MEMORY_FIELDS)


def learning_read(cfg: TrialConfig) -> tuple:
    return (*(getattr(cfg, name) for name in LEARNING_FIELDS), cfg.effective_batch())


def by_content(read: Callable[[TrialConfig], tuple]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``rule(cfg, *objects)`` remembered by ``cfg``'s sections and ``objects``, by identity, and
    ``read(cfg)``, by value. An entry holds the objects it was keyed by, so no id is reused while
    it stands; at :data:`MEMO_ENTRIES` entries the memo starts over. ``rule.uncached``: the rule itself."""
    def wrap(rule: Callable[..., Any]) -> Callable[..., Any]:
        memo: dict[tuple, tuple[tuple[Any, ...], Any]] = {}

        @functools.wraps(rule)
        def remembered(cfg: TrialConfig, *objects: Any) -> Any:
            held = (*(getattr(cfg, name) for name in SECTIONS), *objects)
            key = (*map(id, held), *read(cfg))
            hit = memo.get(key)
            if hit is None:
                if len(memo) >= MEMO_ENTRIES:
                    memo.clear()
                hit = memo[key] = (held, rule(cfg, *objects))
            return hit[1]

        remembered.uncached = rule  # type: ignore[attr-defined]
        return remembered
    return wrap
