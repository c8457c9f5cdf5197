"""`recommend DIR --memory-budget-gb X --write` writes recommended.yaml for the budget asked;
without --write it names the command that does (not `report`, which writes the default budget's)."""
from __future__ import annotations

from dataclasses import replace

import yaml
from sweep_frames import trial, write_dir

from dpo_sweep.commands.report import analyse_dir
from dpo_sweep.cli import main

SPACE = """name: w
model: {preset: tiny-llama}
data: {synthetic: {pairs: 16, prompt_tokens: 60, response_tokens: 60}}
train: {steps: 2, warmup_steps: 1, max_length: 128}
search: {micro_batch: [1, 2], checkpoint_level: [none], grad_acc: [1], beta: [0.1]}
"""


def folder(tmp_path):
    rows = [replace(trial("t000_mb1_none_ga1_b0.1", 10.0, 100.0, 0.02, mb=1, seed=0), stability="stable"),
            replace(trial("t001_mb2_none_ga1_b0.1", 30.0, 50.0, 0.02, mb=2, seed=0), stability="stable")]
    out = write_dir(tmp_path / "r", rows)
    (out / "space.yaml").write_text(SPACE)
    return out


def pinned_micro_batch(out):
    return yaml.safe_load((out / "recommended.yaml").read_text())["search"]["micro_batch"]


def test_recommend_write_pins_the_budget_asked(tmp_path, capsys):
    out = folder(tmp_path)
    analyse_dir(out)  # no budget: the faster, larger one
    assert pinned_micro_batch(out) == [2]
    assert main(["recommend", str(out), "--memory-budget-gb", "22"]) == 0
    printed = capsys.readouterr().out
    assert f"recommended.yaml: not written; `dpo-sweep recommend {out} --memory-budget-gb 22 --write` writes this one" in printed
    assert "dpo-sweep report" not in printed
    assert pinned_micro_batch(out) == [2]  # untouched without --write
    assert main(["recommend", str(out), "--memory-budget-gb", "22", "--write"]) == 0
    assert f"recommended.yaml: {out / 'recommended.yaml'}" in capsys.readouterr().out
    assert pinned_micro_batch(out) == [1]
