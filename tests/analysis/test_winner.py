"""DIR/recommended.yaml (the winner pinned, one trial that validate reads and trial runs) and the
winner as TRL DPOConfig arguments."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from sweep_frames import trial, write_dir

from dpo_sweep import space as space_mod
from dpo_sweep.analysis import commands, winner
from dpo_sweep.analysis.results import load_results
from dpo_sweep.cli import main
from dpo_sweep.records import read_csv_rows

QUICKSTART = Path(__file__).resolve().parents[2] / "search_spaces" / "quickstart.yaml"


def quick_space(tmp_path: Path, search: dict | None = None, train: dict | None = None) -> dict:
    raw = yaml.safe_load(QUICKSTART.read_text())
    raw["train"].update({"steps": 3, "warmup_steps": 1, **(train or {})})
    raw["search"] = search or {"micro_batch": [2, 4], "checkpoint_level": ["none", "L2"], "grad_acc": [1],
                               "beta": [0.1], "lr": [1e-4, 3e-4]}
    return raw


def results_for(tmp_path: Path, raw: dict, fastest: int) -> Path:
    """A results dir of ``raw``'s trials (DIR/space.yaml, results.csv), trial ``fastest`` the clear winner."""
    out = tmp_path / "r"
    out.mkdir()
    (out / "space.yaml").write_text(yaml.safe_dump(raw))
    rows = []
    for i, t in enumerate(space_mod.parse(raw).trials):
        row = trial(t.trial_id, mem=1.0 + i * 0.01, time_ms=100.0 if i == fastest else 400.0, std=0.02,
                    mb=t.micro_batch, level=t.checkpoint_level, ga=t.grad_acc, beta=t.beta,
                    seed=t.train.seed)
        row.extra.update(t.swept_columns())
        row.extra.update({"attn_implementation": "sdpa", "liger_kernel": False})
        rows.append(row)
    return write_dir(out, rows)


def test_recommended_yaml_pins_the_winner_validates_as_one_trial_and_runs(tmp_path, capsys):
    raw = quick_space(tmp_path)
    expected = space_mod.parse(raw).trials[5]  # micro_batch 4, none, lr 3e-4
    out = results_for(tmp_path, raw, fastest=5)
    outcome = commands.analyse_dir(out, memory_budget_gb=20.0)
    assert outcome.recommendation["trial_id"] == expected.trial_id
    path = out / "recommended.yaml"
    assert outcome.recommended_path == path
    text = path.read_text()
    assert text.startswith("#") and f"dpo-sweep trial {path}" in text
    pinned = space_mod.load(path)
    assert len(pinned.trials) == 1
    one = pinned.trials[0]
    assert (one.micro_batch, one.checkpoint_level, one.grad_acc, one.beta) == (4, "none", 1, 0.1)
    # the swept lr, and every other field; pad_to_multiple_of auto pinned to what the row ran (not
    # recorded in these rows: the longest row, 1)
    assert one.train == expected.train.model_copy(update={"pad_to_multiple_of": 1}) and one.train.lr == 3e-4
    assert one.model.attn_implementation == "sdpa" and one.model.liger_kernel is False  # auto, resolved
    assert one.data == expected.data and one.resources == expected.resources
    assert "recommended.yaml" in outcome.recommendation_text and "learning_rate=0.0003" in outcome.recommendation_text

    assert main(["validate", str(path)]) == 0
    assert f"{path}: valid, 1 trial(s)" in capsys.readouterr().out
    ran = tmp_path / "ran"
    assert main(["trial", str(path), "--output", str(ran)]) == 0
    row, = read_csv_rows(ran / "results.csv")
    assert (row["status"], row["micro_batch"], row["checkpoint_level"]) == ("ok", "4", "none")


def test_report_html_gives_the_trl_arguments_and_the_commands(tmp_path):
    raw = quick_space(tmp_path)
    out = results_for(tmp_path, raw, fastest=3)  # micro_batch 2, L2: not expressible in TRL
    commands.analyse_dir(out, memory_budget_gb=20.0)
    html = (out / "report.html").read_text()
    assert 'id="trl-config"' in html and "per_device_train_batch_size=2" in html
    assert "dpo-sweep trial recommended.yaml" in html
    assert "# not in TRL: checkpoint_level L2" in html


def test_recommend_prints_trl_arguments_and_names_the_checkpoint_gap(tmp_path, capsys):
    raw = quick_space(tmp_path)
    out = results_for(tmp_path, raw, fastest=2)  # micro_batch 2, L2, lr 1e-4
    assert main(["recommend", str(out), "--memory-budget-gb", "20"]) == 0
    printed = capsys.readouterr().out
    assert "as TRL DPOConfig arguments:" in printed
    for arg in ("per_device_train_batch_size=2", "gradient_accumulation_steps=1", "gradient_checkpointing=True",
                "beta=0.1", "learning_rate=0.0001"):
        assert arg in printed
    assert "# not in TRL: checkpoint_level L2" in printed and "L1-L3" in printed
    assert not (out / "recommended.yaml").exists()  # recommend writes nothing


def test_the_trl_text_is_the_call_that_passes_the_arguments(tmp_path):
    raw = quick_space(tmp_path)
    t = space_mod.parse(raw).trials[0]
    args, gaps = winner.trl_config(t, load_results(results_for(tmp_path, raw, 0)).iloc[0])
    text = winner.trl_text(args, gaps)
    assert eval(text, {"DPOConfig": dict}) == args  # valid Python, every argument once
    assert all(len(line) <= 100 for line in text.splitlines() if not line.startswith("#"))


@pytest.mark.parametrize("precision, bf16, fp16, dtype", [("fp32", False, False, None), ("bf16", True, False, "bfloat16"),
                                                          ("bf16-mixed", True, False, None), ("fp16", False, True, None)])
def test_trl_precision(tmp_path, precision, bf16, fp16, dtype):
    t = space_mod.parse(quick_space(tmp_path, train={"precision": precision})).trials[0]
    args, _ = winner.trl_config(t, load_results(results_for(tmp_path, quick_space(tmp_path), 0)).iloc[0])
    assert (args["bf16"], args["fp16"]) == (bf16, fp16)
    assert args.get("model_init_kwargs", {}).get("torch_dtype") == dtype


def test_trl_pads_to_the_multiple_the_trial_padded_to(tmp_path):
    # the row's pad_multiple (train.pad_to_multiple_of as it resolved: auto is 64 on CUDA, 1 on the
    # CPU); TRL's own auto pads only on Neuron, so a multiple above 1 is passed on
    raw = quick_space(tmp_path)
    t = space_mod.parse(raw).trials[0]
    row = load_results(results_for(tmp_path, raw, 0)).iloc[0]
    assert "pad_to_multiple_of" not in winner.trl_config(t, row)[0]  # not recorded (older results)
    on_gpu = row.copy()
    on_gpu["pad_multiple"] = 64
    assert winner.trl_config(t, on_gpu)[0]["pad_to_multiple_of"] == 64
    assert winner.pinned_space(t, on_gpu)["train"]["pad_to_multiple_of"] == 64  # auto pinned to what ran
    assert winner.pinned_space(t, row)["train"]["pad_to_multiple_of"] == 1  # before the column: the longest row
    on_cpu = row.copy()
    on_cpu["pad_multiple"] = 1
    assert "pad_to_multiple_of" not in winner.trl_config(t, on_cpu)[0]
    packed = space_mod.parse(quick_space(tmp_path, train={"padding_free": True})).trials[0]
    assert "pad_to_multiple_of" not in winner.trl_config(packed, on_gpu)[0]


def test_trl_gaps_name_what_trl_cannot_express(tmp_path):
    raw = quick_space(tmp_path, search={"checkpoint_level": ["full"], "micro_batch": [2]},
                      train={"adaptive_clip": True, "ema_decay": 0.99, "beta_schedule": "seed"})
    t = space_mod.parse(raw).trials[0]
    args, gaps = winner.trl_config(t, load_results(results_for(tmp_path, raw, 0)).iloc[0])
    assert args["gradient_checkpointing"] is True
    assert not any("checkpoint_level" in g for g in gaps)  # full is TRL's gradient checkpointing
    named = " ".join(gaps)
    assert "adaptive_clip" in named and "ema_decay 0.99" in named and "beta_schedule seed" in named


def test_no_space_yaml_no_recommended_yaml_and_a_stale_one_is_removed(tmp_path, capsys):
    out = write_dir(tmp_path / "r", [trial("t0", 1.0, 100.0, 0.02), trial("t1", 2.0, 90.0, 0.02)])
    (out / "recommended.yaml").write_text("stale")
    outcome = commands.analyse_dir(out, memory_budget_gb=20.0)
    assert outcome.recommended_path is None and not (out / "recommended.yaml").exists()
    assert "no recommended.yaml" in outcome.recommendation_text and "space.yaml" in outcome.recommendation_text


def test_a_trial_id_of_another_version_is_found_by_its_values(tmp_path):
    raw = quick_space(tmp_path)
    trials = space_mod.parse(raw).trials
    row = load_results(results_for(tmp_path, raw, 0)).iloc[6].copy()
    row["trial_id"] = "renamed-6"
    assert winner.find_trial(trials, row) == trials[6]


def test_the_model_decides_between_trials_of_the_same_values(tmp_path):
    raw = quick_space(tmp_path, search={"model": ["tiny-llama", "llama-3.2-1b"], "micro_batch": [2]})
    trials = space_mod.parse(raw).trials
    row = load_results(results_for(tmp_path, raw, 0)).iloc[0].copy()
    row["trial_id"], row["model"] = "renamed", "llama-3.2-1b"
    assert winner.find_trial(trials, row) == trials[1]


def test_a_lora_winner_with_a_low_bit_adamw_names_its_peft_config_and_optim(tmp_path):
    from peft import LoraConfig
    from transformers.training_args import OptimizerNames

    raw = quick_space(tmp_path, train={"adapter": "lora", "lora_r": 8, "lora_alpha": 16, "optimizer": "adamw_8bit"})
    t = space_mod.parse(raw).trials[0]
    args, gaps = winner.trl_config(t, load_results(results_for(tmp_path, raw, 0)).iloc[0])
    assert OptimizerNames(args["optim"]) == OptimizerNames.ADAMW_TORCH_8BIT  # transformers' torchao AdamW8bit
    (peft,) = [g for g in gaps if g.startswith("adapter lora")]
    call = peft[peft.index("LoraConfig("):peft.index(", task_type='CAUSAL_LM')")] + ", task_type='CAUSAL_LM')"
    config = eval(call, {"LoraConfig": LoraConfig})  # the text pastes as peft's own call
    # lora_targets auto: the Llama preset's own linear layers, named as peft takes them
    from dpo_sweep.config import DEFAULT_LORA_TARGETS

    assert t.train.lora_targets == ("auto",)
    assert (config.r, config.lora_alpha, set(config.target_modules)) == (8, 16, set(DEFAULT_LORA_TARGETS))
    (tmp_path / "full").mkdir()
    plain = quick_space(tmp_path / "full")
    full = space_mod.parse(plain).trials[0]
    args, gaps = winner.trl_config(full, load_results(results_for(tmp_path / "full", plain, 0)).iloc[0])
    assert "optim" not in args and not any(g.startswith("adapter") for g in gaps)


def test_trl_keeps_dropout_only_where_the_trial_did(tmp_path):
    row = load_results(results_for(tmp_path, quick_space(tmp_path), 0)).iloc[0]
    plain = space_mod.parse(quick_space(tmp_path)).trials[0]
    assert "disable_dropout" not in winner.trl_config(plain, row)[0]  # TRL's default: off, as here
    kept = space_mod.parse(quick_space(tmp_path, train={"dropout": True})).trials[0]
    assert winner.trl_config(kept, row)[0]["disable_dropout"] is False
