"""Tiny checkpoint folders of the model families users bring, saved as a user saves them.

``save_family_checkpoint(model_type, folder)`` writes ``config.json``, random weights and the
byte-level tokenizer with ``save_pretrained``: what ``model: {name_or_path: folder}`` reads.
``head_scale`` multiplies the output head so that a head transform (soft-capping, logit scales)
moves log-probs by far more than rounding; ``dropout`` sets every dropout probability the
family's config has.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

#: Sizes every family shares (a 2-layer model of hidden 64, 4 heads of 16, vocabulary 512).
_COMMON = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=512, max_position_embeddings=512, tie_word_embeddings=False)

#: model_type -> config keyword arguments over _COMMON (None: the family's own names instead).
FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {},
    "qwen2": {},
    "qwen3": dict(head_dim=16),
    "mistral": dict(head_dim=16, sliding_window=None),
    "gemma": dict(head_dim=16),
    "gemma2": dict(head_dim=16, final_logit_softcapping=30.0, attn_logit_softcapping=50.0,
                   query_pre_attn_scalar=16, sliding_window=32),
    "gemma3_text": dict(head_dim=16, query_pre_attn_scalar=16, sliding_window=32),
    "phi3": {},
    "olmo2": {},
    "granite": dict(logits_scaling=4.0, embedding_multiplier=2.0, residual_multiplier=0.5,
                    attention_multiplier=0.25),
    "cohere": dict(logit_scale=0.25, use_qk_norm=False),
    "gpt_neox": dict(rotary_pct=0.25, use_parallel_residual=True),
    "gpt2": None,
    "stablelm": dict(partial_rotary_factor=0.25),
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2),
    "qwen2_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                      shared_expert_intermediate_size=48),
    "qwen3_moe": dict(head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32),
    "smollm3": dict(no_rope_layer_interval=2),
    # a head_dim per layer (sliding 16, global 32) and per-layer inputs
    "gemma4_text": dict(head_dim=16, global_head_dim=32, sliding_window=32, hidden_size_per_layer_input=16,
                        vocab_size_per_layer_input=512),
}

#: (model_type, level) -> a phrase of the refusal: the levels a family cannot take exactly (Gemma-2's
#: soft-capped attention runs on eager only, whose matmul/softmax L2/L3's policy cannot keep).
REFUSED_LEVELS = {("gemma2", "L2"): "eager", ("gemma2", "L3"): "eager"}

#: State-space / linear-attention hybrids, refused whole by validate (models/family.py).
HYBRIDS: dict[str, dict[str, Any]] = {
    "falcon_h1": dict(head_dim=16, mamba_d_ssm=64, mamba_n_heads=8, mamba_d_head=8, mamba_d_state=16,
                      mamba_chunk_size=16),
    "granitemoehybrid": dict(num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=96,
                             mamba_n_heads=8, mamba_d_head=16, mamba_d_state=16, mamba_chunk_size=16,
                             layer_types=["mamba", "attention"]),
    "qwen3_next": dict(head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                       shared_expert_intermediate_size=48, linear_num_value_heads=4, linear_num_key_heads=2,
                       linear_key_head_dim=16, linear_value_head_dim=16, layer_types=["linear_attention", "full_attention"]),
}

_GPT2 = dict(n_embd=64, n_layer=2, n_head=4, n_inner=96, n_positions=512, vocab_size=512, tie_word_embeddings=False)

#: Config attribute names that hold a dropout probability, across families.
DROPOUT_KEYS = ("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop",
                "hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout", "embed_dropout",
                "resid_dropout")


def family_config(model_type: str, dropout: float = 0.0) -> Any:
    from transformers import AutoConfig

    own = {**FAMILIES, **HYBRIDS}[model_type]
    kw = dict(_GPT2) if own is None else {**_COMMON, **own}
    # The byte-level tokenizer's special ids (256-258), inside every family's vocabulary.
    cfg = AutoConfig.for_model(model_type, bos_token_id=256, eos_token_id=257, pad_token_id=258, **kw)
    if dropout:
        for key in DROPOUT_KEYS:
            if hasattr(cfg, key):
                setattr(cfg, key, dropout)
    return cfg


def save_family_checkpoint(model_type: str, folder: Path | str, *, head_scale: float = 1.0,
                           dropout: float = 0.0, seed: int = 0) -> Path:
    """A random-initialised ``model_type`` checkpoint folder with the byte-level tokenizer."""
    from transformers import AutoModelForCausalLM

    from dpo_sweep.train.tokenizer import byte_level_tokenizer

    folder = Path(folder)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(family_config(model_type, dropout))
    if head_scale != 1.0:
        with torch.no_grad():
            model.get_output_embeddings().weight.mul_(head_scale)
    model.save_pretrained(folder)
    byte_level_tokenizer().save_pretrained(folder)
    return folder


def family_model(model_type: str, device: str = "meta") -> Any:
    """The family's tiny model, dropout off, on sdpa where transformers allows it (else its own
    attention: Gemma-2's soft-capping runs on eager only)."""
    from transformers import AutoModelForCausalLM

    cfg = family_config(model_type)
    for key in DROPOUT_KEYS:
        if hasattr(cfg, key):
            setattr(cfg, key, 0.0)
    with torch.device(device):
        try:
            return AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
        except ValueError:
            return AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")


def support_table() -> str:
    """docs/trainer.md's table of families, from the code: what models/family.py reads of each
    family's tiny model, the levels it refuses, trial_facts' liger-kernel families."""
    from dpo_sweep.config import CHECKPOINT_LEVELS
    from dpo_sweep.models.family import family_of
    from dpo_sweep.core.trial_facts import LIGER_ARCHS, refused_attention

    lines = ["| model_type | checkpoint levels | LoRA targets (`auto`) | liger-kernel | lean ops |",
             "| --- | --- | --- | --- | --- |"]
    for mt in (*FAMILIES, *HYBRIDS):
        model = family_model(mt)
        fam = family_of(model)
        if fam.refused():
            lines.append(f"| `{mt}` | refused whole: a hybrid ({', '.join(fam.mixers)}) | - | - | - |")
            continue
        attn = model.config._attn_implementation
        levels = [lv for lv in CHECKPOINT_LEVELS if not (fam.refused_level(lv) or refused_attention(lv, attn))]
        refused = [lv for lv in CHECKPOINT_LEVELS if lv not in levels]
        text = ", ".join(levels) + (f" ({', '.join(refused)}: its {attn} attention)" if refused else "")
        targets = ", ".join(fam.linears) + (f"; experts ({', '.join(fam.expert_weights)}) frozen"
                                            if fam.expert_weights else "")
        lines.append(f"| `{mt}` | {text} | {targets} | {'yes' if mt in LIGER_ARCHS else '-'} | {fam.lean_ops()} |")
    return "\n".join(lines)


if __name__ == "__main__":  # python tests/family_checkpoints.py: the table for docs/trainer.md
    print(support_table())
