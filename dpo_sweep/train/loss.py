"""The DPO loss (contract API), with TRL's DPOTrainer conventions (what users compare with)."""
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
    *,
    chosen_tokens: torch.Tensor | None = None,
    rejected_tokens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-pair DPO losses and implicit rewards.

    All log-prob inputs are per-pair sequence log-probs (sums over response tokens), shape
    ``[B]``; ``chosen_tokens`` / ``rejected_tokens`` are the response token counts of each
    sequence (``ipo`` needs them). With ``r_c = pi_c - ref_c``, ``r_r = pi_r - ref_r`` and
    ``h = r_c - r_r``:

    * ``sigmoid``: ``-(1 - eps) log sigma(beta h) - eps log sigma(-beta h)``, eps = label
      smoothing: conservative DPO (cDPO, Mitchell 2023, in the DPO paper's code). TRL's
      ``sigmoid`` ignores ``label_smoothing``; with eps = 0 the two are the same;
    * ``ipo``: ``(r_c / n_c - r_r / n_r - 1 / (2 beta))^2`` (Azar et al. 2023, Eq. 17), each
      log-ratio divided by its sequence's response tokens ``n`` (at least 1) as in TRL, whose code
      says the IPO authors confirmed this form: summed log-ratios would make the loss (and its
      gradient) grow with the response length;
    * ``hinge``: ``relu(1 - beta h)`` (SLiC).

    ``label_smoothing`` is only defined for ``sigmoid``: anything else refuses it rather than
    ignore it. Returns ``(losses, chosen_rewards, rejected_rewards)``; rewards are
    ``beta * (pi - ref)`` of the summed log-probs (as TRL logs them) and carry no gradient.
    """
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type {loss_type!r} is not supported; allowed: {', '.join(LOSS_TYPES)}")
    if label_smoothing and loss_type != "sigmoid":
        raise ValueError(f"label_smoothing={label_smoothing} is only used by the sigmoid loss (cDPO); "
                         f"loss_type {loss_type!r} takes label_smoothing=0")
    chosen_ratio = policy_chosen_logps - ref_chosen_logps
    rejected_ratio = policy_rejected_logps - ref_rejected_logps
    logits = chosen_ratio - rejected_ratio
    if loss_type == "sigmoid":
        losses = (-F.logsigmoid(beta * logits) * (1 - label_smoothing)
                  - F.logsigmoid(-beta * logits) * label_smoothing)
    elif loss_type == "ipo":
        if chosen_tokens is None or rejected_tokens is None:
            raise ValueError("loss_type 'ipo' divides each log-ratio by its response length: pass "
                             "chosen_tokens and rejected_tokens (response tokens per sequence)")
        per_token = (chosen_ratio / chosen_tokens.to(logits.dtype).clamp(min=1)
                     - rejected_ratio / rejected_tokens.to(logits.dtype).clamp(min=1))
        losses = (per_token - 1 / (2 * beta)) ** 2
    else:
        losses = torch.relu(1 - beta * logits)
    chosen_rewards = beta * chosen_ratio.detach()
    rejected_rewards = beta * rejected_ratio.detach()
    return losses, chosen_rewards, rejected_rewards
