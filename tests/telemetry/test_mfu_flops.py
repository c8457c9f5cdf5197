"""FLOPs, peak table and MFU against hand-worked numbers."""

from __future__ import annotations

import math

import pytest

from dpo_sweep.telemetry import dpo_step_flops, mfu, model_flops_per_token, peak_bf16_flops


def test_model_flops_per_token_hand_worked():
    # 2 * 1e9 + 2 * 16 layers * 1024 tokens * 2048 hidden = 2e9 + 67_108_864
    assert model_flops_per_token(1_000_000_000, 16, 2048, 1024) == 2_067_108_864.0
    # attention term alone: causal-halved QK^T + AV
    assert model_flops_per_token(0, 1, 4, 8) == 2 * 1 * 8 * 4
    with pytest.raises(ValueError, match="seq_len"):
        model_flops_per_token(10, 1, 4, -1)


@pytest.mark.parametrize(
    ("reference", "recompute_fraction", "expected"),
    [
        ("model", 0.0, 4.0e12),        # 3 x fwd policy + 1 x fwd reference
        ("model", 1.0, 5.0e12),        # full checkpointing re-runs the whole forward
        ("model", 0.25, 4.25e12),
        ("precomputed", 0.0, 3.0e12),  # reference log-probs from a cache
        ("precomputed", 0.5, 3.5e12),
    ],
)
def test_dpo_step_flops_hand_worked(reference, recompute_fraction, expected):
    # forward = 1e9 FLOPs/token * 1000 tokens = 1e12
    got = dpo_step_flops(fwd_flops_per_token=1e9, policy_tokens=1000, reference=reference,
                         recompute_fraction=recompute_fraction)
    assert got == pytest.approx(expected, rel=1e-12)


def test_dpo_step_flops_refuses_bad_inputs():
    with pytest.raises(ValueError, match="recompute_fraction"):
        dpo_step_flops(fwd_flops_per_token=1.0, policy_tokens=1, reference="model", recompute_fraction=1.5)
    with pytest.raises(ValueError, match="policy_tokens"):
        dpo_step_flops(fwd_flops_per_token=1.0, policy_tokens=-1, reference="model", recompute_fraction=0)


@pytest.mark.parametrize(
    ("gpu_name", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H100 NVL", 835e12),
        ("NVIDIA H200", 790e12),            # measured on this workplace's H200, not the datasheet
        ("NVIDIA GH200 480GB", 989e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA A100 80GB PCIe", 312e12),
        ("NVIDIA A10G", 70e12),
        ("NVIDIA A10", 125e12),
        ("NVIDIA L4", 121e12),
        ("NVIDIA L40S", 362e12),
        ("NVIDIA GeForce RTX 4090", 165e12),
        ("Tesla V100-SXM2-16GB", None),     # no bf16 tensor cores
        ("Tesla T4", None),
        ("cpu", None),
        ("", None),
    ],
)
def test_peak_bf16_flops_table(gpu_name, expected):
    assert peak_bf16_flops(gpu_name) == expected


def test_mfu_hand_worked():
    # 4e14 FLOPs in 1 s on one H100 SXM: 400 / 989 = 0.4044489...
    assert mfu(4e14, 1.0, "NVIDIA H100 80GB HBM3") == pytest.approx(0.404448938, rel=1e-8)
    # 4e14 in 0.5 s on two H200s: 4e14 / (0.5 * 790e12 * 2)
    assert mfu(4e14, 0.5, "NVIDIA H200", n_gpus=2) == pytest.approx(0.506329114, rel=1e-8)


@pytest.mark.parametrize(("gpu_name", "step_time_s"),
                         [(None, 1.0), ("cpu", 1.0), ("Tesla T4", 1.0), ("NVIDIA H200", 0.0),
                          ("NVIDIA H200", math.nan), ("NVIDIA H200", math.inf)])
def test_mfu_is_nan_when_unknowable(gpu_name, step_time_s):
    assert math.isnan(mfu(1e12, step_time_s, gpu_name))


def test_mfu_refuses_zero_gpus():
    with pytest.raises(ValueError, match="n_gpus"):
        mfu(1e12, 1.0, "NVIDIA H200", n_gpus=0)
