"""Per-step metric arithmetic: small pure functions the loop and the tests share."""
from __future__ import annotations

import math
from typing import Sequence

import torch

from dpo_sweep.stability import detrended_std, median  # noqa: F401 - shared with the verdict

#: Sums accumulated on the device over a step's micro-batches, in this order ...
#: ``kl`` sums each sequence's policy/reference log-ratio per response token; ``kl_sq`` its square
#: (for ``logratio_std``).
DEVICE_SUMS = ("loss", "acc", "margin", "rew_c", "rew_r", "logp_c", "logp_r", "kl", "kl_sq")
#: ... and sums the host knows without asking the device. Both are all-reduced over workers.
#: ``slots``: token positions computed, padding included; ``tokens`` stays last (the loop reads it).
HOST_SUMS = ("pairs", "seqs", "slots", "tokens")
STEP_SUMS = DEVICE_SUMS + HOST_SUMS


def micro_step_sums(losses: torch.Tensor, chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor,
                    policy_logps: torch.Tensor, ref_logps: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """One micro-batch's contribution to :data:`DEVICE_SUMS`, as one float64 tensor on the device.

    No host sync here (no ``.item()``, no tensor made from a Python number): the loop reads the
    step's sums once, after the optimizer step, so the GPU never waits for the host mid-step.
    """
    b = losses.shape[0]
    per_token_ratio = (policy_logps.detach() - ref_logps) / counts.clamp(min=1)
    return torch.stack([
        losses.detach().sum(),
        (chosen_rewards > rejected_rewards).float().sum(),
        (chosen_rewards - rejected_rewards).sum(),
        chosen_rewards.sum(),
        rejected_rewards.sum(),
        policy_logps[:b].detach().sum(),
        policy_logps[b:].detach().sum(),
        per_token_ratio.sum(),
        per_token_ratio.double().square().sum(),
    ]).double()


def step_means(sums: Sequence[float]) -> dict[str, float]:
    """TRL-named step metrics from the all-reduced sums."""
    s = dict(zip(STEP_SUMS, sums))
    pairs = s["pairs"]
    logratio_mean = s["kl"] / s["seqs"]
    return {
        "loss": s["loss"] / pairs,
        "rewards/accuracies": s["acc"] / pairs,
        "rewards/margins": s["margin"] / pairs,
        "rewards/chosen": s["rew_c"] / pairs,
        "rewards/rejected": s["rew_r"] / pairs,
        "logps/chosen": s["logp_c"] / pairs,
        "logps/rejected": s["logp_r"] / pairs,
        "kl": logratio_mean,
        # The seed article's log_ratio: log pi(y|x) - log ref(y|x) per response token, mean and
        # population std over the step's sequences (chosen and rejected). The mean is ``kl``.
        "logratio_mean": logratio_mean,
        # float64 sums: no cancellation at a step's sizes; max(0, .) absorbs last-bit rounding.
        "logratio_std": math.sqrt(max(0.0, s["kl_sq"] / s["seqs"] - logratio_mean ** 2)),
        "padding_frac": 1.0 - s["tokens"] / s["slots"],
    }


def mean(values: Sequence[float]) -> float:
    v = [x for x in values if math.isfinite(x)]
    return sum(v) / len(v) if v else math.nan
