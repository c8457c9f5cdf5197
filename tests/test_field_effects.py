"""Every configuration field declares what it can change (dpo_sweep/field_effects.py), and the
planner's keys follow the declarations: a field added without one fails here, not in a sweep that
shares a measurement it should not."""
from __future__ import annotations

import pytest
from pydantic import BaseModel, Field

from dpo_sweep.config import TrialConfig
from dpo_sweep.core.dimensions import Memory
from dpo_sweep.field_effects import affects, declared_effects
from dpo_sweep.plan import rules
from tests.testkit import make_cfg


def _leaves(tree: dict, prefix: tuple[str, ...] = ()):
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            yield from _leaves(value, (*prefix, key))
        else:
            yield (*prefix, key)


@pytest.mark.parametrize("data", [{"synthetic": {"pairs": 8}}, {"path": "pairs.jsonl", "columns": {"prompt": "q"}}])
def test_every_trial_config_field_declares_its_effect(data):
    effects = declared_effects(TrialConfig)
    cfg = make_cfg(data=data)
    for leaf in _leaves(cfg.model_dump(mode="json")):
        assert any(leaf[:len(path)] == path for path in effects), f"{'.'.join(leaf)} declares no effect"


def test_a_field_without_a_declaration_is_named():
    class Section(BaseModel):
        known: int = Field(0, json_schema_extra=affects(Memory.CHANGES, learning=False))
        forgotten: int = 0

    class Config(BaseModel):
        section: Section

    with pytest.raises(TypeError, match=r"Section\.forgotten declares no effect"):
        declared_effects(Config)


def test_the_declarations_are_in_the_json_schema():
    schema = TrialConfig.model_json_schema()
    assert schema["properties"]["beta"]["affects"] == {"memory": "none", "learning": True}
    assert schema["$defs"]["TrainSpec"]["properties"]["precision"]["affects"] == {"memory": "changes",
                                                                                   "learning": True}
    assert schema["$defs"]["TrainSpec"]["properties"]["dropout"]["affects"]["why"] == "dropout's masks are saved tensors"


def _changed(cfg, path: tuple[str, ...], value):
    if len(path) == 1:
        return cfg.model_copy(update={path[0]: value})
    section = getattr(cfg, path[0])
    return cfg.model_copy(update={path[0]: section.model_copy(update={path[1]: value})})


#: A second value for a field of each kind of declaration (any valid value other than the default).
_OTHER = {("beta",): 0.2, ("train", "lr"): 1e-4, ("train", "evaluate"): False, ("trial_id",): "other",
          ("train", "padding_side"): "left", ("train", "precision"): "bf16-mixed", ("resources", "cpus_per_worker"): 2.0,
          ("model", "lean_ops"): False, ("train", "lora_r"): 8, ("micro_batch",): 4, ("train", "max_length"): 512,
          ("checkpoint_level",): "full"}


@pytest.mark.parametrize("path", list(_OTHER), ids=lambda p: ".".join(p))
def test_the_keys_follow_the_declarations(path):
    base = make_cfg(data={"synthetic": {"pairs": 8, "lengths": "lognormal"}})
    other = _changed(base, path, _OTHER[path])
    effect = rules.EFFECTS[path]
    assert (rules.measurement_key(base) != rules.measurement_key(other)) == (effect.memory is not Memory.NONE)
    assert (rules.memory_family(base) != rules.memory_family(other)) == (effect.memory is Memory.CHANGES)
    learns = effect.learning or base.effective_batch() != other.effective_batch()  # micro_batch: through the batch
    assert (rules.learning_key(base) != rules.learning_key(other)) == learns


def test_grad_acc_enters_the_measurement_as_its_class():
    one, two, eight = (make_cfg(grad_acc=g) for g in (1, 2, 8))
    assert rules.measurement_key(two) == rules.measurement_key(eight) != rules.measurement_key(one)
    assert rules.memory_family(one) == rules.memory_family(eight)


def test_the_fields_memory_grows_with_are_the_ones_an_oom_compares():
    grows = {path for path, e in rules.EFFECTS.items() if e.memory is Memory.GROWS}
    assert grows == {("micro_batch",), ("checkpoint_level",), ("train", "max_length")}, (
        "rules.dominates_in_memory compares each field declared Memory.GROWS: add the new one there")
