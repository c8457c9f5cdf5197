"""Every checkpoint level gives the same loss and gradients as none (fp32, fixed seed); L2/L3 keep
the attention kernel (no re-run in backward), and refuse attention they cannot keep (eager)."""
import copy
import pytest
import torch
from torch.utils.checkpoint import CheckpointPolicy

from dpo_sweep.config import ModelSpec
from dpo_sweep.train.batching import collate
from dpo_sweep.train.checkpointing import _keep_attention_kernel, apply_checkpoint_level
from dpo_sweep.train.data import TokenizedPair
from dpo_sweep.train.logprobs import SequenceLogProbs
from dpo_sweep.train.loss import dpo_loss
from dpo_sweep.train.lean import apply_lean_ops
from dpo_sweep.train.model import build_model, freeze_reference
from testkit import AtenOps, is_attention_forward, ragged_pairs

CPU = torch.device("cpu")


def logps_of(model, batch, pad: bool = True, chunk: int = 16) -> torch.Tensor:
    mask = batch.attention_mask if pad else None
    return SequenceLogProbs(model, chunk)(batch.input_ids, mask, batch.position_ids, batch.response_mask)[0]


def checkpointed(model, level: str, lean: bool = False):
    """A train-mode copy of ``model`` with ``level`` (and lean ops) applied."""
    m = copy.deepcopy(model)
    if lean:
        apply_lean_ops(m)
    apply_checkpoint_level(m, level)
    return m.train()


def batch_of(pad: bool, n: int = 2):
    pairs = ragged_pairs(n) if pad else [TokenizedPair((1,) * 8, (2,) * 6, (3,) * 6)] * 2
    return collate(pairs, list(range(len(pairs))), pad_id=258)


def loss_and_grads(model, ref, batch, pad: bool, chunk: int = 16):
    logps = logps_of(model, batch, pad, chunk)
    with torch.no_grad():
        ref_logps = logps_of(ref, batch, pad, chunk)
    b = batch.pairs
    losses, _, _ = dpo_loss(logps[:b], logps[b:], ref_logps[:b], ref_logps[b:], 0.1)
    loss = losses.mean()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.fixture(scope="module")
def models():
    base = build_model(ModelSpec(preset="tiny-llama"), "fp32", CPU, seed=0).model
    # Perturb the policy so it differs from the reference (non-zero DPO gradients everywhere).
    policy = copy.deepcopy(base)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return policy, freeze_reference(base)


@pytest.mark.parametrize("lean", [False, True], ids=["stock", "lean"])
@pytest.mark.parametrize("pad", [True, False], ids=["padded", "unpadded"])
@pytest.mark.parametrize("level", ["L1", "L2", "L3", "full"])
def test_level_matches_none(models, level, pad, lean):
    policy, ref = models
    batch = batch_of(pad, n=4)
    want_loss, want_grads = loss_and_grads(copy.deepcopy(policy).train(), ref, batch, pad)
    got_loss, got_grads = loss_and_grads(checkpointed(policy, level, lean), ref, batch, pad)
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-6, atol=1e-7)
    assert got_grads.keys() == want_grads.keys() and len(got_grads) == len(list(policy.parameters()))
    for name in want_grads:
        torch.testing.assert_close(got_grads[name], want_grads[name], rtol=1e-5, atol=1e-7, msg=name)


def test_levels_really_recompute(models):
    """Guard against a level silently doing nothing: count forward calls of one MLP."""
    policy, ref = models
    batch = batch_of(pad=True)
    for level, mlp_calls in (("none", 1), ("L1", 2), ("L2", 2), ("full", 2)):
        m = checkpointed(policy, level)
        calls = []
        mlp = m.model.layers[0].mlp
        mlp.gate_proj.register_forward_pre_hook(lambda *a: calls.append(1))
        loss_and_grads(m, ref, batch, pad=True)
        assert len(calls) == mlp_calls, level




@pytest.mark.parametrize("lean", [False, True], ids=["stock", "lean"])
@pytest.mark.parametrize("pad", [True, False], ids=["padded", "unpadded"])
@pytest.mark.parametrize("level, reruns_per_layer", [("none", 0), ("L1", 0), ("L2", 0), ("L3", 0), ("full", 1)])
def test_attention_kernel_rerun_in_backward_only_under_full(models, level, reruns_per_layer, pad, lean):
    """The aten ops that run during loss.backward(): a forward attention kernel among them is a
    recompute. L2/L3 keep the kernel's outputs (zero re-runs); full re-runs it in every layer."""
    m = checkpointed(models[0], level, lean)
    logps = logps_of(m, batch_of(pad), pad)
    ops = AtenOps()
    with ops:
        logps.sum().backward()
    layers = m.config.num_hidden_layers
    assert sum(is_attention_forward(n) for n in ops.names) == reruns_per_layer * layers, level
    # The mode sees the kernels: one attention backward per layer, whatever the level.
    assert sum("scaled_dot_product" in n and "backward" in n for n in ops.names) == layers


def test_l2_recomputes_the_projections(models):
    policy, ref = models
    m = checkpointed(policy, "L2")
    q_calls = []
    m.model.layers[0].self_attn.q_proj.register_forward_hook(lambda *a: q_calls.append(1))
    loss_and_grads(m, ref, batch_of(pad=True), pad=True)
    assert len(q_calls) == 2  # forward + recompute


# What the policy sees on an H200 (sdpa's CUDA kernels, flash-attn's custom ops) cannot run here:
# the op names are checked instead. flash-attn registers flash_attn::_flash_attn_forward and
# flash_attn::_flash_attn_varlen_forward; str() of a custom op is "namespace.name.overload".
KEPT_OPS = [torch.ops.aten._scaled_dot_product_flash_attention.default,
            torch.ops.aten._scaled_dot_product_efficient_attention.default,
            torch.ops.aten._scaled_dot_product_cudnn_attention.default,
            torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
            torch.ops.aten._scaled_dot_product_fused_attention_overrideable.default,
            torch.ops.aten._flash_attention_forward.default,
            torch.ops.aten._efficient_attention_forward.default,
            "flash_attn._flash_attn_forward.default", "flash_attn._flash_attn_varlen_forward.default"]


@pytest.mark.parametrize("op", KEPT_OPS, ids=str)
def test_policy_keeps_every_fused_attention_kernel(op):
    kept = []
    assert _keep_attention_kernel(kept, None, op) is CheckpointPolicy.MUST_SAVE
    assert kept == [str(op)]


@pytest.mark.parametrize("op", [torch.ops.aten.mm.default, torch.ops.aten.bmm.default,
                                torch.ops.aten._softmax.default, torch.ops.aten.mul.Tensor], ids=str)
def test_policy_recomputes_everything_else(op):
    kept = []
    assert _keep_attention_kernel(kept, None, op) is CheckpointPolicy.PREFER_RECOMPUTE
    assert kept == []


@pytest.mark.parametrize("level", ["L2", "L3"])
def test_l2_l3_with_eager_attention_refused_at_the_first_forward(level):
    """Eager attention is bmm + softmax + bmm: nothing for the policy to keep. Refused rather
    than silently recomputed (validation refuses it earlier; this guards every other path)."""
    m = build_model(ModelSpec(preset="tiny-llama", attn_implementation="eager"), "fp32", CPU, seed=0).model
    m = checkpointed(m, level)
    with pytest.raises(ValueError, match=f"{level} with attn_implementation eager is refused.*use "
                                         "model.attn_implementation sdpa, flash_attention_2 or auto, or "
                                         "checkpoint_level L1 or full"):
        logps_of(m, batch_of(pad=True))


def test_l2_refused_when_sdpa_falls_back_to_its_math_path(models):
    """sdpa's math path is matmul + softmax ops too: the forward says so instead of recomputing."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    m = checkpointed(models[0], "L2")
    refused = pytest.raises(ValueError, match=r"L2: the attention \(sdpa\) ran no kernel op")
    with sdpa_kernel(SDPBackend.MATH), refused:
        logps_of(m, batch_of(pad=True))


def test_auto_attention_never_resolves_to_eager(monkeypatch):
    """auto is accepted with L2/L3 because it only ever resolves to a kernel implementation."""
    import importlib.util
    import sys
    import types

    from dpo_sweep.core.trial_facts import KERNEL_ATTENTION
    from dpo_sweep.train import model as model_mod

    got = {model_mod.resolve_attn_implementation("auto", CPU)}
    built = build_model(ModelSpec(preset="tiny-llama"), "fp32", CPU, seed=0)
    got |= {built.attn_implementation, built.model.config._attn_implementation}
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    got.add(model_mod.resolve_attn_implementation("auto", cuda))  # no flash-attn installed
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    monkeypatch.setitem(sys.modules, "flash_attn", types.ModuleType("flash_attn"))
    got.add(model_mod.resolve_attn_implementation("auto", cuda))  # flash-attn imports
    assert got == {"sdpa", "flash_attention_2"} and got < set(KERNEL_ATTENTION)


SPACE = """name: eager
model: {preset: tiny-llama, attn_implementation: %s}
data: {synthetic: {pairs: 8, prompt_tokens: 8, response_tokens: 8}}
train: {steps: 2, warmup_steps: 1, max_length: 32, precision: fp32}
search: {micro_batch: [2], checkpoint_level: %s%s}
"""


@pytest.mark.parametrize("attn, levels, models_dim, refused, rc", [
    ("eager", "[none, L2]", "", "L2", 0),  # L2 skipped, none runs
    ("eager", "[L3]", "", "L3", 2),  # nothing left: refused
    ("sdpa", "[L2]", ", model: [tiny-llama, {preset: tiny-llama, attn_implementation: eager}]", "L2", 0),
    ("eager", "[none, L1, full]", "", None, 0),
    ("auto", "[L2, L3]", "", None, 0),
    ("flash_attention_2", "[L2]", "", None, 0),
])
def test_validation_skips_l2_l3_with_eager_attention(tmp_path, capsys, attn, levels, models_dim, refused, rc):
    from dpo_sweep.cli import main

    path = tmp_path / "space.yaml"
    path.write_text(SPACE % (attn, levels, models_dim))
    assert main(["validate", str(path)]) == rc
    out, err = capsys.readouterr()
    if refused is None:
        assert "skipped" not in out, out
        return
    said = err if rc else out
    assert (f"search.checkpoint_level '{refused}': {refused} with attn_implementation eager is refused" in said
            and "use model.attn_implementation sdpa, flash_attention_2 or auto, or checkpoint_level L1 or full"
            in said), said
    assert rc or f"micro_batch 2, checkpoint_level {refused}: search.checkpoint_level" in out, out


def test_l4_and_unknown_refused():
    from dpo_sweep.errors import SpaceError
    from dpo_sweep.space import _check_levels

    with pytest.raises(SpaceError, match="L4 is refused.*use L3 or full"):
        _check_levels(["L4"])
    with pytest.raises(SpaceError, match="allowed: none, L1, L2, L3, full"):
        _check_levels(["L9"])


# --- with LoRA adapters (peft): the levels patch the layers through the peft wrapper ----------

def lora_policy(level: str, lean: bool):
    """The tiny model with LoRA on every decoder linear (B non-zero), ``level`` and lean ops
    applied as build_trial applies them; its peft model switches the adapters."""
    from dpo_sweep.config import TrainSpec
    from dpo_sweep.train.adapters import apply_adapter

    model = build_model(ModelSpec(preset="tiny-llama"), "fp32", CPU, seed=0).model
    peft_model = apply_adapter(model, TrainSpec(adapter="lora", lora_r=4, lora_alpha=8.0))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    if lean:
        apply_lean_ops(model)
    apply_checkpoint_level(model, level)
    return model.train(), peft_model


def lora_loss_and_grads(level: str, lean: bool, batch, pad: bool):
    from dpo_sweep.train.adapters import AdaptersOff

    model, peft_model = lora_policy(level, lean)
    mask = batch.attention_mask if pad else None
    args = (batch.input_ids, mask, batch.position_ids, batch.response_mask)
    logps = SequenceLogProbs(model, 16)(*args)[0]
    with torch.no_grad():
        ref = AdaptersOff(SequenceLogProbs(model, 16), peft_model)(*args)[0]
    b = batch.pairs
    loss = dpo_loss(logps[:b], logps[b:], ref[:b], ref[b:], 0.1)[0].mean()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("lean", [False, True], ids=["stock", "lean"])
@pytest.mark.parametrize("pad", [True, False], ids=["padded", "unpadded"])
@pytest.mark.parametrize("level", ["L1", "L2", "L3", "full"])
def test_level_with_lora_matches_none(level, pad, lean):
    batch = batch_of(pad, n=4)
    want_loss, want_grads = lora_loss_and_grads("none", False, batch, pad)
    got_loss, got_grads = lora_loss_and_grads(level, lean, batch, pad)
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-6, atol=1e-7)
    # Gradients for the adapters only (the base is frozen), two per adapted linear.
    assert got_grads.keys() == want_grads.keys() and len(got_grads) == 2 * 7 * 4
    assert all("lora_" in n for n in got_grads)
    for name in want_grads:
        torch.testing.assert_close(got_grads[name], want_grads[name], rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.parametrize("level, mlp_calls", [("none", 1), ("L1", 2), ("L2", 2), ("full", 2)])
def test_levels_with_lora_really_recompute(level, mlp_calls):
    """The levels find the decoder layers through the peft wrapper: count one MLP's forwards."""
    model, _ = lora_policy(level, lean=False)
    calls = []
    # A pre-hook on the region's first linear: non-reentrant recompute stops once the last saved
    # tensor it needs is rebuilt, so the region's last module may never finish its re-run.
    model.model.layers[0].mlp.gate_proj.register_forward_pre_hook(lambda *a: calls.append(1))
    batch = batch_of(pad=True)
    logps = SequenceLogProbs(model, 16)(batch.input_ids, batch.attention_mask, batch.position_ids,
                                        batch.response_mask)[0]
    logps.sum().backward()
    assert len(calls) == mlp_calls
