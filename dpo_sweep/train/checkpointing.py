"""Activation-checkpoint levels, applied per decoder layer (docs/contracts.md#activation-checkpoint-levels).

Every region is ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``: its saved
tensors are dropped after the forward and rebuilt by re-running the region in backward, with
the RNG and autocast state of the first run, so gradients are identical to ``none`` (the tests
check it for every level). What each level recomputes in backward, for one decoder layer:

========  ====================================================================================
level     regions
========  ====================================================================================
none      nothing
L1        the MLP sub-block - the family's own MLP forward (gate/up projections, activation,
          product, down projection; an MoE's router, experts and shared expert): frees the
          ``intermediate_size``-wide tensors per token that dominate a layer's memory
L2        L1, plus the attention sub-block - the family's own attention forward (projections,
          q/k norms, rotary positions, soft-capping, sinks, o projection) - as a second, separate
          region. The attention kernel itself is *not* re-run: a selective-checkpoint policy
          keeps the kernel's outputs (its output and log-sum-exp), so backward recomputes
          everything else. Frees q, k, v and the o-projection input
L3        L2, plus each input projection of the attention (q, k, v; a fused qkv; MLA's down and
          up projections) as its own (nested) region inside the attention region. Their outputs
          are already recomputed under L2, so L3 can only lower the transient peak while one
          layer's attention backward runs; the benchmarks measure what that is worth
full      the whole decoder layer (norms included), as Hugging Face's
          ``gradient_checkpointing_enable()`` does
L4        refused at validation: a boundary inside RMSNorm or softmax (see core/levels.py: REFUSED_LEVELS)
========  ====================================================================================

The L2/L3 policy can keep only a kernel that is one torch op (sdpa's fused kernels, flash-attn's
custom ops: :data:`KERNEL_OP_NAMES`). Eager attention (matmul, softmax, matmul) is refused with
L2/L3 at validation (``trial_facts.refused_attention``), and an attention forward under L2/L3 in which
the policy kept no kernel op raises instead of silently recomputing the attention.

Levels L1-L3 wrap the ``forward`` of each layer's MLP and attention instance, found by
models/family.py in the model's own modules (Llama's ``mlp`` / ``self_attn``, GPT-2's ``mlp`` /
``attn`` at ``transformer.h``, GPT-NeoX's ``attention``, ...): the family's maths runs unchanged
inside the regions, so each level is exact for every family it accepts; ``validate`` refuses a level
whose region a family lacks (``Family.refused_level``). ``full`` uses the model's own
gradient-checkpointing switch. The reference model is never checkpointed.
Apply a level after the model is on its device (RNG state is recorded per device).
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from dpo_sweep.config import CHECKPOINT_LEVELS
from dpo_sweep.models.family import family_of, find_layers, input_projections
from dpo_sweep.core.levels import Level
from dpo_sweep.core.trial_facts import refused_attention

#: Substrings of the attention-kernel operators whose outputs L2/L3 keep instead of re-running:
#: sdpa's fused kernels (``aten._scaled_dot_product_{flash,efficient,cudnn}_attention`` on CUDA,
#: ``..._flash_attention_for_cpu`` on CPU), the raw aten kernels, and flash-attn's torch custom ops
#: (``flash_attn::_flash_attn_forward`` / ``_flash_attn_varlen_forward``, which transformers'
#: flash_attention_2 calls). The op names are what the policy sees (``str(op)``).
KERNEL_OP_NAMES = ("scaled_dot_product", "flash_attn", "_flash_attention_forward", "_efficient_attention",
                   "_cudnn_attention")


def _keep_attention_kernel(kept: list[str], ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    name = str(op)
    if any(k in name for k in KERNEL_OP_NAMES):
        kept.append(name)
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def _kernel_kept_context(kept: list[str]) -> Any:
    """The selective-checkpoint contexts of one attention region; ``kept`` collects the kernel ops
    whose outputs the forward kept (the policy is consulted in the forward only)."""
    return create_selective_checkpoint_contexts(functools.partial(_keep_attention_kernel, kept))


def _kernel_not_kept(level: str, attn_implementation: str) -> str:
    return refused_attention(level, attn_implementation) or (
        f"{level}: the attention ({attn_implementation}) ran no kernel op that the selective-checkpoint "
        f"policy knows ({', '.join(KERNEL_OP_NAMES)}), so backward would silently re-run it (sdpa's math "
        "fallback, or a flash-attn without torch custom ops); use sdpa on a fused kernel, or L1 or full"
    )


def _checkpointed(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return checkpoint(fn, *args, use_reentrant=False, **kwargs)


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder layers of a Hugging Face causal LM (``model.layers``, GPT-2's ``transformer.h``)."""
    return find_layers(model)[1]


def _attention_region(original: Callable[..., Any], level: str, attn_implementation: str) -> Callable[..., Any]:
    """The family's own attention ``forward`` as one region whose attention kernel's outputs are kept
    (everything else in it - projections, norms, rotary, soft-capping - is recomputed in backward)."""

    @functools.wraps(original)
    def forward(*args: Any, **kwargs: Any) -> Any:
        kept: list[str] = []
        out = _checkpointed(original, *args, context_fn=functools.partial(_kernel_kept_context, kept), **kwargs)
        # Under no_grad checkpoint runs the region plainly (no policy, nothing saved): nothing to check.
        if torch.is_grad_enabled() and not kept:
            raise ValueError(_kernel_not_kept(level, attn_implementation))
        return out

    return forward


def _wrap_forward(module: nn.Module, **checkpoint_kwargs: Any) -> None:
    original = module.forward

    @functools.wraps(original)
    def forward(*args: Any, **kwargs: Any) -> Any:
        return _checkpointed(original, *args, **checkpoint_kwargs, **kwargs)

    module.forward = forward


def apply_checkpoint_level(model: nn.Module, level: str) -> None:
    """Turn on one checkpoint level for every decoder layer of ``model`` (in place)."""
    if level not in CHECKPOINT_LEVELS:
        raise ValueError(f"checkpoint level {level!r}; allowed: {', '.join(CHECKPOINT_LEVELS)}")
    wrapped = Level(level).regions
    if wrapped.layer:
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x renamed it
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        return
    if not wrapped.mlp:
        return  # none
    family = family_of(model)
    refused = family.refused() or family.refused_level(level)
    if refused:  # validate refuses these before any trial (preflight.check_models)
        raise ValueError(refused)
    attn_implementation = getattr(model.config, "_attn_implementation", None) or "sdpa"
    for layer in decoder_layers(model):
        _wrap_forward(getattr(layer, family.mlp))
        if wrapped.attention:
            attn = getattr(layer, family.attention)
            if wrapped.qkv:
                for _, proj in input_projections(attn):
                    _wrap_forward(proj)
            attn.forward = _attention_region(attn.forward, level, attn_implementation)
