"""DIR/recommended.yaml (the winner pinned, one trial that validate reads and trial runs) and the
winner as TRL DPOConfig arguments."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from sweep_frames import trial, write_dir

from dpo_sweep import space as space_mod, trl_fields
from dpo_sweep import trl_export
from dpo_sweep.analysis import winner
from dpo_sweep.commands.report import analyse_dir
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
    outcome = analyse_dir(out, memory_budget_gb=20.0)
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
    analyse_dir(out, memory_budget_gb=20.0)
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
    for arg in ("per_device_train_batch_size=2", "gradient_accumulation_steps=1", "activation_checkpointing=True",
                "beta=0.1", "learning_rate=0.0001"):
        assert arg in printed
    assert "# not in TRL: checkpoint_level L2" in printed and "L1-L3" in printed
    assert not (out / "recommended.yaml").exists()  # recommend writes nothing


def export_of(tmp_path: Path, raw: dict, index: int = 0, row_update: dict | None = None, trl=None):
    t = space_mod.parse(raw).trials[index]
    row = load_results(results_for(tmp_path, raw, 0)).iloc[index].copy()
    for key, value in (row_update or {}).items():
        row[key] = value
    return t, winner.trl_export(t, row, trl if trl is not None else trl_fields.from_recorded())


def pasted(text: str) -> dict:
    """What the printed export builds, with DPOConfig and LoraConfig as dict."""
    scope = {"DPOConfig": dict, "LoraConfig": dict}
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    exec("dpo_config = " + "\n".join(lines[lines.index(next(x for x in lines if x.startswith("DPOConfig("))):])
         if not any(x.startswith("peft_config") for x in lines) else
         "\n".join(lines).replace("\nDPOConfig(", "\ndpo_config = DPOConfig("), scope)
    return {"dpo_config": scope["dpo_config"], "peft_config": scope.get("peft_config")}


@pytest.mark.parametrize("adapter", ["full", "lora"])
def test_the_trl_text_is_made_from_the_export(tmp_path, adapter):
    _, export = export_of(tmp_path, quick_space(tmp_path, train={"adapter": adapter}))
    text = trl_export.text(export)
    assert pasted(text) == {"dpo_config": export.dpo_config, "peft_config": export.peft_config}
    long = [line for line in text.splitlines() if not line.startswith("#") and len(line) > 100]
    assert all(line.count("=") <= 2 for line in long)  # only a line of one long argument (target_modules)
    assert text.startswith("# TRL 1.16.0's field names (the list recorded with dpo-sweep)")


def test_the_export_leaves_the_run_length_and_schedule_to_the_user(tmp_path):
    raw = quick_space(tmp_path, train={"lr_schedule": "cosine", "lr_warmup_steps": 2})
    _, export = export_of(tmp_path, raw)
    for measurement_only in ("max_steps", "num_train_epochs", "lr_scheduler_type", "warmup_steps", "warmup_ratio"):
        assert measurement_only not in export.dpo_config
    assert any("max_steps" in x and "3 steps" in x for x in export.left_to_you)
    assert any("lr_scheduler_type" in x for x in export.left_to_you)


@pytest.mark.parametrize("precision, bf16, fp16, dtype", [("fp32", False, False, "float32"),
                                                          ("bf16", True, False, "bfloat16"),
                                                          ("bf16-mixed", True, False, "float32"),
                                                          ("fp16", False, True, "float32")])
def test_trl_precision_loads_the_weights_in_the_dtype_measured(tmp_path, precision, bf16, fp16, dtype):
    _, export = export_of(tmp_path, quick_space(tmp_path, train={"precision": precision}))
    args = export.dpo_config
    assert (args["bf16"], args["fp16"]) == (bf16, fp16)
    # transformers 5 reads `dtype` (torch_dtype is dropped) and loads a checkpoint in its saved dtype without it
    assert args["model_init_kwargs"]["dtype"] == dtype and "torch_dtype" not in args["model_init_kwargs"]


def test_trl_pads_to_the_multiple_the_trial_padded_to(tmp_path):
    # the row's pad_multiple (train.pad_to_multiple_of as it resolved: auto is 64 on CUDA, 1 on the
    # CPU); TRL's own auto pads only on Neuron, so the multiple is always written
    raw = quick_space(tmp_path)
    t = space_mod.parse(raw).trials[0]
    row = load_results(results_for(tmp_path, raw, 0)).iloc[0]
    recorded = trl_fields.from_recorded()
    assert winner.trl_export(t, row, recorded).dpo_config["pad_to_multiple_of"] is None  # not recorded: longest row
    on_gpu = row.copy()
    on_gpu["pad_multiple"] = 64
    assert winner.trl_export(t, on_gpu, recorded).dpo_config["pad_to_multiple_of"] == 64
    assert winner.pinned_space(t, on_gpu)["train"]["pad_to_multiple_of"] == 64  # auto pinned to what ran
    assert winner.pinned_space(t, row)["train"]["pad_to_multiple_of"] == 1  # before the column: the longest row
    packed = space_mod.parse(quick_space(tmp_path, train={"padding_free": True})).trials[0]
    export = winner.trl_export(packed, on_gpu, recorded)
    assert export.dpo_config["pad_to_multiple_of"] is None and "padding_free" not in export.dpo_config
    assert any(n.startswith("padding_free=True") and "ignores it" in n for n in export.not_in_trl)


def test_trl_gaps_name_what_trl_cannot_express(tmp_path):
    raw = quick_space(tmp_path, search={"checkpoint_level": ["full"], "micro_batch": [2]},
                      train={"adaptive_clip": True, "ema_decay": 0.99, "beta_schedule": "seed"})
    _, export = export_of(tmp_path, raw)
    assert export.dpo_config["activation_checkpointing"] is True
    assert not any("checkpoint_level" in g for g in export.not_in_trl)  # full is TRL's checkpointing
    named = " ".join(export.not_in_trl)
    assert "adaptive_clip" in named and "ema_decay 0.99" in named and "beta_schedule seed" in named


def test_field_names_follow_the_trl_version(tmp_path):
    # TRL 1.16 / transformers 5: gradient_checkpointing is a deprecated alias, use_liger_kernel deprecated,
    # group_by_length gone; an older TRL without those deprecations gets the old names
    raw = quick_space(tmp_path, search={"checkpoint_level": ["none"], "micro_batch": [2]},
                      train={"group_by_length": True})
    new = trl_fields.from_recorded()
    _, export = export_of(tmp_path, raw, trl=new)
    row_liger = {"liger_kernel": True}
    assert export.dpo_config["activation_checkpointing"] is False  # DPOConfig's own default is on
    assert "gradient_checkpointing" not in export.dpo_config and "group_by_length" not in export.dpo_config
    assert any(n.startswith("group_by_length=True: TRL 1.16.0's DPOConfig has no field") for n in export.not_in_trl)
    old = trl_fields.TrlFields("0.19.0", False, frozenset(new.fields - {"activation_checkpointing"}
                                                          | {"group_by_length"}), {})
    raw_liger = quick_space(tmp_path / "o", search={"checkpoint_level": ["none"], "micro_batch": [2]},
                            train={"group_by_length": True})
    raw_liger["model"]["liger_kernel"] = True
    (tmp_path / "o").mkdir()
    (tmp_path / "n").mkdir()
    _, old_export = export_of(tmp_path / "o", raw_liger, trl=old, row_update=row_liger)
    assert old_export.dpo_config["gradient_checkpointing"] is False and old_export.dpo_config["group_by_length"]
    assert old_export.dpo_config["use_liger_kernel"] is True
    _, new_export = export_of(tmp_path / "n", raw_liger, trl=new, row_update=row_liger)
    assert "use_liger_kernel" not in new_export.dpo_config
    assert any(n.startswith("liger_kernel true:") and "deprecates use_liger_kernel" in n for n in new_export.not_in_trl)


def test_recommendation_json_holds_the_trl_export(tmp_path):
    import json

    raw = quick_space(tmp_path)
    out = results_for(tmp_path, raw, fastest=3)
    outcome = analyse_dir(out, memory_budget_gb=20.0)
    saved = json.loads((out / "recommendation.json").read_text())["trl"]
    assert saved == outcome.recommendation["trl"]
    assert saved["dpo_config"]["per_device_train_batch_size"] == 2 and saved["peft_config"] is None
    assert saved["trl_version"] and saved["fields_from"] in ("installed", "recorded")
    assert pasted(outcome.winner_text[outcome.winner_text.index("# TRL"):])["dpo_config"] == saved["dpo_config"]


def test_no_space_yaml_no_recommended_yaml_and_a_stale_one_is_removed(tmp_path, capsys):
    out = write_dir(tmp_path / "r", [trial("t0", 1.0, 100.0, 0.02), trial("t1", 2.0, 90.0, 0.02)])
    (out / "recommended.yaml").write_text("stale")
    outcome = analyse_dir(out, memory_budget_gb=20.0)
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
    t, export = export_of(tmp_path, raw)
    assert OptimizerNames(export.dpo_config["optim"]) == OptimizerNames.ADAMW_TORCH_8BIT  # transformers' torchao AdamW8bit
    config = LoraConfig(**export.peft_config)  # peft's own names
    # lora_targets auto: the Llama preset's own linear layers, named as peft takes them
    from dpo_sweep.config import DEFAULT_LORA_TARGETS

    assert t.train.lora_targets == ("auto",)
    assert (config.r, config.lora_alpha, set(config.target_modules)) == (8, 16, set(DEFAULT_LORA_TARGETS))
    (tmp_path / "full").mkdir()
    _, full = export_of(tmp_path / "full", quick_space(tmp_path / "full"))
    assert "optim" not in full.dpo_config and full.peft_config is None


def test_the_winner_says_what_the_other_trainer_measured(tmp_path):
    import dataclasses
    import json

    raw = quick_space(tmp_path, search={"micro_batch": [2, 4], "checkpoint_level": ["none"], "grad_acc": [1],
                                        "beta": [0.1], "trainer": ["native", "trl"]})
    out = tmp_path / "r"
    out.mkdir()
    (out / "space.yaml").write_text(yaml.safe_dump(raw))
    rows = []
    for t in space_mod.parse(raw).trials:  # each trl twin: more memory, fewer tokens/s
        native = t.train.trainer == "native"
        row = trial(t.trial_id, mem=(2.0 if native else 2.5) * t.micro_batch, time_ms=(100.0 if native else 140.0),
                    std=0.02, mb=t.micro_batch, level=t.checkpoint_level, ga=t.grad_acc, beta=t.beta,
                    seed=t.train.seed)
        row.extra.update({"attn_implementation": "sdpa", "liger_kernel": False})
        rows.append(dataclasses.replace(row, trainer=t.train.trainer))
    write_dir(out, rows)
    outcome = analyse_dir(out, memory_budget_gb=40.0)
    switch = json.loads((out / "recommendation.json").read_text())["trl"]["switch"]
    assert outcome.recommendation["config"]["trainer"] == "native"
    assert (switch["trainer"], switch["source"], switch["status"]) == ("trl", "measured", "ok")
    assert switch["peak_mem_gb"] == pytest.approx(5.0)  # the winner: native mb 2 (tied tokens/s, less memory)
    assert "with the trl trainer" in outcome.winner_text and "(+1.00 GB)" in outcome.winner_text
    frontier = (out / "frontier.md").read_text()
    assert "| trainer |" in frontier and "## Native and TRL trainers" in frontier
    # each configuration once, its two trainers side by side: mb 2 (4 vs 5 GB), mb 4 (8 vs 10 GB)
    assert "| 2 | none | 1 | 0.1 | 4.00 | 5.00 | +1.00 | 10,000 | 7,143 | 0.71x |" in frontier
    assert "| 4 | none | 1 | 0.1 | 8.00 | 10.00 | +2.00 |" in frontier


def test_a_level_trl_cannot_run_takes_the_measured_trl_row_of_its_nearest_level(tmp_path):
    import dataclasses
    import json

    raw = quick_space(tmp_path, search={"micro_batch": [2], "checkpoint_level": ["L1", "full"], "grad_acc": [1],
                                        "beta": [0.1], "trainer": ["native", "trl"]})
    out = tmp_path / "r"
    out.mkdir()
    (out / "space.yaml").write_text(yaml.safe_dump(raw))
    rows = []
    for t in space_mod.parse(raw).trials:  # trl x L1 is skipped: native L1 (fastest), native full, trl full
        native, full = t.train.trainer == "native", t.checkpoint_level == "full"
        row = trial(t.trial_id, mem=3.0 if full else 4.0, time_ms=(100.0 if native and not full else 300.0) + 50 * (not native),
                    std=0.02, mb=t.micro_batch, level=t.checkpoint_level, ga=t.grad_acc, beta=t.beta,
                    seed=t.train.seed)
        row.extra.update({"attn_implementation": "sdpa", "liger_kernel": False})
        rows.append(dataclasses.replace(row, trainer=t.train.trainer))
    assert sorted((r.trainer, r.checkpoint_level) for r in rows) == [("native", "L1"), ("native", "full"), ("trl", "full")]
    write_dir(out, rows)
    outcome = analyse_dir(out, memory_budget_gb=40.0)
    assert (outcome.recommendation["config"]["trainer"], outcome.recommendation["config"]["checkpoint_level"]) == ("native", "L1")
    switch = json.loads((out / "recommendation.json").read_text())["trl"]["switch"]
    trl_full = next(r for r in rows if r.trainer == "trl")
    assert (switch["source"], switch["trial_id"], switch["checkpoint_level"]) == ("measured", trl_full.trial_id, "full")
    assert switch["peak_mem_gb"] == pytest.approx(3.0)
    assert f"with the trl trainer ({trl_full.trial_id}, measured, at checkpoint level full, its nearest) it peaks at 3.00 GB (-1.00 GB)" in outcome.winner_text


def test_without_a_trl_row_the_switch_is_predicted_at_the_nearest_trl_level(tmp_path):
    import json

    from dpo_sweep.analysis import trainer_switch
    from dpo_sweep.plan.memory import predict_peak_gb

    raw = quick_space(tmp_path)
    out = results_for(tmp_path, raw, fastest=3)  # micro_batch 2, L2: TRL's nearest is full
    outcome = analyse_dir(out, memory_budget_gb=20.0)
    switch = json.loads((out / "recommendation.json").read_text())["trl"]["switch"]
    t = space_mod.parse(raw).trials[3]
    row = load_results(out).set_index("trial_id").loc[t.trial_id]
    other = trainer_switch.nearest_other(t)
    assert (other.train.trainer, other.checkpoint_level) == ("trl", "full")
    expected = row["peak_mem_gb"] + predict_peak_gb(other).total_gb - predict_peak_gb(t).total_gb
    assert (switch["source"], switch["checkpoint_level"]) == ("predicted", "full")
    assert switch["peak_mem_gb"] == pytest.approx(expected)
    assert "predicted by the memory model, not measured" in outcome.winner_text
    assert "at checkpoint level full, its nearest" in outcome.winner_text


def test_a_trl_winner_has_no_notes_of_the_native_trainers_own_modules(tmp_path):
    raw = quick_space(tmp_path, search={"micro_batch": [2], "checkpoint_level": ["none"], "grad_acc": [1],
                                        "beta": [0.1], "trainer": ["trl"]})
    _, export = export_of(tmp_path, raw)
    named = " ".join(export.not_in_trl)
    assert "lean_ops" not in named and "logp_chunk_tokens" not in named  # measured with TRL's own
    assert "truncation" in named  # the trl trial trained the sweep's truncated pairs
    (tmp_path / "n").mkdir()
    _, native = export_of(tmp_path / "n", quick_space(tmp_path / "n"))
    assert "lean_ops" in " ".join(native.not_in_trl)


def test_trl_keeps_dropout_only_where_the_trial_did(tmp_path):
    _, plain = export_of(tmp_path, quick_space(tmp_path))
    assert plain.dpo_config["disable_dropout"] is True  # dropout off, as TRL's default and the trainer's
    (tmp_path / "kept").mkdir()
    _, kept = export_of(tmp_path / "kept", quick_space(tmp_path / "kept", train={"dropout": True}))
    assert kept.dpo_config["disable_dropout"] is False
