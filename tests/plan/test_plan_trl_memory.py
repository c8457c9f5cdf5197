"""The memory model on ``train.trainer: trl`` trials: stock modules (no lean ops) and TRL's fused head."""
from __future__ import annotations

import pytest

from dpo_sweep.plan import trl_memory
from dpo_sweep.plan.memory import GB, element_bytes, model_saved_bytes_per_token, predict_peak_gb
from dpo_sweep.plan.shape import model_shape
from tests.testkit import make_cfg

ONE_B = {"preset": "llama-3.2-1b"}


def test_fused_head_bytes_by_hand():
    # 1,000 tokens, hidden 64, vocabulary 512, bf16: float32 grads of the hidden states (256,000) and
    # the lm_head weight (131,072), one 1,000 x 512 tile in bf16 (1,024,000), five float32 outputs
    # per token (20,000), the weight's own gradient in bf16 (65,536)
    assert trl_memory.fused_head_backward_bytes(1000, 64, 512, 2, 2) == 1_496_608
    # a tile is at most 4,096 tokens x 32,768 vocabulary entries
    assert trl_memory.fused_head_tile_bytes(10_000, 128_256, 2) == 4096 * 32768 * 2
    assert trl_memory.fused_head_forward_bytes(1000, 512, 4) == 1000 * 512 * 4 + 20_000


def test_a_trl_trial_is_predicted_with_stock_modules_and_the_fused_head():
    kw = dict(micro_batch=4, grad_acc=2, precision="bf16", max_length=1024, device="cuda")
    native = predict_peak_gb(make_cfg(model=ONE_B, resources={"use_gpu": True}, **kw), device="cuda")
    trl = predict_peak_gb(make_cfg(model=ONE_B, resources={"use_gpu": True}, trainer="trl", **kw), device="cuda")
    cfg = make_cfg(model=ONE_B, resources={"use_gpu": True}, trainer="trl", **kw)
    s, b = model_shape(cfg.model), element_bytes(cfg.model, "bf16")
    tokens = 2 * 4 * 1024
    assert trl.peak_at == "backward start"
    assert trl.activations_gb * GB == pytest.approx(tokens * model_saved_bytes_per_token(s, b, "none", lean=False))
    assert trl.head_gb * GB == pytest.approx(trl_memory.fused_head_backward_bytes(tokens, s.hidden, s.vocab, 2, 2))
    assert trl.activations_gb > native.activations_gb  # the stock modules save more than the lean ones
    assert (trl.weights_gb, trl.grads_gb, trl.optimizer_gb, trl.reference_gb) == \
        (native.weights_gb, native.grads_gb, native.optimizer_gb, native.reference_gb)


def test_lean_ops_does_not_change_a_trl_prediction():
    lean = predict_peak_gb(make_cfg(trainer="trl", micro_batch=2), device="cpu")
    stock = predict_peak_gb(make_cfg(trainer="trl", micro_batch=2, model={"preset": "tiny-llama", "lean_ops": False}),
                            device="cpu")
    assert lean == stock


def test_the_two_trainers_never_share_a_measurement_or_an_oom():
    from dpo_sweep.plan.rules import dominates_in_memory, measurement_key, memory_family

    native, trl = make_cfg(micro_batch=4), make_cfg(micro_batch=4, trainer="trl")
    assert measurement_key(native) != measurement_key(trl) and memory_family(native) != memory_family(trl)
    assert not dominates_in_memory(make_cfg(micro_batch=8, trainer="trl"), native)  # an OOM prunes its own trainer's
    assert dominates_in_memory(make_cfg(micro_batch=8, trainer="trl"), trl)
