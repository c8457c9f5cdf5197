"""`dpo-sweep trial`: one configuration in-process, the contract files, real checkpoints."""

import pytest
import torch

from dpo_sweep.records import RESULTS_COLUMNS, STEPS_COLUMNS, read_csv_rows
from dpo_sweep.cli import main
from dpo_sweep.train.loop import run_trial
from dpo_sweep.train.tokenizer import byte_level_tokenizer


def test_quickstart_trial_writes_contract_files(tmp_path, capsys):
    out = tmp_path / "t"
    rc = main(["trial", "search_spaces/quickstart.yaml", "--set", "micro_batch=4", "--set", "checkpoint_level=L2",
               "--set", "train.steps=3", "--set", "train.warmup_steps=1", "--output", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    # 3 steps and the worst-case step: 4 in all, and the count says so
    assert "step 3/4 loss" in printed and "step 4/4 loss" in printed and "tok/s" in printed
    assert "done: peak memory" in printed
    rows = read_csv_rows(out / "results.csv")
    assert list(rows[0]) == RESULTS_COLUMNS and len(rows) == 1
    r = rows[0]
    assert (r["status"], r["micro_batch"], r["checkpoint_level"], r["model"]) == ("ok", "4", "L2", "tiny-llama")
    steps = read_csv_rows(out / "steps.csv")
    assert list(steps[0]) == STEPS_COLUMNS and [s["step"] for s in steps] == ["1", "2", "3", "4"]  # 4: worst case


def test_trial_set_errors_exit_2(tmp_path, capsys):
    assert main(["trial", "search_spaces/quickstart.yaml", "--set", "checkpoint_level=L4"]) == 2
    assert "L4 is refused" in capsys.readouterr().err
    assert main(["trial", "search_spaces/quickstart.yaml", "--set", "train.precision=fp8"]) == 2
    err = capsys.readouterr().err
    assert "train.precision" in err and "fp8" in err
    assert main(["trial", "search_spaces/quickstart.yaml", "--set", "nonsense"]) == 2


def test_name_or_path_loads_a_local_checkpoint(tmp_path, cfg_factory):
    """The real loading path (from_pretrained) on a checkpoint the test saves."""
    from transformers import AutoModelForCausalLM

    from dpo_sweep.models.presets import preset_config

    ckpt = tmp_path / "ckpt"
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(preset_config("tiny-llama")).save_pretrained(ckpt)
    byte_level_tokenizer().save_pretrained(ckpt)
    cfg = cfg_factory(micro_batch=2, steps=2, model={"name_or_path": str(ckpt)})
    out = run_trial(cfg, log=None)
    assert out.result.status == "ok", out.result.error
    assert out.result.model == str(ckpt) and out.result.attn_implementation == "sdpa"


def test_qwen2_shape_runs_all_levels(cfg_factory, monkeypatch):
    """The Qwen2 attention (q/k/v biases, sliding-window argument) through the L2/L3 regions."""
    from dpo_sweep.train import model as model_mod

    small = dict(model_mod.PRESETS["tiny-llama"], arch="qwen2")
    monkeypatch.setitem(model_mod.PRESETS, "qwen2-7b", small)
    losses = {}
    for level in ("none", "L3"):
        out = run_trial(cfg_factory(micro_batch=2, steps=2, checkpoint_level=level, model={"preset": "qwen2-7b"}),
                        log=None)
        assert out.result.status == "ok", out.result.error
        losses[level] = [s.loss for s in out.steps]
    assert losses["L3"] == pytest.approx(losses["none"], rel=1e-5)


def test_trial_in_a_sweep_folder_writes_beside_it_and_shows_the_sweeps_numbers(tmp_path, capsys, monkeypatch):
    import shutil

    sets = ["--set", "micro_batch=2", "--set", "train.steps=2", "--set", "train.warmup_steps=1"]
    sweep = tmp_path / "reports" / "quickstart"  # a sweep's folder: its results.csv holds this configuration
    assert main(["trial", "search_spaces/quickstart.yaml", *sets, "--output", str(sweep)]) == 0
    shutil.copyfile("search_spaces/quickstart.yaml", sweep / "recommended.yaml")
    capsys.readouterr()
    monkeypatch.chdir(sweep)  # as the report says: "in this folder ... dpo-sweep trial recommended.yaml"
    assert main(["trial", "recommended.yaml", *sets]) == 0
    printed = capsys.readouterr().out
    assert (sweep / "quickstart-trial" / "results.csv").is_file()  # beside it, not under ./reports/
    assert not (sweep / "reports").exists()
    assert "the sweep's row for this configuration" in printed
    assert "  peak memory: sweep " in printed and "this run " in printed and "  throughput: sweep " in printed
