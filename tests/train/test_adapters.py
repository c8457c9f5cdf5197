"""LoRA on the tiny model: step-1 loss ln 2, gradients equal to a hand-written LoRA DPO, the
precomputed reference equal to the live one, the adapters-off policy as the reference (no
copy), and the CUDA-only levers refused on the CPU with a reason."""
import copy
import math

import pytest
import torch
import torch.nn.functional as F

from dpo_sweep.config import DEFAULT_LORA_TARGETS, TrainSpec
from dpo_sweep.errors import UserError
from dpo_sweep.plan.levers import lora_params
from dpo_sweep.plan.shape import built_shape
from dpo_sweep.train import adapters
from dpo_sweep.train.adapters import AdaptersOff, apply_adapter, build_optimizer
from dpo_sweep.train.batching import collate
from dpo_sweep.train.loop import run_trial
from dpo_sweep.train.logprobs import SequenceLogProbs
from dpo_sweep.train.model import build_model
from testkit import make_cfg, ragged_pairs

CPU = torch.device("cpu")
BETA = 0.1


def lora_model(r: int = 4, alpha: float = 8.0, targets=DEFAULT_LORA_TARGETS, seed: int = 0):
    """The tiny model with LoRA adapters whose B is non-zero (so both A and B get gradients)."""
    from dpo_sweep.config import ModelSpec

    model = build_model(ModelSpec(preset="tiny-llama"), "fp32", CPU, seed=0).model
    peft_model = apply_adapter(model, TrainSpec(adapter="lora", lora_r=r, lora_alpha=alpha, lora_targets=targets))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    return model.train(), peft_model


def batch_of(n: int = 4):
    return collate(ragged_pairs(n), list(range(n)), pad_id=258)


def inputs(batch):
    return batch.input_ids, batch.attention_mask, batch.position_ids, batch.response_mask


def test_lora_trial_first_step_loss_is_ln2_and_counts_adapter_params():
    out = run_trial(make_cfg(micro_batch=2, steps=2, adapter="lora", lora_r=4), log=None)
    assert out.result.status == "ok", out.result.error
    assert out.steps[0].loss == pytest.approx(math.log(2), abs=1e-6)
    assert out.steps[0].rewards_chosen == 0 and out.steps[0].kl == 0
    assert out.steps[1].loss != pytest.approx(math.log(2), abs=1e-6)  # the adapters did learn
    shape = built_shape(make_cfg().model)
    assert out.result.trainable_params == lora_params(shape, DEFAULT_LORA_TARGETS, 4) == 37376
    assert (out.result.adapter, out.result.optimizer) == ("lora", "adamw")


def test_full_trial_row_says_full_adamw_and_every_param():
    out = run_trial(make_cfg(micro_batch=2, steps=1), log=None)
    assert (out.result.adapter, out.result.optimizer) == ("full", "adamw")
    assert out.result.trainable_params == built_shape(make_cfg().model).n_params


def test_lora_precomputed_reference_matches_live():
    kw = dict(micro_batch=2, steps=3, adapter="lora", lora_r=4, lora_dropout=0.0)
    live = run_trial(make_cfg(**kw), log=None)
    pre = run_trial(make_cfg(reference="precomputed", **kw), log=None)
    got = torch.tensor([[s.loss, s.grad_norm, s.logps_chosen] for s in pre.steps])
    want = torch.tensor([[s.loss, s.grad_norm, s.logps_chosen] for s in live.steps])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_reference_is_the_adapters_off_policy_sharing_its_weights():
    model, peft_model = lora_model()
    batch = batch_of()
    ref = AdaptersOff(SequenceLogProbs(model, 16), peft_model)
    assert list(ref.parameters()) == list(SequenceLogProbs(model, 16).parameters())  # the same tensors, no copy
    base = build_model(make_cfg().model, "fp32", CPU, seed=0).model.eval()
    with torch.no_grad():
        want = SequenceLogProbs(base, 16)(*inputs(batch))[0]
        got = ref(*inputs(batch))[0]
        on = SequenceLogProbs(model, 16)(*inputs(batch))[0]
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert not torch.allclose(on, want)  # with the adapters on (B != 0) the policy differs


def _hand_lora_logps(base, lora: dict[str, tuple[torch.Tensor, torch.Tensor]], scale: float, batch):
    """Summed response log-probs of ``base`` with ``W x + scale * B A x`` on the named linears,
    written out with forward hooks and plain matmuls (no peft), full-vocabulary log-softmax."""
    handles = []
    for name, (a, b) in lora.items():
        module = base.get_submodule(name)
        handles.append(module.register_forward_hook(
            lambda m, args, out, a=a, b=b: out + scale * (args[0] @ a.t()) @ b.t()))
    try:
        logits = base(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                      position_ids=batch.position_ids).logits.float()
    finally:
        for h in handles:
            h.remove()
    token = logits[:, :-1].log_softmax(-1).gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    return (token * batch.response_mask[:, 1:]).sum(-1)


def test_lora_gradients_match_a_hand_written_lora_dpo():
    model, peft_model = lora_model(r=4, alpha=8.0)
    batch = batch_of()
    pairs = batch.pairs
    logps = SequenceLogProbs(model, 16)(*inputs(batch))[0]
    with torch.no_grad():
        ref = AdaptersOff(SequenceLogProbs(model, 16), peft_model)(*inputs(batch))[0]
    from dpo_sweep.train.loss import dpo_loss

    losses, _, _ = dpo_loss(logps[:pairs], logps[pairs:], ref[:pairs], ref[pairs:], BETA)
    losses.mean().backward()
    got = {n.split("base_model.model.")[-1]: p.grad for n, p in peft_model.named_parameters() if p.requires_grad}

    base = build_model(make_cfg().model, "fp32", CPU, seed=0).model.train()
    for p in base.parameters():
        p.requires_grad_(False)
    lora = {}
    for name, m in model.named_modules():
        if hasattr(m, "lora_A") and "default" in getattr(m, "lora_A", {}):
            lora[name] = (m.lora_A["default"].weight.detach().clone().requires_grad_(True),
                          m.lora_B["default"].weight.detach().clone().requires_grad_(True))
    assert len(lora) == 4 * len(DEFAULT_LORA_TARGETS)
    pol = _hand_lora_logps(base, lora, 8.0 / 4, batch)
    with torch.no_grad():
        ref_hand = _hand_lora_logps(base, {}, 0.0, batch)
    torch.testing.assert_close(ref_hand, ref, rtol=1e-5, atol=1e-5)
    margin = (pol[:pairs] - ref_hand[:pairs]) - (pol[pairs:] - ref_hand[pairs:])
    (-F.logsigmoid(BETA * margin)).mean().backward()
    for name, (a, b) in lora.items():
        torch.testing.assert_close(got[f"{name}.lora_A.default.weight"], a.grad, rtol=1e-4, atol=1e-7, msg=name)
        torch.testing.assert_close(got[f"{name}.lora_B.default.weight"], b.grad, rtol=1e-4, atol=1e-7, msg=name)
    assert all(p.grad is None for n, p in peft_model.named_parameters() if "lora_" not in n)  # base frozen


def test_lora_targets_pick_the_adapted_layers_and_unknown_ones_are_refused():
    model, _ = lora_model(targets=("q_proj", "v_proj"))
    adapted = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if hasattr(m, "lora_A")}
    assert adapted == {"q_proj", "v_proj"}
    fresh = build_model(make_cfg().model, "fp32", CPU, seed=0).model
    with pytest.raises(UserError, match=r"train.lora_targets: qkv_proj is no linear layer.*allowed: down_proj"):
        apply_adapter(fresh, TrainSpec(adapter="lora", lora_targets=("q_proj", "qkv_proj")))


def test_lm_head_is_refused_as_a_lora_target():
    with pytest.raises(ValueError, match="lm_head and embed_tokens cannot take adapters"):
        TrainSpec(adapter="lora", lora_targets=("q_proj", "lm_head"))


def test_cuda_levers_are_refused_on_the_cpu_with_a_reason():
    for train in (TrainSpec(adapter="qlora"), TrainSpec(optimizer="adamw_8bit"), TrainSpec(optimizer="adamw_4bit")):
        with pytest.raises(UserError, match="runs on a CUDA GPU only"):
            adapters.refuse_cpu_levers(train, CPU)
    adapters.refuse_cpu_levers(TrainSpec(adapter="lora"), CPU)  # LoRA runs anywhere
    params = (torch.nn.Parameter(torch.zeros(3)),)
    with pytest.raises(UserError, match="optimizer: adamw_8bit runs on a CUDA GPU only"):
        build_optimizer(params, TrainSpec(optimizer="adamw_8bit"), CPU)


def test_a_missing_package_names_its_pip_install(monkeypatch):
    real = adapters.importlib.util.find_spec
    monkeypatch.setattr(adapters.importlib.util, "find_spec", lambda name: None if name == "peft" else real(name))
    fresh = build_model(make_cfg().model, "fp32", CPU, seed=0).model
    with pytest.raises(UserError, match=r"train.adapter: lora needs the peft package.*pip install peft"):
        apply_adapter(fresh, TrainSpec(adapter="lora"))


def test_full_fine_tuning_has_no_adapter_and_its_reference_is_a_copy():
    fresh = build_model(make_cfg().model, "fp32", CPU, seed=0).model
    assert apply_adapter(fresh, TrainSpec()) is None
    assert all(p.requires_grad for p in fresh.parameters())


def test_qlora_base_is_nf4_and_step_one_is_ln2():
    """The QLoRA wiring on the CPU (torchao's NF4 runs there; trials refuse it, see above)."""
    pytest.importorskip("torchao")
    model = build_model(make_cfg().model, "fp32", CPU, seed=0).model
    before = copy.deepcopy(model)
    peft_model = adapters.apply_adapter(model, TrainSpec(adapter="qlora", lora_r=4))
    nf4 = [n for n, p in model.named_parameters() if type(p).__name__ == "NF4Tensor"]
    assert nf4 and all("lora_" not in n for n in nf4)  # tiny shapes: the blocks that divide (q/o/mlp)
    assert all(type(m.weight).__name__ != "NF4Tensor" for m in (model.lm_head, model.model.embed_tokens))
    batch = batch_of()
    pairs = batch.pairs
    logps = SequenceLogProbs(model, 16)(*inputs(batch))[0]
    with torch.no_grad():
        ref = AdaptersOff(SequenceLogProbs(model, 16), peft_model)(*inputs(batch))[0]
        orig = SequenceLogProbs(before.eval(), 16)(*inputs(batch))[0]
    torch.testing.assert_close(logps.detach(), ref, rtol=0, atol=0)  # lora_B = 0: policy = quantised base
    assert not torch.allclose(ref, orig)  # and the quantised base is not the original model
    from dpo_sweep.train.loss import dpo_loss

    losses, _, _ = dpo_loss(logps[:pairs], logps[pairs:], ref[:pairs], ref[pairs:], BETA)
    assert float(losses.mean().detach()) == pytest.approx(math.log(2), abs=1e-6)
    losses.mean().backward()
    grads = [p.grad for n, p in model.named_parameters() if "lora_A" in n or "lora_B" in n]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("lever", ["adapter=qlora", "optimizer=adamw_8bit"])
def test_cuda_levers_exit_2_with_one_line_on_a_machine_without_a_gpu(tmp_path, capsys, monkeypatch, lever):
    from dpo_sweep.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(adapters.importlib.util, "find_spec", lambda name: object())  # torchao "installed"
    rc = main(["trial", "search_spaces/quickstart.yaml", "--set", lever, "--output", str(tmp_path / "t")])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "runs on a CUDA GPU only (torchao) and this machine has none" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("lever", ["adapter=qlora", "optimizer=adamw_8bit"])
def test_validate_predicts_cuda_levers_on_a_machine_without_a_gpu_and_says_what_running_needs(capsys, monkeypatch,
                                                                                                lever):
    from dpo_sweep.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(adapters.importlib.util, "find_spec", lambda name: object())  # torchao "installed"
    assert main(["validate", "search_spaces/quickstart.yaml", "--set", lever]) == 0
    out = capsys.readouterr().out
    assert ("runs on a CUDA GPU only (torchao) and this machine has none; use adapter: lora or full and optimizer: "
            "adamw here, or run on a GPU (validate predicts it here; only running it needs that)") in out
    assert "predicted peak (GB)" in out


@pytest.mark.parametrize("command", ["validate", "trial"])
def test_a_missing_torchao_names_its_pip_install(tmp_path, capsys, monkeypatch, command):
    """trial refuses it (exit 2); validate predicts and says so (exit 0)."""
    from dpo_sweep import preflight
    from dpo_sweep.cli import main

    real = preflight.importlib.util.find_spec
    monkeypatch.setattr(preflight.importlib.util, "find_spec", lambda name: None if name == "torchao" else real(name))
    args = [command, "search_spaces/quickstart.yaml", "--set", "optimizer=adamw_4bit"]
    rc = main(args + (["--output", str(tmp_path / "t")] if command == "trial" else []))
    captured = capsys.readouterr()
    said = captured.err if command == "trial" else captured.out
    assert rc == (2 if command == "trial" else 0)
    assert "train.optimizer: adamw_4bit needs the torchao package" in said and "pip install torchao" in said


def test_an_optimizer_with_a_tensor_lr_still_writes_a_number(monkeypatch, tmp_path):
    """torchao's low-bit AdamW keeps each group's lr as a tensor, which LambdaLR then reports: the
    step rows must still carry a float (steps.csv is read back as numbers)."""
    from dpo_sweep import records
    from dpo_sweep.train import setup as setup_mod

    def tensor_lr_adamw(params, train, device):
        return torch.optim.AdamW(params, lr=torch.tensor(train.lr), foreach=False)

    monkeypatch.setattr(setup_mod, "build_optimizer", tensor_lr_adamw)
    out = run_trial(make_cfg(micro_batch=2, steps=2, lr_schedule="linear"), log=None)
    assert out.result.status == "ok", out.result.error
    assert all(type(s.lr) is float for s in out.steps)
    records.write_steps(tmp_path, out.steps)
    assert all(float(row["lr"]) >= 0 for row in records.read_csv_rows(tmp_path / "steps.csv"))
