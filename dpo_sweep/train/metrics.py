"""Per-step metric arithmetic: small pure functions the loop and the tests share."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Sequence

import torch

from dpo_sweep.core.stability import detrended_std, median  # noqa: F401 - shared with the verdict

@dataclass(frozen=True)
class HostCounts:
    """What a step's micro-batches hold, known without asking the device: pairs, sequences (chosen
    and rejected), token slots computed (padding included) and real tokens."""

    pairs: int = 0
    sequences: int = 0
    slots: int = 0
    tokens: int = 0

    def plus(self, pairs: int, slots: int, tokens: int) -> HostCounts:
        """These counts with one more micro-batch's."""
        return HostCounts(self.pairs + pairs, self.sequences + 2 * pairs, self.slots + slots, self.tokens + tokens)

    def to_tensor(self, device: torch.device) -> torch.Tensor:
        return torch.tensor(dataclasses.astuple(self), dtype=torch.float64).to(device)


@dataclass(frozen=True)
class StepSums:
    """A step's metric sums over its micro-batches (and, all-reduced, over workers): first the sums
    made on the device (:data:`DEVICE_SUMS`, :func:`micro_step_sums`), then the
    :class:`HostCounts`. One tensor carries all of them (:meth:`to_tensor`), so the step needs one
    all-reduce, and one read (:meth:`from_tensor`) brings them to the host."""

    loss: float
    accuracies: float  # pairs whose chosen reward beats the rejected one
    margins: float
    rewards_chosen: float
    rewards_rejected: float
    logps_chosen: float
    logps_rejected: float
    #: Each sequence's policy/reference log-ratio per response token, summed; and its square (for
    #: the std). Its mean is steps.csv's ``kl`` and ``logratio_mean``.
    logratio: float
    logratio_sq: float
    pairs: float
    sequences: float
    slots: float
    tokens: float

    def to_tensor(self, device: torch.device | None = None) -> torch.Tensor:
        return torch.tensor(dataclasses.astuple(self), dtype=torch.float64, device=device)

    @staticmethod
    def from_tensor(sums: torch.Tensor, host: HostCounts | None = None) -> StepSums:
        """The sums from one tensor: :data:`DEVICE_SUMS` then the host counts, or only the device
        sums when ``host`` gives the counts (one process: nothing was reduced). A host sync."""
        values = sums.tolist()
        return StepSums(*values, *(dataclasses.astuple(host) if host is not None else ()))

    def means(self) -> StepMeans:
        pairs = self.pairs
        logratio_mean = self.logratio / self.sequences
        return StepMeans(
            loss=self.loss / pairs, reward_accuracy=self.accuracies / pairs, reward_margin=self.margins / pairs,
            rewards_chosen=self.rewards_chosen / pairs, rewards_rejected=self.rewards_rejected / pairs,
            logps_chosen=self.logps_chosen / pairs, logps_rejected=self.logps_rejected / pairs,
            logratio_mean=logratio_mean,
            # float64 sums: no cancellation at a step's sizes; max(0, .) absorbs last-bit rounding.
            logratio_std=math.sqrt(max(0.0, self.logratio_sq / self.sequences - logratio_mean ** 2)),
            padding_frac=1.0 - self.tokens / self.slots,
        )


#: The sums :func:`micro_step_sums` makes on the device: :class:`StepSums`' fields before the host counts.
DEVICE_SUMS = tuple(f.name for f in dataclasses.fields(StepSums))[:-len(dataclasses.fields(HostCounts))]


@dataclass(frozen=True)
class StepMeans:
    """A step's metrics (TRL's ``loss``, ``rewards/accuracies``, ``rewards/margins``,
    ``rewards/chosen``, ``rewards/rejected``, ``logps/chosen``, ``logps/rejected``), per pair.

    ``logratio_mean`` / ``logratio_std``: the seed article's log_ratio, log pi(y|x) - log ref(y|x)
    per response token, mean and population std over the step's sequences (chosen and rejected).
    The mean is also steps.csv's ``kl`` column: one value, computed once, written under both names."""

    loss: float
    reward_accuracy: float
    reward_margin: float
    rewards_chosen: float
    rewards_rejected: float
    logps_chosen: float
    logps_rejected: float
    logratio_mean: float
    logratio_std: float
    padding_frac: float


def micro_step_sums(losses: torch.Tensor, chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor,
                    policy_logps: torch.Tensor, ref_logps: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """One micro-batch's contribution to :data:`DEVICE_SUMS`, as one float64 tensor on the device.

    No host sync here (no ``.item()``, no tensor made from a Python number): the loop reads the
    step's sums once, after the optimizer step, so the GPU never waits for the host mid-step.
    """
    b = losses.shape[0]
    per_token_ratio = (policy_logps.detach() - ref_logps) / counts.clamp(min=1)
    sums = {
        "loss": losses.detach().sum(),
        "accuracies": (chosen_rewards > rejected_rewards).float().sum(),
        "margins": (chosen_rewards - rejected_rewards).sum(),
        "rewards_chosen": chosen_rewards.sum(),
        "rewards_rejected": rejected_rewards.sum(),
        "logps_chosen": policy_logps[:b].detach().sum(),
        "logps_rejected": policy_logps[b:].detach().sum(),
        "logratio": per_token_ratio.sum(),
        "logratio_sq": per_token_ratio.double().square().sum(),
    }
    return torch.stack([sums[name] for name in DEVICE_SUMS]).double()


def mean(values: Sequence[float]) -> float:
    v = [x for x in values if math.isfinite(x)]
    return sum(v) / len(v) if v else math.nan
