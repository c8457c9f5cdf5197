"""The memory model's saved activations per family against what autograd really saves.

On a tiny fp32 model of each family (tests/family_checkpoints.py), the decoder's forward runs under
``torch.autograd.graph.saved_tensors_hooks``, which sees every tensor autograd keeps for backward;
their storages, each counted once and the weights left out, are the measured bytes. The
prediction is ``plan.memory.decoder_saved_bytes_per_token`` x tokens, from the shape read off the
checkpoint folder (plan/shape.py), as the planner reads it. Levels ``none``, ``L1`` and ``full``
(L2/L3's kept kernel outputs live in the selective-checkpoint cache, which the hooks do not see),
stock modules and lean ops."""
from __future__ import annotations

import pytest
import torch

from dpo_sweep.config import ModelSpec
from dpo_sweep.plan import memory
from dpo_sweep.plan.shape import built_shape
from dpo_sweep.train.checkpointing import apply_checkpoint_level
from dpo_sweep.train.lean import apply_lean_ops
from family_checkpoints import FAMILIES, family_model, save_family_checkpoint

#: measured / predicted within this (the tiny models run at 0.97 - 1.03; per-token terms the model
#: leaves out - position ids, RoPE tables of partial rotary - weigh most at hidden 64).
TOLERANCE = 0.05
TOKENS = 256  # per row, 2 rows: per-token terms dominate; past Gemma-3's 32-token sliding window


def _measured_bytes(model, ids) -> int:
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if st.data_ptr() not in weights:
            storages[st.data_ptr()] = max(storages.get(st.data_ptr(), 0), st.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.base_model(input_ids=ids, use_cache=False)
    return sum(storages.values())


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("memory-families")
    return {mt: save_family_checkpoint(mt, root / mt) for mt in FAMILIES}


#: What the memory model leaves out: Gemma-4's per-layer inputs (a gate, a projection and a norm per
#: layer) and its v norm - measured 11% above the prediction at these sizes.
UNMODELLED = ("gemma4_text",)
CASES = ([(mt, "none", False) for mt in FAMILIES if mt not in UNMODELLED]
         + [(mt, level, lean) for mt in ("qwen3", "phi3", "gpt2", "qwen2_moe")
            for level, lean in (("L1", False), ("full", False), ("none", True))])


@pytest.mark.parametrize(("model_type", "level", "lean"), CASES)
def test_saved_activations_match_the_prediction(model_type, level, lean, folders):
    spec = ModelSpec(name_or_path=str(folders[model_type]))
    torch.manual_seed(0)
    model = family_model(model_type, device="cpu").train()
    attn = model.config._attn_implementation  # sdpa, or eager where the family needs it (Gemma-2)
    if lean:
        apply_lean_ops(model)
    apply_checkpoint_level(model, level)
    ids = torch.randint(0, 250, (2, TOKENS), generator=torch.Generator().manual_seed(0))
    measured = _measured_bytes(model, ids)
    per_token = memory.decoder_saved_bytes_per_token(built_shape(spec), memory.element_bytes(spec, "fp32"), level,
                                                     lean=lean, attn=attn, seq_len=TOKENS)
    predicted = ids.numel() * per_token
    assert abs(measured / predicted - 1) <= TOLERANCE, f"{model_type} {level} lean={lean}: measured {measured} B, " \
                                                       f"predicted {predicted:.0f} B"


def test_the_shape_reads_each_family_from_its_modules(folders):
    """What the family terms rest on, read from the folders (not from a table of model types)."""
    shape = {mt: built_shape(ModelSpec(name_or_path=str(folders[mt]))) for mt in
             ("llama", "phi3", "gpt2", "gpt_neox", "cohere", "gemma2", "gemma3_text", "qwen3", "mixtral", "qwen2_moe")}
    assert shape["phi3"].fused_qkv and shape["phi3"].intermediate == 96 and shape["phi3"].rope_cat
    assert shape["gpt2"].fused_qkv and not shape["gpt2"].rope and shape["gpt2"].act_saved == 4
    assert not shape["gpt2"].gated_mlp and shape["gpt2"].norm_kind == "layer"
    assert shape["gpt_neox"].act_saved == 1 and shape["cohere"].norms_per_layer == 1
    assert shape["cohere"].norm_kind == "centered"
    assert shape["gemma2"].norms_per_layer == 4 and shape["gemma3_text"].sliding_window == 32
    assert shape["qwen3"].qk_norm and not shape["llama"].qk_norm
    assert (shape["mixtral"].experts_per_token, shape["mixtral"].n_experts, shape["mixtral"].intermediate) == (2, 4, 0)
    assert shape["qwen2_moe"].shared_gate and shape["qwen2_moe"].intermediate == 48
    assert shape["qwen2_moe"].expert_intermediate == 32
