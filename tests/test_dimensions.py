"""The one table of search dimensions (dpo_sweep/core/dimensions.py): every dimension has a
results column, an id part and a label, its memory behaviour is its field's own declaration, and
the GPUs-per-trial and parallelism dimensions sweep their resources fields per trial; points that
one value makes impossible are skipped with their reason, and ``paired:`` ties values together."""
from __future__ import annotations

import copy

import pytest

from dpo_sweep import space as space_mod
from dpo_sweep.config import TrainSpec, TrialConfig
from dpo_sweep.core.dimensions import DIMENSIONS, Role
from dpo_sweep.errors import SpaceError
from dpo_sweep.field_effects import declared_effects
from dpo_sweep.records import RESULTS_COLUMNS
from dpo_sweep.space_expand import dimension

QUICKSTART = "search_spaces/quickstart.yaml"  # 2 micro_batch x 3 levels x 2 grad_acc x 1 beta = 12


def raw(**search) -> dict:
    out = copy.deepcopy(space_mod.load_raw(QUICKSTART))
    out["resources"] = {**out.get("resources", {}), "use_gpu": False}
    out["search"] = search
    return out


def every_dimension():
    return [*DIMENSIONS, *(dimension(name) for name in TrainSpec.model_fields)]


def test_every_dimension_has_a_column_an_id_part_and_a_label():
    effects = declared_effects(TrialConfig)
    for d in every_dimension():
        assert d.label and d.column, d.key
        assert d.role is Role.DERIVED or d.column in RESULTS_COLUMNS or d.path[0] == "train", d.key
        if d.role is not Role.DERIVED:
            assert d.id_part({"model": "tiny-llama"}.get(d.key, 2)), d.key
            if d.path in effects:  # (the model is a section: each of its fields declares its own)
                assert d.memory == effects[d.path].memory, f"{d.key}: the table and the field's affects() disagree"


def test_existing_ids_do_not_change_and_resources_sweep_per_trial():
    ids = {t.trial_id for t in space_mod.parse(raw(micro_batch=[2], checkpoint_level=["none", "L1"])).trials}
    assert ids == {"t8d43_mb2_none_ga1_b0.1", "t51b0_mb2_L1_ga1_b0.1"}  # as main gave them before the table
    sp = space_mod.parse(raw(micro_batch=[2], workers_per_trial=[1, 2], parallelism=["ddp", "fsdp"]))
    got = {(t.resources.workers_per_trial, t.resources.parallelism, t.effective_batch()) for t in sp.trials}
    assert got == {(1, "ddp", 2), (1, "fsdp", 2), (2, "ddp", 4), (2, "fsdp", 4)}
    assert all(t.trial_id.endswith(f"_w{t.resources.workers_per_trial}_{t.resources.parallelism}") for t in sp.trials)
    knobs = sp.trials[-1].knobs()
    assert (knobs["workers_per_trial"], knobs["parallelism"]) == (2, "fsdp")
    with pytest.raises(SpaceError, match=r"search.parallelism: .*'ddp'"):
        space_mod.parse(raw(parallelism=["ddp", "zero9"]))


def test_effective_batch_points_that_do_not_divide_are_skipped():
    sp = space_mod.parse(raw(micro_batch=[2, 4], effective_batch=[4, 6]))
    assert sorted((t.micro_batch, t.grad_acc) for t in sp.trials) == [(2, 2), (2, 3), (4, 1)]
    skipped, = sp.skipped
    assert skipped.values == {"micro_batch": 4, "effective_batch": 6} and "does not divide" in skipped.reason
    with pytest.raises(SpaceError, match=r"search.effective_batch: 6 does not divide into micro_batch 4"):
        space_mod.parse(raw(micro_batch=[4], effective_batch=[6]))


def test_a_combination_the_train_checks_refuse_is_skipped_and_a_wrong_value_is_not():
    space = raw(loss=["sigmoid", "ipo"])
    space["train"] = {**space["train"], "label_smoothing": 0.1}
    sp = space_mod.parse(space)
    assert {t.train.loss for t in sp.trials} == {"sigmoid"} and {s.values["loss"] for s in sp.skipped} == {"ipo"}
    assert "label_smoothing (0.1) is only used by loss: sigmoid" in sp.skipped[0].reason
    with pytest.raises(SpaceError, match=r"search.lr"):
        space_mod.parse(raw(lr=[1e-4, -1.0]))


def test_paired_values_go_together_instead_of_being_crossed():
    sp = space_mod.parse(raw(micro_batch=[1, 2], paired=[{"adapter": "full"},
                                                         {"adapter": "lora", "lora_r": [8, 16]}]))
    got = sorted((t.train.adapter, t.train.lora_r if "lora_r" in t.swept_train else None, t.micro_batch)
                 for t in sp.trials)
    assert got == [("full", None, 1), ("full", None, 2), ("lora", 8, 1), ("lora", 8, 2), ("lora", 16, 1),
                   ("lora", 16, 2)]
    assert {t.trial_id.split("_", 1)[1] for t in sp.trials if t.train.adapter == "full"} == {
        "mb1_none_ga1_b0.1_adapter-full", "mb2_none_ga1_b0.1_adapter-full"}
    for bad, message in (({"paired": [{"micro_batch": 1}], "micro_batch": [2]}, r"paired\[0\].micro_batch: also listed"),
                         ({"paired": [{"micro_batch": 1}, {"micro_batch": [1, 2]}]}, "listed by two cases"),
                         ({"paired": {"adapter": "full"}}, "give a list of mappings")):
        with pytest.raises(SpaceError, match=message):
            space_mod.parse(raw(**bad))
