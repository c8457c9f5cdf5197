"""DPOConfig's fields and deprecations, read from the installed TRL or the recorded list."""
from __future__ import annotations

import json

import pytest

from dpo_sweep import trl_fields


def test_the_recorded_list_answers_without_trl():
    recorded = trl_fields.from_recorded()
    assert not recorded.installed and recorded.version.startswith("1.16")
    assert "per_device_train_batch_size" in recorded.fields and "model_init_kwargs" in recorded.fields
    assert recorded.current_name("gradient_checkpointing") == "activation_checkpointing"
    assert recorded.current_name("use_liger_kernel") is None  # its replacement is a setting, not a field
    assert recorded.current_name("group_by_length") is None  # not a TrainingArguments field in transformers 5
    assert recorded.current_name("padding_free") is None and "padding_free" in recorded.unavailable
    assert recorded.fused_lm_head
    assert "recorded list" in recorded.label()


def test_help_text_deprecations():
    assert trl_fields._deprecated_by_help("Deprecated alias of `activation_checkpointing_kwargs`, will be "
                                          "removed in v6.") == (True, "activation_checkpointing_kwargs")
    liger = ("Enable Liger Kernel optimizations. Deprecated in `SFTTrainer`, `DPOTrainer`, `KTOTrainer`, and will "
             'be removed in v2.0.0: use `model_init_kwargs={"use_kernels": True}` instead.')
    assert trl_fields._deprecated_by_help(liger) == (True, 'model_init_kwargs={"use_kernels": True}')
    # a deprecated value of a field, or a deprecated launcher named in passing, is not the field's deprecation
    assert not trl_fields._deprecated_by_help("The only supported value is `'keep_start'`. The `'keep_end'` "
                                              "value is deprecated and will be removed in v2.0.0.")[0]
    assert not trl_fields._deprecated_by_help("When using torch.distributed.launch (Deprecated), it will pass")[0]
    assert not trl_fields._deprecated_by_help("Enable x. Deprecated in `SFTTrainer` only: use y instead.")[0]


def test_the_recorded_list_is_the_installed_trls_when_versions_match(tmp_path):
    pytest.importorskip("trl")
    installed = trl_fields.from_installed()
    recorded = trl_fields.from_recorded()
    if installed.version != recorded.version:
        pytest.skip(f"TRL {installed.version} installed, {recorded.version} recorded")
    assert installed.to_json() == recorded.to_json()
    written = trl_fields.record(tmp_path / "fields.json")
    assert json.loads(written.read_text()) == recorded.to_json()
    assert trl_fields.load() == installed


def test_load_falls_back_to_the_recorded_list(monkeypatch):
    monkeypatch.setattr(trl_fields, "trl_installed", lambda: False)
    assert trl_fields.load() == trl_fields.from_recorded()
