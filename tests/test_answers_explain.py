"""Answers that say why: rows without a loss std (too few measured steps) are named with the
reason and the fix, a directory given as the space file is called a directory, and `run` takes
``--set`` as `validate` and `trial` do."""
from __future__ import annotations

import math

import pytest
import yaml

from dpo_sweep.cli import main
from dpo_sweep.records import TrialResult, write_results
from dpo_sweep.sweep import stopping
from dpo_sweep.commands.run import _space_record
from dpo_sweep import space as space_mod
from testkit import make_cfg

SPACE = ("name: explain\nmodel: {preset: tiny-llama}\n"
         "data: {synthetic: {pairs: 16, prompt_tokens: 12, response_tokens: 10}}\n"
         "train: {steps: 3, warmup_steps: 1, precision: fp32, max_length: 64}\n"
         "resources: {use_gpu: false}\nsearch: {micro_batch: [1, 2]}\n")


def _rows(tmp_path, loss_std: float) -> None:
    rows = []
    for i, (mb, tps, mem) in enumerate([(1, 1000.0, 1.0), (2, 1800.0, 1.5)]):
        cfg = make_cfg(trial_id=f"t{i}", micro_batch=mb)
        rows.append(TrialResult(trial_id=f"t{i}", status="ok", **cfg.knobs(), peak_mem_gb=mem, step_time_ms=40.0,
                                tokens_per_s=tps, loss_std=loss_std, steps=3, measured_steps=2,
                                measured_by=f"t{i}", stability_from=f"t{i}", stability_steps=3))
    write_results(tmp_path, rows)


def test_rows_without_a_loss_std_say_why_and_how_to_get_one(tmp_path, capsys):
    _rows(tmp_path, math.nan)
    assert main(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert ("2 of 2 completed trial(s) have no loss std, so they cannot be compared on it and are not on the "
            "frontier: a loss std is the spread of the loss around its trend line, which needs at least 3 "
            "measured steps (after train.warmup_steps); they measured 2.") in out
    assert "train.steps (and train.learning_steps, when set) at least warmup_steps + 3" in out
    assert "no loss std" in (tmp_path / "frontier.md").read_text()


def test_rows_with_a_loss_std_get_no_such_sentence(tmp_path, capsys):
    _rows(tmp_path, 0.01)
    assert main(["report", str(tmp_path)]) == 0
    assert "no loss std" not in capsys.readouterr().out


@pytest.mark.parametrize("command", ["validate", "run", "trial"])
def test_a_directory_given_as_the_space_file_is_called_a_directory(tmp_path, capsys, command):
    (tmp_path / "mine.yaml").write_text(SPACE)
    assert main([command, str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path}: this is a directory, not a space file; give a YAML file (it holds mine.yaml)" in err


def test_run_takes_set_and_refuses_a_bad_value_by_name(tmp_path, capsys):
    space = tmp_path / "s.yaml"
    space.write_text(SPACE)
    assert main(["run", str(space), "--set", "micro_batch=0", "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "micro_batch" in err and "unrecognized arguments" not in err
    assert not (tmp_path / "out").exists()


def test_run_records_its_set_overrides_in_space_yaml_and_the_resume_line(tmp_path):
    space = tmp_path / "s.yaml"
    space.write_text(SPACE)
    overrides = ["train.steps=5", "micro_batch=2"]
    sp = space_mod.load(space, overrides)
    args = type("Args", (), {"space": str(space), "overrides": overrides})()
    text = _space_record(args, sp)
    assert text.startswith(f"# {space} with --set train.steps=5 --set micro_batch=2\n")
    recorded = space_mod.parse(yaml.safe_load(text))  # what `report` reads back from DIR/space.yaml
    assert [t.micro_batch for t in recorded.trials] == [2] and recorded.trials[0].train.steps == 5
    assert _space_record(type("Args", (), {"space": str(space), "overrides": []})(), sp) is None
    assert stopping.resume_command("q.yaml", "out", ["train.steps=5", "beta=[0.1, 0.2]"]) == \
        "dpo-sweep run q.yaml --set train.steps=5 --set 'beta=[0.1, 0.2]' --output out --resume"
