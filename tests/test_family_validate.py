"""``dpo-sweep validate`` on checkpoint folders of many model families, as a user saves them:
every family validates, at every level it accepts, and a level or LoRA target a family cannot take
exactly is skipped (swept beside levels it takes) or refused here (exit 2) with the reason and the level
to use - never at run time."""
from __future__ import annotations

import pytest
import yaml

from dpo_sweep.cli import main
from family_checkpoints import FAMILIES, HYBRIDS, REFUSED_LEVELS, save_family_checkpoint


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {mt: save_family_checkpoint(mt, root / mt) for mt in (*FAMILIES, *HYBRIDS)}


def _space(tmp_path, folder, levels, attn="auto", **train):
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump({
        "name": "families", "model": {"name_or_path": str(folder), "attn_implementation": attn},
        "data": {"synthetic": {"pairs": 8, "prompt_tokens": 8, "response_tokens": 8}},
        "train": {"steps": 2, "warmup_steps": 1, "max_length": 32, "precision": "fp32", **train},
        "search": {"micro_batch": [1], "checkpoint_level": list(levels), "grad_acc": [1], "beta": [0.1]},
    }))
    return path


def _attention(model_type: str) -> str:
    # Gemma-2's soft-capped attention runs on eager only (transformers refuses sdpa for it).
    return "eager" if model_type == "gemma2" else "auto"


@pytest.mark.parametrize("model_type", list(FAMILIES))
def test_every_family_validates_at_the_levels_it_accepts(model_type, folders, tmp_path, capsys):
    accepted = [lv for lv in ("none", "L1", "L2", "L3", "full") if (model_type, lv) not in REFUSED_LEVELS]
    code = main(["validate", str(_space(tmp_path, folders[model_type], accepted, _attention(model_type)))])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert f"valid, {len(accepted)} trial(s)" in out.out


@pytest.mark.parametrize(("model_type", "level"), list(REFUSED_LEVELS))
def test_a_level_a_family_cannot_take_is_refused_at_validate(model_type, level, folders, tmp_path, capsys):
    # Swept beside a level it can take, the point is skipped with its reason; alone it is refused.
    code = main(["validate", str(_space(tmp_path, folders[model_type], ["none", level], _attention(model_type)))])
    out = capsys.readouterr().out
    assert code == 0 and "valid, 1 trial(s), 1 point(s) skipped" in out
    skipped = next(line for line in out.splitlines() if line.strip().startswith("skipped"))
    assert f"checkpoint_level {level}" in skipped and REFUSED_LEVELS[model_type, level] in skipped
    assert "L1 or full" in skipped
    code = main(["validate", str(_space(tmp_path, folders[model_type], [level], _attention(model_type)))])
    err = capsys.readouterr().err
    assert code == 2
    assert REFUSED_LEVELS[model_type, level] in err and "L1 or full" in err


@pytest.mark.parametrize("model_type", list(HYBRIDS))
def test_hybrids_are_refused_whole_at_validate(model_type, folders, tmp_path, capsys):
    code = main(["validate", str(_space(tmp_path, folders[model_type], ["none"]))])
    err = capsys.readouterr().err
    assert code == 2
    assert f"model_type {model_type} is a hybrid" in err and "state-space or linear attention" in err


@pytest.mark.parametrize(("model_type", "targets", "said"), [
    ("mixtral", ["q_proj", "gate_up_proj"], "3-D expert weight"),
    ("phi3", ["q_proj"], "q_proj is no linear layer of the decoder of phi3; allowed: down_proj, gate_up_proj"),
    ("gpt2", ["q_proj"], "auto: c_attn, c_fc, c_proj"),
])
def test_lora_targets_a_family_lacks_are_refused_at_validate(model_type, targets, said, folders, tmp_path, capsys):
    space = _space(tmp_path, folders[model_type], ["none"], adapter="lora", lora_targets=targets)
    assert main(["validate", str(space)]) == 2
    assert said in capsys.readouterr().err


@pytest.mark.parametrize("model_type", ["phi3", "gpt_neox", "gpt2", "qwen3_moe"])
def test_lora_auto_validates_on_fused_and_other_names(model_type, folders, tmp_path, capsys):
    space = _space(tmp_path, folders[model_type], ["none", "L1"], adapter="lora", lora_targets="auto")
    assert main(["validate", str(space)]) == 0, capsys.readouterr().err


#: The families the issue names as mainstream: each trains through the product at none and full.
MAINSTREAM = ("llama", "qwen2", "qwen3", "mistral", "gemma", "gemma2", "gemma3_text", "phi3", "olmo2", "granite",
              "cohere", "gpt_neox", "gpt2", "stablelm", "mixtral", "qwen2_moe", "smollm3")


@pytest.mark.parametrize("model_type", MAINSTREAM)
@pytest.mark.parametrize("level", ["none", "full"])
def test_mainstream_families_train_through_the_product(model_type, level, folders, tmp_path, capsys):
    space = _space(tmp_path, folders[model_type], ["none"], _attention(model_type), evaluate=False)
    out = tmp_path / "out"
    assert main(["trial", str(space), "--set", f"checkpoint_level={level}", "--output", str(out)]) == 0, \
        capsys.readouterr().err
    row = (out / "results.csv").read_text().splitlines()
    assert len(row) == 2 and ",ok," in row[1]


@pytest.mark.parametrize("model_type", ["phi3", "gpt2", "gpt_neox", "qwen2_moe", "mixtral", "gemma4_text"])
def test_the_planner_counts_the_adapters_lora_auto_makes(model_type, folders):
    """plan/levers.py's LoRA parameters for ``auto`` (from the shape's own linear names and sizes) are
    the ones peft makes on the family's model."""
    import torch
    from transformers import AutoModelForCausalLM

    from dpo_sweep.config import ModelSpec, TrainSpec
    from dpo_sweep.plan.levers import lora_params
    from dpo_sweep.plan.shape import built_shape
    from dpo_sweep.train.adapters import apply_adapter

    model = AutoModelForCausalLM.from_pretrained(folders[model_type], dtype=torch.float32)
    apply_adapter(model, TrainSpec(adapter="lora", lora_r=4))
    made = sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)
    assert made > 0
    assert lora_params(built_shape(ModelSpec(name_or_path=str(folders[model_type]))), ("auto",), 4) == made


@pytest.mark.parametrize("model_type", ["qwen2_moe", "mixtral", "llama", "phi3"])
def test_the_exported_target_modules_adapt_what_the_trainer_adapts_and_no_routed_expert(model_type, folders, tmp_path):
    """The TRL export's ``target_modules``, given to peft as a user pastes them, put adapters on exactly
    the layers the trainer's LoRA does; on an MoE no adapter reaches the routed experts (peft 0.22 turns
    a bare ``down_proj``/``gate_proj``/``up_proj`` on a transformers-5 MoE into its 3-D expert weights)."""
    import peft
    import torch
    from transformers import AutoModelForCausalLM

    from dpo_sweep import space as space_mod, trl_export
    from dpo_sweep.train.adapters import apply_adapter

    raw = yaml.safe_load(_space(tmp_path, folders[model_type], ["none"], adapter="lora", lora_r=4).read_text())
    trial = space_mod.parse(raw).trials[0]

    def adapted(put) -> dict[str, tuple[int, ...]]:
        model = AutoModelForCausalLM.from_pretrained(folders[model_type], dtype=torch.float32)
        model = put(model) or model
        return {n: tuple(p.shape) for n, p in model.named_parameters() if "lora_" in n}

    ours = adapted(lambda m: apply_adapter(m, trial.train) and None)
    exported = adapted(lambda m: peft.get_peft_model(m, peft.LoraConfig(**trl_export.peft_config(trial)))
                       .get_base_model())
    assert ours and exported == ours
    assert not [n for n in ours if ".experts." in n]


def test_a_model_that_cannot_be_built_is_refused_with_its_reason(folders, tmp_path, capsys, monkeypatch):
    """A config that loads but whose model transformers cannot build (remote code gone wrong, a
    family newer than the installed transformers): one line and exit 2, not a traceback."""
    from dpo_sweep.models import family

    def fails(spec):
        raise RuntimeError("shape mismatch in the family's __init__\nsecond line")

    monkeypatch.setattr(family, "meta_model", fails)
    family.spec_family.cache_clear()  # another test may have read this folder's family already
    assert main(["validate", str(_space(tmp_path, folders["llama"], ["none"]))]) == 2
    err = capsys.readouterr().err
    assert "could not be built from its config to read its layers (RuntimeError: shape mismatch" in err
    assert "Traceback" not in err and "second line" not in err


def test_a_level_auto_attention_cannot_keep_is_refused_with_the_level_to_use(folders, tmp_path, capsys):
    # Gemma-2 supports no fused attention kernel but flash-attn in transformers: on the CPU, auto
    # resolves to eager, which L2 cannot keep. The refusal says so and names L1 or full, not the
    # parity check's generic advice. (On a GPU, flash-attn may be chosen: the trial says.)
    space = _space(tmp_path, folders["gemma2"], ["none", "L2"])
    raw = yaml.safe_load(space.read_text())
    space.write_text(yaml.safe_dump({**raw, "resources": {"use_gpu": False}}))
    code = main(["validate", str(space)])
    err = capsys.readouterr().err
    assert code == 2
    assert "attn_implementation auto resolves to eager" in err and "use checkpoint_level L1 or full" in err
    assert "none or full" not in err


def test_the_family_check_reads_each_set_up_once_and_still_refuses_a_later_level(monkeypatch):
    """check_families reads each (model, train, resources, level) once: the betas and grad_accs of a
    100,000-configuration space share it. A trial that shares the sections but not the level is
    still read, and its refusal raised."""
    from dpo_sweep import preflight, space as space_mod
    from dpo_sweep.errors import UserError
    from dpo_sweep.models import family

    trials = space_mod.parse({
        "name": "once", "model": {"preset": "tiny-llama"},
        "data": {"synthetic": {"pairs": 8, "prompt_tokens": 8, "response_tokens": 8}},
        "train": {"steps": 2, "warmup_steps": 1, "max_length": 32, "precision": "fp32"},
        "search": {"micro_batch": [1, 2], "checkpoint_level": ["none", "L1"], "grad_acc": [1, 2],
                   "beta": [0.1, 0.2, 0.3]}}).trials
    read: list[str] = []

    def refused_trial(cfg):  # reads what the real one reads: the model, the level, the train section
        read.append(cfg.checkpoint_level)
        return "L1 refused here" if cfg.checkpoint_level == "L1" else None

    monkeypatch.setattr(family, "refused_trial", refused_trial)
    ok = [t for t in trials if t.checkpoint_level == "none"]
    preflight.check_families(ok)
    assert read == ["none"] and len(ok) == 12  # 12 trials, one set-up
    read.clear()
    assert trials[0].checkpoint_level == "none"
    with pytest.raises(UserError, match="L1 refused here"):
        preflight.check_families(trials)
    assert read == ["none", "L1"]
