"""Per-step metric arithmetic: small pure functions the loop and the tests share."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, Sequence

import torch

#: Sums accumulated on the device over a step's micro-batches, in this order ...
DEVICE_SUMS = ("loss", "acc", "margin", "rew_c", "rew_r", "logp_c", "logp_r", "kl")
#: ... and sums the host knows without asking the device. Both are all-reduced over workers.
#: ``slots``: token positions computed, padding included; ``tokens`` stays last (the loop reads it).
HOST_SUMS = ("pairs", "seqs", "slots", "tokens")
STEP_SUMS = DEVICE_SUMS + HOST_SUMS


def detrended_std(values: Sequence[float]) -> float:
    """Spread of values around their least-squares line: sqrt(sum(residual^2) / (n - 2)).

    This is ``loss_std``: a loss that falls steadily has a std of 0, a loss that jumps around its
    trend does not. NaN with fewer than 3 values (a line through 2 points fits exactly).
    """
    n = len(values)
    if n < 3 or any(not math.isfinite(v) for v in values):
        return math.nan
    xs = range(n)
    mx, my = (n - 1) / 2, sum(values) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, values)) / sxx
    resid = [y - (my + slope * (x - mx)) for x, y in zip(xs, values)]
    return math.sqrt(sum(r * r for r in resid) / (n - 2))


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
    ]).double()


def step_means(sums: Sequence[float]) -> dict[str, float]:
    """TRL-named step metrics from the all-reduced sums."""
    s = dict(zip(STEP_SUMS, sums))
    pairs = s["pairs"]
    return {
        "loss": s["loss"] / pairs,
        "rewards/accuracies": s["acc"] / pairs,
        "rewards/margins": s["margin"] / pairs,
        "rewards/chosen": s["rew_c"] / pairs,
        "rewards/rejected": s["rew_r"] / pairs,
        "logps/chosen": s["logp_c"] / pairs,
        "logps/rejected": s["logp_r"] / pairs,
        "kl": s["kl"] / s["seqs"],
        "padding_frac": 1.0 - s["tokens"] / s["slots"],
    }


def median(values: Sequence[float]) -> float:
    v = sorted(x for x in values if math.isfinite(x))
    if not v:
        return math.nan
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2


def mean(values: Sequence[float]) -> float:
    v = [x for x in values if math.isfinite(x)]
    return sum(v) / len(v) if v else math.nan


class _StepPeak(Protocol):
    peak_mem_gb: float
    measured: bool
    worst_case: bool


@dataclass(frozen=True)
class MeasuredPeaks:
    """``worst_gb``: the highest peak of the measured steps, the worst-case step included (what
    ``peak_mem_gb`` reports); ``typical_gb``: the highest on the typical steps alone."""

    worst_gb: float
    typical_gb: float


def measured_peaks_gb(records: Sequence[_StepPeak]) -> MeasuredPeaks:
    """Peaks of a trial's steps; a trial that stopped in warm-up reports its last step's reading."""
    measured = [r for r in records if r.measured]
    if not measured:
        last = records[-1].peak_mem_gb if records else math.nan
        return MeasuredPeaks(last, last)
    typical = [r.peak_mem_gb for r in measured if not r.worst_case]
    return MeasuredPeaks(_max([r.peak_mem_gb for r in measured]), _max(typical))


def _max(values: Sequence[float]) -> float:
    v = [x for x in values if math.isfinite(x)]
    return max(v) if v else math.nan
