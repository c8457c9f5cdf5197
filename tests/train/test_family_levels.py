"""Every checkpoint level a model family accepts gives the loss and gradients of ``none`` (fp32),
on tiny models of the families in tests/family_checkpoints.py; the levels it refuses are refused
by the family's own reading (models/family.py), which ``validate`` asks (tests/test_family_validate.py)."""
from __future__ import annotations

import pytest
import torch

from dpo_sweep.train.checkpointing import apply_checkpoint_level
from dpo_sweep.models.family import family_of
from dpo_sweep.core.trial_facts import refused_attention
from family_checkpoints import FAMILIES, REFUSED_LEVELS, family_model

LEVELS = ("L1", "L2", "L3", "full")
#: fp32, the same ops in another order only where a region is re-run: rounding, nothing more.
TOL = dict(rtol=1e-4, atol=1e-5)


def _model(model_type: str):
    """The family's tiny model in train mode, dropout off (as the trainer runs it), on sdpa - the
    kernel L2/L3 keep - where transformers allows it (Gemma-2's soft-capping needs eager)."""
    torch.manual_seed(0)
    return family_model(model_type, device="cpu").train()


def refusal(model, level: str) -> str | None:
    """Why ``level`` is refused for ``model`` before any trial (what validate answers)."""
    return (family_of(model).refused_level(level)
            or refused_attention(level, model.config._attn_implementation))


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 250, (2, 24), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :5] = 0  # left padding on one row: the masked attention path
    return ids, mask


def _loss_and_grads(model) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    ids, mask = _batch()
    labels = ids.masked_fill(mask == 0, -100)
    loss = model(input_ids=ids, attention_mask=mask, labels=labels, use_cache=False).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.fixture(scope="module")
def reference():
    cache: dict[str, tuple] = {}

    def get(model_type: str):
        if model_type not in cache:
            cache[model_type] = _loss_and_grads(_model(model_type))
        return cache[model_type]
    return get


@pytest.mark.parametrize("model_type", list(FAMILIES))
@pytest.mark.parametrize("level", LEVELS)
def test_every_accepted_level_matches_none(model_type, level, reference):
    model = _model(model_type)
    refused = refusal(model, level)
    assert bool(refused) == ((model_type, level) in REFUSED_LEVELS), refused
    if refused:  # and validate says so: tests/test_family_validate.py
        assert REFUSED_LEVELS[model_type, level] in refused
        return
    apply_checkpoint_level(model, level)
    loss, grads = _loss_and_grads(model)
    want_loss, want_grads = reference(model_type)
    torch.testing.assert_close(loss, want_loss, **TOL)
    assert grads.keys() == want_grads.keys()
    for name, g in grads.items():
        torch.testing.assert_close(g, want_grads[name], **TOL, msg=lambda m: f"{model_type} {level} {name}: {m}")


@pytest.mark.parametrize("model_type", ["qwen3", "smollm3", "phi3", "gpt_neox", "gpt2", "mixtral"])
def test_l2_recomputes_the_family_own_attention(model_type):
    """L2 re-runs the family's attention forward in backward (its projections, norms, rotary), not a
    Llama copy of it: the attention modules' forwards run once more per layer in backward."""
    model = _model(model_type)
    fam = family_of(model)
    calls = []
    for layer in model.base_model.get_submodule(fam.layers_path.split(".")[-1]):
        proj = dict(getattr(layer, fam.attention).named_modules())[fam.qkv[0]]
        proj.register_forward_hook(lambda *a: calls.append(1))
    apply_checkpoint_level(model, "L2")
    ids, mask = _batch()
    loss = model(input_ids=ids, attention_mask=mask, labels=ids, use_cache=False).loss
    forward_calls = len(calls)
    loss.backward()
    assert forward_calls == model.config.num_hidden_layers
    assert len(calls) == 2 * forward_calls


#: model_type -> (lean RMSNorm used, lean SwiGLU used): where the family's module is Llama's.
LEAN = {"llama": (True, True), "qwen3": (True, True), "olmo2": (False, True), "gemma2": (False, False),
        "phi3": (True, False), "cohere": (False, True), "mixtral": (True, False), "falcon_h1": (True, False)}


@pytest.mark.parametrize("model_type", list(LEAN))
def test_lean_ops_replace_only_what_they_compute_exactly(model_type):
    """Lean ops switch a norm or MLP only where its forward is Llama's (read from its code), so the
    model's log-probs and gradients stay its own: Falcon-H1's MLP multipliers, OLMo-2's norm order and
    Gemma's 1 + weight keep their stock modules."""
    from dpo_sweep.train.lean import apply_lean_ops

    model = _model(model_type)
    want_loss, want_grads = _loss_and_grads(model)
    model.zero_grad(set_to_none=True)
    counts = apply_lean_ops(model)
    loss, grads = _loss_and_grads(model)
    torch.testing.assert_close(loss, want_loss, **TOL)
    for name, g in grads.items():
        torch.testing.assert_close(g, want_grads[name], **TOL, msg=lambda m: f"{model_type} {name}: {m}")
    assert (counts["rmsnorm"] > 0, counts["swiglu"] > 0) == LEAN[model_type]
    fam = family_of(model)
    assert (fam.lean_norm, fam.lean_mlp) == LEAN[model_type]


@pytest.mark.parametrize("model_type", ["phi3", "gpt2", "gpt_neox", "qwen2_moe"])
@pytest.mark.parametrize("level", ["L2", "L3"])
def test_lora_auto_targets_the_family_linears_and_levels_stay_exact(model_type, level):
    """``lora_targets: auto`` adapts the family's own projections (fused, Conv1D, shared expert);
    with adapters in place L2/L3 still wrap them (a peft layer is the linear it wraps) and give the
    loss and gradients of ``none``."""
    from dpo_sweep.config import TrainSpec
    from dpo_sweep.train.adapters import apply_adapter

    def adapted():
        model = _model(model_type)
        apply_adapter(model, TrainSpec(adapter="lora", lora_r=4, lora_alpha=8.0))
        with torch.no_grad():  # lora_B is zero at first: make the adapters count in the maths
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.02, generator=torch.Generator().manual_seed(len(name)))
        return model

    plain = adapted()
    fam = family_of(plain)
    adapted_names = {n.split(".lora_A")[0].rsplit(".", 1)[-1] for n, _ in plain.named_parameters() if "lora_A" in n}
    assert adapted_names == set(fam.linears)
    want_loss, want_grads = _loss_and_grads(plain)
    model = adapted()
    apply_checkpoint_level(model, level)
    loss, grads = _loss_and_grads(model)
    torch.testing.assert_close(loss, want_loss, **TOL)
    assert grads.keys() == want_grads.keys() and all("lora_" in n for n in grads)
    for name, g in grads.items():
        torch.testing.assert_close(g, want_grads[name], **TOL, msg=lambda m: f"{model_type} {level} {name}: {m}")
