"""What a configuration field can change, declared on the field itself.

Every field of :class:`~dpo_sweep.config.TrialConfig` and its sections says, with
``json_schema_extra=affects(...)``, whether it can change a trial's peak memory or step time and
whether it sets what the loss trajectory is. The planner's rules (:mod:`dpo_sweep.plan.rules`)
read these declarations: configurations equal in every memory field share one memory/time
measurement (``measurement_key``), configurations equal in every learning field and in effective
batch share one learning trial (``learning_key``). A field holding a section declares nothing
itself when each of its section's fields does; tests/test_field_effects.py checks that every
field is covered, so a field added later cannot be forgotten.

Conservative where unsure: a field that might change memory says so (it splits measurements,
which costs trials, never a wrong row).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from dpo_sweep.core.dimensions import Memory


def affects(memory: Memory, learning: bool, why: str = "") -> dict[str, Any]:
    """A field's declaration (``Field(..., json_schema_extra=affects(...))``): ``memory``, and
    ``learning``: it sets what the loss trajectory is, besides the effective batch; ``why``, where
    the answer is not plain from the field's doc. Plain JSON, so the JSON schema shows it too."""
    declared: dict[str, Any] = {"memory": memory.value, "learning": learning}
    if why:
        declared["why"] = why
    return {"affects": declared}


@dataclass(frozen=True)
class Effect:
    """One field's declaration, read back."""

    memory: Memory
    learning: bool


def declared_effects(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Effect]:
    """Every field of ``model`` by its path into ``model_dump()``, with its declaration: a field
    that declares one stands for all of its value (a whole section, e.g. ``data``); one that does
    not is read through its section's own fields. TypeError names a field that declares nothing
    and holds no section."""
    out: dict[tuple[str, ...], Effect] = {}
    for name, info in model.model_fields.items():
        path = (*prefix, name)
        extra = info.json_schema_extra
        if isinstance(extra, dict) and "affects" in extra:
            declared = extra["affects"]
            out[path] = Effect(Memory(declared["memory"]), bool(declared["learning"]))
        elif isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
            out.update(declared_effects(info.annotation, path))
        else:
            raise TypeError(f"{model.__name__}.{name} declares no effect: add json_schema_extra=affects(...) "
                            "(dpo_sweep/field_effects.py)")
    return out
