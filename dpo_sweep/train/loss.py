"""The DPO loss (contract API), as in the DPO paper, TRL and torchtune."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from dpo_sweep.config import LOSS_TYPES


def dpo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    beta: float,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-pair DPO losses and implicit rewards.

    All inputs are per-pair sequence log-probs (sums over response tokens), shape ``[B]``. With
    ``h = (pi_c - ref_c) - (pi_r - ref_r)``:

    * ``sigmoid``: ``-(1 - eps) log sigma(beta h) - eps log sigma(-beta h)`` (eps = label
      smoothing; the conservative DPO of Mitchell 2023);
    * ``ipo``: ``(h - 1 / (2 beta))^2`` (Azar et al. 2023, on summed log-probs as in TRL);
    * ``hinge``: ``relu(1 - beta h)`` (SLiC).

    Returns ``(losses, chosen_rewards, rejected_rewards)``; rewards are
    ``beta * (pi - ref)`` and carry no gradient.
    """
    logits = (policy_chosen_logps - ref_chosen_logps) - (policy_rejected_logps - ref_rejected_logps)
    if loss_type == "sigmoid":
        losses = (-F.logsigmoid(beta * logits) * (1 - label_smoothing)
                  - F.logsigmoid(-beta * logits) * label_smoothing)
    elif loss_type == "ipo":
        losses = (logits - 1 / (2 * beta)) ** 2
    elif loss_type == "hinge":
        losses = torch.relu(1 - beta * logits)
    else:
        raise ValueError(f"loss_type {loss_type!r} is not supported; allowed: {', '.join(LOSS_TYPES)}")
    chosen_rewards = beta * (policy_chosen_logps - ref_chosen_logps).detach()
    rejected_rewards = beta * (policy_rejected_logps - ref_rejected_logps).detach()
    return losses, chosen_rewards, rejected_rewards
