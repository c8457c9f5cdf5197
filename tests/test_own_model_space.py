"""search_spaces/own-model-data.yaml, the README's "Your own model and data": its data file is
read as a worker reads it, and the file validates with a local checkpoint in place of the hub id."""
from __future__ import annotations

from pathlib import Path

import torch

from dpo_sweep import space as space_mod
from dpo_sweep.cli import main

ROOT = Path(__file__).resolve().parents[1]
SPACE = ROOT / "search_spaces" / "own-model-data.yaml"


def test_the_space_names_a_checkpoint_and_a_data_file():
    spec = space_mod.load(SPACE).spec
    assert spec.model.name_or_path and spec.data.path and spec.model.preset is None
    assert (ROOT / spec.data.path).is_file()


def test_validate_reads_the_shipped_pairs_with_a_local_checkpoint(tmp_path, capsys, monkeypatch):
    from transformers import AutoModelForCausalLM

    from dpo_sweep.models.presets import preset_config
    from dpo_sweep.train.tokenizer import byte_level_tokenizer

    ckpt = tmp_path / "ckpt"
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(preset_config("tiny-llama")).save_pretrained(ckpt)
    byte_level_tokenizer().save_pretrained(ckpt)
    monkeypatch.chdir(ROOT)  # data.path is relative to where dpo-sweep runs
    assert main(["validate", str(SPACE), "--set", f"model.name_or_path={ckpt}"]) == 0
    out = capsys.readouterr().out
    assert f"{SPACE}: valid, 9 trial(s)" in out
    assert "32 pair(s)" in out and "0 dropped" in out
