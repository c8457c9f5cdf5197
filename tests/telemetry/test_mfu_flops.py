"""FLOPs, peak table and MFU against hand-worked numbers."""

from __future__ import annotations

import math

import pytest

from dpo_sweep.core.flops import (
    DecoderShape,
    TokenCounts,
    dpo_step_flops,
    forward_flops,
    mfu,
    recompute_flops,
)
from dpo_sweep.cards import mfu_peak_flops


# A toy decoder: hidden 4, intermediate 8, 2 query heads and 1 kv head of width 2, 3 layers, vocab 10.
TOY = DecoderShape(hidden=4, intermediate=8, n_heads=2, n_kv_heads=1, head_dim=2, n_layers=3, vocab=10)


def test_forward_flops_hand_worked():
    fwd = forward_flops(TOY, TokenCounts(tokens=5, causal_pairs=9, head_rows=2))
    # per token and layer: q 2*4*4, k and v 2*4*2 each, o 2*4*4, gate+up 2*2*4*8, down 2*8*4
    assert (fwd.qkv, fwd.o_proj, fwd.mlp_in, fwd.mlp_down) == (5 * 3 * 64, 5 * 3 * 32, 5 * 3 * 128, 5 * 3 * 64)
    assert fwd.attention == 9 * 3 * 2 * 2 * 4  # per causal pair, layer: q.k and p*v over 2 heads x 2
    assert fwd.head == 2 * 2 * 4 * 10
    assert fwd.total() == 960 + 480 + 1920 + 960 + 432 + 160
    with pytest.raises(ValueError, match="causal_pairs"):
        forward_flops(TOY, TokenCounts(tokens=1, causal_pairs=-1, head_rows=0))


@pytest.mark.parametrize(
    ("level", "lean_mlp", "expected"),
    [
        ("none", False, 0.0),
        ("L1", False, 1920.0),                  # gate and up; down's output is not needed
        ("L1", True, 1920.0 + 960),             # lean ops' MLP function re-runs whole
        ("L2", False, 1920.0 + 960),            # + q, k, v (the attention kernel's outputs kept)
        ("L3", False, 1920.0 + 960),
        ("full", False, 960.0 + 480 + 432 + 1920),  # the layer but its last matmul (down)
        ("full", True, 960.0 + 480 + 432 + 1920 + 960),
    ],
)
def test_recompute_flops_per_level(level, lean_mlp, expected):
    fwd = forward_flops(TOY, TokenCounts(tokens=5, causal_pairs=9, head_rows=2))
    assert recompute_flops(fwd, level, lean_mlp) == expected


def test_dpo_step_flops_hand_worked():
    counts = TokenCounts(tokens=5, causal_pairs=9, head_rows=2)
    total = 4912.0  # the forward above
    # policy: forward + 2 x backward, attention backward 2.5 x; the chunked head re-runs its logits
    policy = total + 2 * (total - 432) + 2.5 * 432 + 160
    got = dpo_step_flops(shape=TOY, counts=counts, level="none", reference="live", chunked_head=True,
                         lean_mlp=False)
    assert got == policy + total
    assert dpo_step_flops(shape=TOY, counts=counts, level="L1", reference="precomputed", chunked_head=False,
                          lean_mlp=False) == policy - 160 + 1920
    with pytest.raises(ValueError, match="L4"):
        dpo_step_flops(shape=TOY, counts=counts, level="L4", reference="live", chunked_head=True, lean_mlp=False)


@pytest.mark.parametrize(
    ("gpu_name", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", 989.4e12),  # the catalog's datasheet rate
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H100 NVL", 835e12),
        ("NVIDIA H200", 790e12),            # measured on this workplace's H200, not the datasheet
        ("NVIDIA GH200 480GB", 989e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA A100 80GB PCIe", 312e12),
        ("NVIDIA A10G", 70e12),
        ("NVIDIA A10", 125e12),
        ("NVIDIA L4", 121e12),
        ("NVIDIA L40S", 362.05e12),
        ("NVIDIA GeForce RTX 4090", 165.2e12),
        ("Tesla V100-SXM2-16GB", None),     # no bf16 tensor cores
        ("Tesla T4", None),
        ("cpu", None),
        ("", None),
    ],
)
def test_mfu_peaks_come_from_the_card_catalog(gpu_name, expected):
    assert mfu_peak_flops(gpu_name) == (None if expected is None else pytest.approx(expected))


def test_mfu_hand_worked():
    # 4e14 FLOPs in 1 s on one H100 SXM: 400 / 989.4 = 0.4042854...
    assert mfu(4e14, 1.0, mfu_peak_flops("NVIDIA H100 80GB HBM3")) == pytest.approx(0.404285426, rel=1e-8)
    # 4e14 in 0.5 s on two H200s: 4e14 / (0.5 * 790e12 * 2)
    assert mfu(4e14, 0.5, mfu_peak_flops("NVIDIA H200"), n_gpus=2) == pytest.approx(0.506329114, rel=1e-8)


@pytest.mark.parametrize(("gpu_name", "step_time_s"),
                         [(None, 1.0), ("cpu", 1.0), ("Tesla T4", 1.0), ("NVIDIA H200", 0.0),
                          ("NVIDIA H200", math.nan), ("NVIDIA H200", math.inf)])
def test_mfu_is_nan_when_unknowable(gpu_name, step_time_s):
    assert math.isnan(mfu(1e12, step_time_s, mfu_peak_flops(gpu_name)))


def test_mfu_refuses_zero_gpus():
    with pytest.raises(ValueError, match="n_gpus"):
        mfu(1e12, 1.0, mfu_peak_flops("NVIDIA H200"), n_gpus=0)


def test_dpo_step_flops_with_a_frozen_base_has_no_weight_gradients():
    counts = TokenCounts(tokens=5, causal_pairs=9, head_rows=2)
    total = 4912.0
    # LoRA/QLoRA: a linear's backward is the input gradient only (1 x), attention's stays 2.5 x
    policy = total + (total - 432) + 2.5 * 432 + 160
    got = dpo_step_flops(shape=TOY, counts=counts, level="none", reference="precomputed", chunked_head=True,
                         lean_mlp=False, frozen_base=True)
    assert got == policy

