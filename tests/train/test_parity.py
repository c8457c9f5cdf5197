"""The parity check: accepted where the trainer's paths are the model's own, refused (exit 2 at
validate, the trial's error status inside a trial) where they are not."""
from __future__ import annotations

import math

import pytest
import torch

from dpo_sweep import cli
from dpo_sweep.config import ModelSpec
from dpo_sweep.errors import UserError
from dpo_sweep.train import logprobs
from dpo_sweep.train.head import HeadTransform
from dpo_sweep.train.parity import CPU_PARAMS, TOLERANCE, FastPaths, check_on_cpu, cpu_params

from family_checkpoints import FAMILIES, save_family_checkpoint
from testkit import make_cfg

SPACE = """name: parity
model: {name_or_path: %s}
data: {synthetic: {pairs: 4, prompt_tokens: 8, response_tokens: 6}}
train: {steps: 1, warmup_steps: 0, max_length: 32, precision: fp32, worst_case_step: false, evaluate: false}
resources: {use_gpu: false}
search: {micro_batch: [2], checkpoint_level: [none, full]}
"""


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def folders(family_folder):
    """model_type -> a checkpoint folder with its head scaled x200."""
    return lambda model_type: family_folder(model_type, head_scale=200)


def _drop_head_transform(monkeypatch):
    """A deliberately broken path: the log-prob head forgets the family's head transform."""
    monkeypatch.setattr(logprobs, "head_transform", lambda lm: HeadTransform())


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_chunked_head_and_full_agree_with_every_familys_own_forward(model_type, folders):
    spec = ModelSpec(name_or_path=str(folders(model_type)))
    figures = check_on_cpu(spec, {FastPaths(16, "none", False, False), FastPaths(0, "full", False, False),
                                  FastPaths(16, "full", False, True)})
    for f in figures.values():
        assert f.within(TOLERANCE["fp32"]) and f.logp_diff < 1e-3


def test_validate_refuses_a_broken_head_with_exit_2(folders, tmp_path, monkeypatch, capsys):
    space = tmp_path / "space.yaml"
    space.write_text(SPACE % folders("gemma2"))
    assert cli.main(["validate", str(space)]) == 0
    _drop_head_transform(monkeypatch)
    assert cli.main(["validate", str(space)]) == 2
    err = capsys.readouterr().err
    # the model type, the setting at fault and the size of the difference
    assert "gemma2: the log-prob head disagrees with the model's own forward" in err
    assert "nats apart" in err and "refused before any training" in err


def test_trial_refuses_a_broken_head_before_training(folders, tmp_path, monkeypatch, capsys):
    space = tmp_path / "space.yaml"
    space.write_text(SPACE % folders("cohere"))
    _drop_head_transform(monkeypatch)
    assert cli.main(["trial", str(space), "--output", str(tmp_path / "out")]) == 2
    assert "cohere: the log-prob head disagrees" in capsys.readouterr().err
    assert not (tmp_path / "out" / "results.csv").exists()


def test_a_trial_checks_its_own_paths_and_reports_the_figure(folders, monkeypatch):
    from dpo_sweep.train.loop import run_trial

    cfg = make_cfg(model={"name_or_path": str(folders("granite"))}, micro_batch=2, steps=1, max_length=32,
                   worst_case_step=False, evaluate=False, logp_chunk_tokens=16,
                   data={"synthetic": {"pairs": 2, "prompt_tokens": 8, "response_tokens": 6}})
    ok = run_trial(cfg, log=None)
    assert ok.result.status == "ok" and 0 <= ok.result.logp_parity < 1e-3
    # the same trial with the head transform dropped (a model too big for validate's CPU check
    # meets this inside its trial): status error, nothing trained, the message says what and how much
    _drop_head_transform(monkeypatch)
    bad = run_trial(cfg, log=None)
    assert bad.result.status == "error" and not bad.steps
    assert "granite: checkpoint_level none, train.logp_chunk_tokens 16, model.lean_ops disagrees" in bad.result.error
    figure = float(bad.result.error.split("log-probs ")[1].split(" nats")[0])
    assert figure > 1.0  # x200 logits divided by 4 or not: nats apart


def test_the_setting_at_fault_is_named(folders, monkeypatch):
    # a checkpoint level whose recompute differs from the forward: named alone, with its fix
    from dpo_sweep.train import checkpointing

    original = checkpointing.apply_checkpoint_level

    def broken(model, level):
        original(model, level)
        if level == "full":  # every layer's output nudged: what a layer computed otherwise looks like
            for layer in checkpointing.decoder_layers(model):
                layer.register_forward_hook(lambda m, i, o: (o[0] * 1.01, *o[1:]) if isinstance(o, tuple) else o * 1.01)

    monkeypatch.setattr(checkpointing, "apply_checkpoint_level", broken)
    spec = ModelSpec(name_or_path=str(folders("llama")))
    with pytest.raises(UserError, match=r"llama: checkpoint_level full disagrees .* refused before any training: "
                                        r"use checkpoint_level none or full"):
        check_on_cpu(spec, {FastPaths(16, "full", False, False)})


def test_parameter_count_from_the_config_without_weights(folders):
    from transformers import AutoModelForCausalLM

    folder = folders("qwen2")
    n = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(folder).parameters())
    assert cpu_params(ModelSpec(name_or_path=str(folder))) == n
    assert cpu_params(ModelSpec(preset="llama-3-8b")) > CPU_PARAMS  # checked in its trials, not at validate


def test_dropout_is_back_after_the_check(tmp_path):
    from dpo_sweep.train.model import build_model
    from dpo_sweep.train.parity import dropout_off

    folder = save_family_checkpoint("gpt2", tmp_path / "gpt2", dropout=0.1)
    lm = build_model(ModelSpec(name_or_path=str(folder)), "fp32", torch.device("cpu"), seed=0).model.eval()
    with dropout_off(lm):
        assert lm.training and all(m.p == 0 for m in lm.modules() if isinstance(m, torch.nn.Dropout))
    assert not lm.training and all(math.isclose(m.p, 0.1) for m in lm.modules() if isinstance(m, torch.nn.Dropout))


def test_a_router_loss_the_familys_code_cannot_add_is_refused_at_validate(family_folder, tmp_path):
    import json
    import shutil

    folder = tmp_path / "llama-asks"
    shutil.copytree(family_folder("llama"), folder)
    meta = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**meta, "output_router_logits": True,
                                                    "router_aux_loss_coef": 0.01}))
    with pytest.raises(UserError, match="asks for router logits .* set output_router_logits: false"):
        check_on_cpu(ModelSpec(name_or_path=str(folder)), {FastPaths(16, "none", False, False)})
