"""Model FLOPs and MFU for a DPO step. Pure functions, no torch.

Convention (matches Kaplan et al. 2020 and the PaLM MFU appendix, with the causal halving below):

* forward FLOPs per token = ``2 * N + 2 * n_layers * seq_len * hidden``.
  ``2 * N``: one multiply-add per weight per token. ``N`` is the non-embedding parameter count;
  it should include the output projection (``lm_head``), which is a real ``hidden x vocab`` matmul
  per token even when tied to the input embedding, and leave out only the input embedding,
  which is a lookup.
  Attention: ``QK^T`` and ``AV`` each cost ``2 * seq_len * hidden`` per token per layer without a
  mask, ``4 * seq_len * hidden`` together. **We halve it** for the causal mask, giving
  ``2 * n_layers * seq_len * hidden``: FlashAttention / SDPA with ``is_causal`` skip the masked
  half, and counting it would credit the GPU with work it never did. PaLM and Megatron count the
  full ``4 * seq_len * hidden``, so their MFU reads a little higher than ours at long sequence
  lengths (TinyLlama-1.1B at seq_len 1024: about 4 %). Pass the mean unpadded sequence length
  as ``seq_len`` where the loop knows it.
* training = forward + backward = 3 x forward (backward is two matmuls per forward matmul:
  gradients for the activations and for the weights).
"""

from __future__ import annotations

import math
import re

# Dense (no 2:4 sparsity) bf16 tensor-core peak, FLOP/s, per GPU. Patterns are matched against
# the upper-cased device name with '-'/'_' turned into spaces (torch.cuda.get_device_name gives
# e.g. "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA GeForce RTX 4090"). The more
# specific variant of a family comes first.
_PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    (r"\bGH200\b", 989e12),
    (r"\bH200\b.*\bNVL\b", 836e12),
    # H200 SXM: the datasheet says 989e12 (same compute as H100 SXM); we use the sustained bf16
    # matmul throughput of large square GEMMs on this workplace's H200s instead, so MFU is
    # relative to what the card reaches here (README, `mfu` under "Metrics and results").
    (r"\bH200\b", 790e12),
    (r"\bH100\b.*\bNVL\b", 835e12),
    (r"\bH100\b.*\bPCIE\b", 756e12),
    (r"\bH100\b", 989e12),  # SXM5 / "80GB HBM3"
    (r"\bH800\b", 989e12),
    (r"\bB200\b", 2250e12),
    (r"\bA100\b", 312e12),
    (r"\bA800\b", 312e12),
    (r"\bA10G\b", 70e12),  # AWS variant of the A10, lower clocks
    (r"\bA10\b", 125e12),
    (r"\bL40S\b", 362e12),
    (r"\bL40\b", 181e12),
    (r"\bL4\b", 121e12),
    (r"\bRTX A6000\b", 155e12),
    (r"\bRTX 4090\b", 165e12),  # fp32 accumulate (the rate torch's bf16 matmuls use)
    (r"\bRTX 3090\b", 71e12),
)


def model_flops_per_token(n_params_non_embedding: int, n_layers: int, hidden: int, seq_len: int) -> float:
    """Forward FLOPs per token of a causal decoder (see the module doc for the convention)."""
    for name, value in (("n_params_non_embedding", n_params_non_embedding), ("n_layers", n_layers),
                        ("hidden", hidden), ("seq_len", seq_len)):
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    return 2.0 * n_params_non_embedding + 2.0 * n_layers * seq_len * hidden


def dpo_step_flops(
    *,
    fwd_flops_per_token: float,
    policy_tokens: int,
    reference: str,
    recompute_fraction: float,
) -> float:
    """Model FLOPs of one DPO optimizer step.

    ``policy_tokens``: all non-padding tokens of the chosen and rejected sequences in the step
    (every micro-batch of the accumulation, every worker if MFU is over several GPUs).
    Policy forward + backward = 3 x forward; activation checkpointing re-runs
    ``recompute_fraction`` of the forward in the backward (0 for ``none``, about 1 for ``full``);
    the reference model costs one forward over the same tokens unless
    ``reference == "precomputed"`` (log-probs loaded from a cache).

    Recompute is counted, so this is "hardware FLOPs" for checkpointing: MFU in the strict PaLM
    sense would leave it out. We count it because the question the sweep answers is what each
    checkpoint level costs, and leaving it out would hide it.
    """
    if fwd_flops_per_token < 0:
        raise ValueError(f"fwd_flops_per_token must be >= 0, got {fwd_flops_per_token}")
    if policy_tokens < 0:
        raise ValueError(f"policy_tokens must be >= 0, got {policy_tokens}")
    if not 0.0 <= recompute_fraction <= 1.0:
        raise ValueError(f"recompute_fraction must be in [0, 1], got {recompute_fraction}")
    forward = fwd_flops_per_token * policy_tokens
    policy = 3.0 * forward + recompute_fraction * forward
    reference_forward = 0.0 if reference == "precomputed" else forward
    return policy + reference_forward


def _normalise_gpu_name(gpu_name: str) -> str:
    return " ".join(re.sub(r"[-_]", " ", gpu_name.upper()).split())


def peak_bf16_flops(gpu_name: str) -> float | None:
    """Dense bf16 peak FLOP/s of one GPU of this name; None when the GPU is not in the table."""
    name = _normalise_gpu_name(gpu_name)
    for pattern, flops in _PEAK_BF16_FLOPS:
        if re.search(pattern, name):
            return flops
    return None


def mfu(step_flops: float, step_time_s: float, gpu_name: str | None, n_gpus: int = 1) -> float:
    """Model FLOPs utilisation: ``step_flops / (step_time_s * peak * n_gpus)``.

    ``step_flops`` is the whole step's work over all ``n_gpus``. nan when the GPU is unknown (or
    None, i.e. CPU) or the time is not a positive number.
    """
    if n_gpus < 1:
        raise ValueError(f"n_gpus must be >= 1, got {n_gpus}")
    peak = peak_bf16_flops(gpu_name) if gpu_name else None
    if peak is None or not (step_time_s > 0 and math.isfinite(step_time_s)):
        return math.nan
    return step_flops / (step_time_s * peak * n_gpus)
