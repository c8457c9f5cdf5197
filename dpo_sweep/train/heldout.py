"""The held-out split (``data.eval_pairs``): pairs taken out before training, which no trial trains
on, and how a learning trial scores its policy on them.

The split is a seeded draw (``data.eval_seed``) over the data's pairs, the same for every trial
of a sweep whatever its seed or configuration; the rest are the training pairs. At each eval
point (``train.eval_steps``) the policy's sequence log-probs of the held-out pairs, against the
reference's (computed once, before the first step), give what TRL's DPOTrainer logs on its eval
split: ``eval_rewards/accuracies`` (chosen reward strictly above rejected: 0 at the start, where
both are 0), ``eval_rewards/margins``, ``eval_rewards/chosen``, ``eval_logps/chosen`` and
``eval_loss``, and the drift of the chosen log-probs (policy minus reference, nats: a falling
chosen likelihood is the failure users watch for in TRL's logs).
"""
from __future__ import annotations

import dataclasses
import random

import torch

from dpo_sweep.config import DataSpec, TrainSpec
from dpo_sweep.errors import DataError
from dpo_sweep.train.data import PairDataset
from dpo_sweep.train.loss import dpo_loss


def held_out_count(spec: DataSpec, pairs: int) -> int:
    """How many of ``pairs`` the split takes (``data.eval_pairs``: a count, or a share below 1)."""
    share = spec.eval_pairs
    if share is None:
        return 0
    return int(share) if share >= 1 else max(1, round(share * pairs))


def split(ds: PairDataset, spec: DataSpec) -> tuple[PairDataset, PairDataset | None]:
    """``(training pairs, held-out pairs)``: the held-out ones drawn with ``data.eval_seed``, both
    in file order; ``None`` for the second without ``data.eval_pairs``."""
    count = held_out_count(spec, len(ds))
    if count == 0:
        return ds, None
    if count >= len(ds):
        raise DataError(f"data.eval_pairs: {spec.eval_pairs} takes {count} of the {len(ds)} pairs, leaving none "
                        "to train on; give fewer (a count below the pairs, or a share below 1)")
    held = set(random.Random(spec.eval_seed).sample(range(len(ds)), count))
    train = tuple(p for i, p in enumerate(ds.pairs) if i not in held)
    evaluated = tuple(p for i, p in enumerate(ds.pairs) if i in held)
    return (dataclasses.replace(ds, pairs=train),
            dataclasses.replace(ds, pairs=evaluated, source=f"{ds.source} (held out)"))


def is_eval_step(step: int, train: TrainSpec) -> bool:
    """Whether a trial of ``train.steps`` scores the held-out split after ``step``."""
    return step == train.steps or step % train.eval_every() == 0


def score(policy_logps: torch.Tensor, ref_logps: torch.Tensor, ds: PairDataset, beta: float,
          train: TrainSpec) -> dict[str, float]:
    """The held-out metrics (StepRecord's fields: core/held_out.py) from ``[N, 2]`` (chosen, rejected) log-prob tables of the policy and
    the reference over ``ds``'s pairs, by the DPO loss of the trial (its loss type, label smoothing
    and length handling) at ``beta``."""
    chosen_tokens = torch.tensor([len(p.chosen_ids) for p in ds.pairs])
    rejected_tokens = torch.tensor([len(p.rejected_ids) for p in ds.pairs])
    losses, chosen, rejected = dpo_loss(policy_logps[:, 0], policy_logps[:, 1], ref_logps[:, 0], ref_logps[:, 1],
                                        beta, train.loss, train.label_smoothing, chosen_tokens=chosen_tokens,
                                        rejected_tokens=rejected_tokens)
    return {
        "eval_reward_accuracy": float((chosen > rejected).float().mean()),
        "eval_reward_margin": float((chosen - rejected).mean()),
        "eval_rewards_chosen": float(chosen.mean()),
        "eval_logps_chosen": float(policy_logps[:, 0].mean()),
        "eval_chosen_drift": float((policy_logps[:, 0] - ref_logps[:, 0]).mean()),
        "eval_loss": float(losses.mean()),
    }
